"""Mixed-bin batches (pretrain/batch_mix.py): Samsung's split counts and rows of any length, on the golden 4 bins.

A mixed micro-batch runs as one forward per bin; its loss must be the loss of the same rows in one batch padded
to 512, and its gradients those of that batch.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from core.errors import InputError
from pretrain.batch_mix import check_bins, combined_losses, split_counts
from pretrain.data import BinnedSampler, discover_shards
from pretrain.train_config import TrainConfig, add_train_arguments, from_args, load_ds_config, to_argv

ROOT = Path(__file__).resolve().parents[2]


def _parse(argv: list[str]) -> TrainConfig:
    p = argparse.ArgumentParser()
    add_train_arguments(p)
    return from_args(p.parse_args(argv))


@pytest.fixture(scope="module")
def bins(golden):
    return discover_shards(golden / "4bins")


def samsung_split_random_sampler(num_samples: list[int], batch_ratio: list[int], generator) -> list[int]:
    """Samsung's SplitRandomSampler.__iter__ (training_results_v1.1 Samsung/.../pytorch/utils.py), written out:
    per bin a random permutation cut to whole groups of its count, the first max_len groups of every bin side by
    side, flattened (the DataLoader then takes sum(batch_ratio) indices per batch)."""
    max_len = min(n // c for n, c in zip(num_samples, batch_ratio, strict=True))
    groups = [(torch.randperm(n, generator=generator)[:n // c * c]).view(-1, c)[:max_len, :] + sum(num_samples[:i])
              for i, (n, c) in enumerate(zip(num_samples, batch_ratio, strict=True))]
    return torch.flatten(torch.cat(groups, dim=-1)).tolist()


def _lengths(arrays) -> np.ndarray:
    return arrays["input_mask"].sum(axis=1)


def test_split_batches_hold_the_counts_of_every_bin_like_samsungs_sampler(bins):
    counts = (6, 3, 2, 5)
    s = BinnedSampler(bins, 16, rank=0, world=1, seed=3, mix="split", counts=counts)
    sizes = [sum(x.rows for x in bins[b]) for b in (128, 256, 384, 512)]
    ref = samsung_split_random_sampler(sizes, list(counts), torch.Generator().manual_seed(0))
    assert s.steps_per_epoch == len(ref) // 16 == min(n // c for n, c in zip(sizes, counts, strict=True)) == 255  # 1535 // 6
    ref_bins = np.searchsorted(np.cumsum(sizes), ref, side="right").reshape(-1, 16)  # 0..3 per index
    assert (ref_bins == np.repeat(np.arange(4), counts)).all()  # Samsung's: 6, 3, 2, 5 rows of the bins, in order
    seen: dict[int, set] = {b: set() for b in (128, 256, 384, 512)}
    for _ in range(s.steps_per_epoch):
        batch = s.next_batch()
        assert [(b, len(a["input_ids"])) for b, a in batch.pieces] == list(zip((128, 256, 384, 512), counts,
                                                                                   strict=True))
        for b, a in batch.pieces:
            assert a["input_ids"].shape[1] == b and (_lengths(a) <= b).all() and (_lengths(a) > b - 128).all()
            seen[b].update(map(bytes, a["input_ids"].astype(np.int32)))
    assert {b: len(v) for b, v in seen.items()} == {b: c * 255 for b, c in zip((128, 256, 384, 512), counts,
                                                                               strict=True)}  # no row twice
    assert s.next_batch().epoch == 1


def test_random_batches_draw_rows_of_any_length_once_an_epoch(bins):
    s = BinnedSampler(bins, 8, rank=1, world=2, seed=5, mix="random")
    per_rank = {b: sum(x.rows for x in ss) // 2 for b, ss in bins.items()}
    assert s.steps_per_epoch == sum(per_rank.values()) // 8
    rows, compositions = {b: 0 for b in bins}, set()
    for _ in range(s.steps_per_epoch):
        batch = s.next_batch()
        assert sum(len(a["input_ids"]) for _, a in batch.pieces) == 8
        compositions.add(tuple(len(a["input_ids"]) for _, a in batch.pieces))
        for b, a in batch.pieces:
            rows[b] += len(a["input_ids"])
            assert a["input_ids"].shape[1] == b
    assert len(compositions) > 10  # the mix varies from step to step
    total = sum(per_rank.values())
    for b in bins:  # an epoch reads the bins in the data's proportions (all but < 8 rows of the rank's pool)
        assert abs(rows[b] - per_rank[b]) <= 8, (b, rows[b], per_rank[b], total)
    assert s.next_batch().epoch == 1


@pytest.mark.parametrize(("mix", "counts"), [("split", (2, 1, 1, 2)), ("random", None)])
def test_mixed_batch_has_the_loss_and_gradients_of_the_padded_batch(bins, mix, counts):
    from pretrain.config import model_config
    from pretrain.model import BertForPreTraining

    torch.manual_seed(0)
    model = BertForPreTraining(model_config("tiny")).eval()  # no dropout: the two runs see the same function
    batch = BinnedSampler(bins, 6, seed=11, mix=mix, counts=counts).next_batch()
    while len(batch.pieces) < 2:  # (random: a batch of two bins at least)
        batch = BinnedSampler(bins, 6, seed=batch.index + 12, mix=mix, counts=counts).next_batch()
    parts = batch.parts()

    def tensors(a):
        return {k: torch.from_numpy(v) for k, v in a.items()}

    outs = [model(**tensors(a)) for a in parts]
    loss, mlm, nsp = combined_losses(outs, [len(a["input_ids"]) for a in parts])
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    padded = {k: np.concatenate([np.pad(a[k], ((0, 0), (0, 512 - a[k].shape[1]))) if a[k].ndim == 2 and k in (
        "input_ids", "input_mask", "segment_ids") else a[k] for a in parts]) for k in parts[0]}
    ref = model(**tensors(padded))
    ref.loss.backward()
    assert loss.item() == pytest.approx(ref.loss.item(), rel=1e-5)
    assert (mlm.item(), nsp.item()) == pytest.approx((ref.mlm_loss.item(), ref.nsp_loss.item()), rel=1e-5)
    for n, p in model.named_parameters():
        assert torch.allclose(grads[n], p.grad, rtol=1e-4, atol=1e-6), n
    naive = sum(o.loss for o in outs) / len(outs)  # the pieces' plain mean is another loss: the test can fail
    assert abs(naive.item() - ref.loss.item()) > 1e-4


@pytest.mark.parametrize(("mix", "counts"), [("split", (6, 3, 2, 5)), ("random", None)])
def test_mixed_order_resumes_exactly_and_has_its_own_digest(bins, mix, counts):
    a = BinnedSampler(bins, 16, rank=0, world=2, seed=9, mix=mix, counts=counts)
    for _ in range(7):
        a.next_batch()
    state = a.state_dict()
    expected = [[x["input_ids"] for x in a.next_batch().parts()] for _ in range(3)]
    b = BinnedSampler(bins, 16, rank=0, world=2, seed=9, mix=mix, counts=counts)
    b.load_state_dict(state)
    got = [[x["input_ids"] for x in b.next_batch().parts()] for _ in range(3)]
    assert all(np.array_equal(x, y) for e, g in zip(expected, got, strict=True) for x, y in zip(e, g, strict=True))
    one_bin = BinnedSampler(bins, 16, rank=0, world=2, seed=9)
    assert one_bin.digest() != a.digest()
    with pytest.raises(InputError, match="cannot be resumed"):
        one_bin.load_state_dict(state)


def test_split_flags_and_refusals(bins, tmp_path):
    cfg = _parse(["--split-batch-cnt", "6", "3", "2", "5"])
    assert (cfg.batch_mix, cfg.split_batch_cnt, split_counts(cfg)) == ("split", "6 3 2 5", (6, 3, 2, 5))
    assert _parse(to_argv(cfg)) == cfg and "--split-batch-cnt" in to_argv(cfg)
    assert load_ds_config(cfg, 2)["train_micro_batch_size_per_gpu"] == 16  # the counts' sum
    assert load_ds_config(_parse(["--split-batch-cnt", "6", "3", "2", "5", "--global-batch", "64"]), 2)[
        "gradient_accumulation_steps"] == 2
    assert (TrainConfig().batch_mix, TrainConfig(model="large").batch_mix) == ("one-bin", "random")
    for argv, match in ((["--split-batch-cnt", "6", "3", "2", "5", "--micro-batch", "8"], "not the sum"),
                        (["--batch-mix", "split"], "needs --split-batch-cnt"),
                        (["--batch-mix", "random", "--split-batch-cnt", "1", "1", "1", "1"], "goes with --batch-mix split"),
                        (["--split-batch-cnt", "0", "0", "0", "0"], "not all 0")):
        with pytest.raises(InputError, match=match):
            split_counts(_parse(argv))
    with pytest.raises(SystemExit):
        _parse(["--split-batch-cnt", "6", "3", "2"])  # four counts
    only_two = {b: bins[b] for b in (128, 512)}
    with pytest.raises(InputError, match="draws from the bins 128, 256, 384, 512"):
        check_bins(cfg, only_two)
    check_bins(_parse(["--split-batch-cnt", "4", "0", "0", "4"]), only_two)  # 0: that bin is not read
    with pytest.raises(InputError, match="draws from the bins"):
        BinnedSampler(only_two, 16, mix="split", counts=(6, 3, 2, 5))
    from pretrain.recipe import recipe_line

    with pytest.raises(InputError, match="packed rows"):
        recipe_line(cfg, packed=True)
    assert "batches: packed rows" in recipe_line(TrainConfig(model="large"), packed=True)


@pytest.mark.slow
def test_bertpipe_train_with_samsungs_split_counts(golden, tmp_path):
    """2 CPU ranks, 3 steps of micro-batches of 2/1/1/2 rows of the four bins, through `bertpipe train`."""
    pytest.importorskip("deepspeed")
    out = tmp_path / "run"
    env = {**os.environ, "DS_ACCELERATOR": "cpu", "OMP_NUM_THREADS": "1"}
    r = subprocess.run([sys.executable, "-m", "bertpipe", "train", "--train-dir", str(golden / "4bins"),
                        "--output-dir", str(out), "--nproc", "2", "--device", "cpu", "--max-steps", "3",
                        "--split-batch-cnt", "2", "1", "1", "2", "--checkpoint-interval", "0", "--no-tensorboard"],
                       capture_output=True, text=True, timeout=900, cwd=ROOT, env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "batches: 2/1/1/2 rows of bins 128/256/384/512" in r.stdout.splitlines()[0]
    config = json.loads((out / "config.json").read_text())
    assert config["train"]["batch_mix"] == "split" and config["deepspeed"]["train_micro_batch_size_per_gpu"] == 6
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["final_loss"] > 0 and summary["global_batch"] == 12
