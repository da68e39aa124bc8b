"""MLPerf samples on packed data are sequences: the pieces the trainer counts them with (fast; the real 2-rank
packed run's MLPerf log, eval steps and resume are in tests/pretrain/test_packing_train.py, slow).

* the eval rule in samples (:func:`pretrain.schedule.crosses_multiple`) for steps of varying sizes, equal to
  :func:`is_eval_step` when every step holds the global batch;
* :func:`pretrain.packing.mean_sequences_per_pack` (the estimate for a checkpoint without the count) against the
  number of golden rows packed, in both layouts;
* the count in the per-rank checkpoint state, and a state without it;
* ``--eval-interval-samples``: parsed, bounded, passed to the ranks.
"""

from __future__ import annotations

import argparse

import h5py
import numpy as np
import pytest

from core.errors import InputError
from pretrain import checkpoint as ckpt
from pretrain.packing import (
    best_fit_packs,
    mean_sequences_per_pack,
    pack_rows,
    sequence_lengths,
    write_habana,
    write_nvidia,
)
from pretrain.schedule import crosses_multiple, is_eval_step
from pretrain.train_config import TrainConfig, add_train_arguments, from_args, to_argv


def test_crosses_multiple_is_the_step_rule_for_full_steps() -> None:
    for batch, interval in ((8, 20), (7, 7), (3, 150_000), (4096, 175_000)):
        for step in range(1, 200):
            assert crosses_multiple((step - 1) * batch, step * batch, interval) == \
                is_eval_step(step, batch, interval), (batch, interval, step)


def test_crosses_multiple_with_steps_of_varying_sequences() -> None:
    per_step = [17, 21, 9, 24, 24, 8, 30]  # a packed run's sequences per step
    counts = np.cumsum([0, *per_step])
    due = [s for s in range(1, len(counts)) if crosses_multiple(int(counts[s - 1]), int(counts[s]), 40)]
    assert counts.tolist() == [0, 17, 38, 47, 71, 95, 103, 133]
    assert due == [3, 5, 7]  # 47 >= 40, 95 >= 80, 133 >= 120; with 8 rows a step 40 rows are step 5, 80 step 10
    assert not crosses_multiple(40, 79, 40) and crosses_multiple(79, 80, 40) and crosses_multiple(0, 200, 40)


@pytest.fixture(scope="module")
def golden_packs(golden):
    with h5py.File(golden / "sample.hdf5") as f:
        rows = {k: f[k][:300] for k in f}
    packs = best_fit_packs(sequence_lengths(rows), 512, 3)
    assert sorted(i for p in packs for i in p) == list(range(300))  # every row in exactly one pack
    return pack_rows(rows, packs, 512), 300 / len(packs)


@pytest.mark.parametrize("layout", ["habana", "nvidia"])
def test_mean_sequences_per_pack_counts_every_pack(golden_packs, tmp_path, layout) -> None:
    packed, expected = golden_packs
    write = write_habana if layout == "habana" else write_nvidia
    cut = 37
    write(tmp_path / "part_0", {k: v[:cut] for k, v in packed.items()})  # two files, uneven
    write(tmp_path / "part_1", {k: v[cut:] for k, v in packed.items()})
    assert 1.1 < expected < 3  # (golden rows are mostly long: 1.22 sequences a pack)
    assert mean_sequences_per_pack(tmp_path) == pytest.approx(expected, rel=1e-12)
    assert mean_sequences_per_pack(tmp_path, chunk=5) == pytest.approx(expected, rel=1e-12)  # chunked reads


def test_mean_sequences_per_pack_refuses_padded_rows(golden) -> None:
    with pytest.raises(InputError, match="holds no packed rows"):
        mean_sequences_per_pack(golden / "4bins" / "128")


def test_rank_state_keeps_the_samples(tmp_path) -> None:
    import torch

    ckpt.save_rank_state(tmp_path, "3", 0, 3, {"torch": torch.get_rng_state()}, {"epoch": 0, "index": 3},
                         samples=51)
    assert ckpt.load_rank_state(tmp_path, "3", 0)["samples"] == 51
    ckpt.save_rank_state(tmp_path, "4", 0, 4, {"torch": torch.get_rng_state()}, {"epoch": 0, "index": 4})
    assert "samples" not in ckpt.load_rank_state(tmp_path, "4", 0)  # (as a checkpoint written before the count)


def test_eval_interval_samples_flag() -> None:
    p = argparse.ArgumentParser()
    add_train_arguments(p)
    cfg = from_args(p.parse_args(["--eval-interval-samples", "150000"]))
    assert cfg.eval_interval_samples == 150_000 and "--eval-interval-samples" in to_argv(cfg)
    assert "--eval-interval-samples" not in to_argv(TrainConfig())  # default 0: MLPerf's interval
    with pytest.raises(SystemExit):
        p.parse_args(["--eval-interval-samples", "-1"])
