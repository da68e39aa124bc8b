"""MLPerf's global batch size on packed data: packs x the packing rate (as NVIDIA logs its packed runs), the rate
from ``--average-packing-rate``, else what the data records (Habana's ``<train>_metadata.json``, pack-nvidia's
manifest), else 2.0. Real files from the packers (pack-habana, pack-nvidia on golden rows); the 2-rank packed run's
MLPerf log is checked in tests/pretrain/test_packing_train.py (slow)."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import pytest

from pretrain.packing import (
    DEFAULT_PACKING_RATE,
    mlperf_global_batch,
    packing_rate,
    recorded_packing_rate,
)
from pretrain.schedule import mlperf_eval_interval_samples


@pytest.fixture(scope="module")
def packed_sets(golden: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """pack-habana's and pack-nvidia's stage folders, made by the packers from the golden rows of length <= 128
    (narrowed to 128 columns: the recipe's NNLS stays small)."""
    import h5py
    import numpy as np

    from preprocessing.habana.pack import HabanaPackConfig, run_pack_habana
    from preprocessing.nvidia.pack import PackNvidiaConfig, run_pack_nvidia

    d = tmp_path_factory.mktemp("packed_rate")
    src = d / "in" / "part_training_0.hdf5"
    src.parent.mkdir()
    with h5py.File(golden / "sample.hdf5", "r") as f:
        keep = np.flatnonzero(f["input_mask"][:].sum(axis=1) <= 128)
        with h5py.File(src, "w") as out:
            for name in ("input_ids", "input_mask", "segment_ids"):
                out.create_dataset(name, data=f[name][:][keep, :128])
            for name in ("masked_lm_positions", "masked_lm_ids", "next_sentence_labels"):
                out.create_dataset(name, data=f[name][:][keep])
    run_pack_habana([src], d / "habana", HabanaPackConfig(max_sequence_length=128, max_predictions_per_sequence=76),
                    data_dir="packed")
    run_pack_nvidia([src], d / "nvidia", PackNvidiaConfig(max_seq_length=128, shards_num=2))
    return {"habana": d / "habana" / "packed", "nvidia": d / "nvidia"}


def test_the_data_records_its_rate(packed_sets: dict[str, Path]) -> None:
    from pretrain.packing import mean_sequences_per_pack

    for layout, train in packed_sets.items():
        found = recorded_packing_rate(train)
        assert found is not None, layout
        rate, source = found
        assert rate == pytest.approx(mean_sequences_per_pack(train), rel=1e-5), layout  # counted pack by pack
        assert 1.0 < rate <= 3.0
        assert source.endswith("avg_seq_per_sample" if layout == "habana" else "counters.sequences_per_pack")
        assert packing_rate(0.0, train) == found
        assert packing_rate(1.75, train) == (1.75, "--average-packing-rate")  # the flag wins


def test_without_a_record_the_rate_is_two_and_says_so(tmp_path: Path) -> None:
    rate, source = packing_rate(0.0, tmp_path)
    assert rate == DEFAULT_PACKING_RATE == 2.0 and "--average-packing-rate sets it" in source


@pytest.mark.parametrize("text", ["{", "[]", '{"avg_seq_per_sample": "many"}', '{"avg_seq_per_sample": 0}',
                                  '{"avg_seq_per_sample": 1e9}', '{"other": 1.5}', '{"avg_seq_per_sample": null}'])
def test_an_unusable_record_is_skipped_with_a_warning(text: str, tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    train = tmp_path / "packed"
    train.mkdir()
    meta = tmp_path / "packed_metadata.json"
    meta.write_text(text, encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="pretrain.packing"):
        assert recorded_packing_rate(train) is None
        assert packing_rate(0.0, train)[0] == DEFAULT_PACKING_RATE
    assert any(str(meta) in r.getMessage() and "ignored" in r.getMessage() for r in caplog.records)
    (train / "_manifest.json").write_text(json.dumps({"counters": {"sequences_per_pack": 1.5}}))
    assert recorded_packing_rate(train) == (1.5, f"{train / '_manifest.json'} counters.sequences_per_pack")


def test_the_global_batch_and_the_interval_in_sequences() -> None:
    assert mlperf_global_batch(8, 2.0) == 16
    assert mlperf_global_batch(4096, 1.999) == 8188  # NVIDIA's real set, packs x rate
    assert mlperf_global_batch(1, 0.2) == 1
    # the MLPerf interval follows the batch in sequences, not in packs
    assert mlperf_eval_interval_samples(mlperf_global_batch(4096, 2.0)) == mlperf_eval_interval_samples(8192)


def test_the_flag() -> None:
    from pretrain.train_config import add_train_arguments, from_args, to_argv

    p = argparse.ArgumentParser()
    add_train_arguments(p)
    for spelling in ("--average-packing-rate", "--average_packing_rate"):
        cfg = from_args(p.parse_args(["--train-dir", "t", "--output-dir", "o", spelling, "1.9"]))
        assert cfg.average_packing_rate == 1.9
        assert "1.9" in to_argv(cfg)
    assert from_args(p.parse_args(["--train-dir", "t", "--output-dir", "o"])).average_packing_rate == 0.0
    with pytest.raises(SystemExit):
        p.parse_args(["--average-packing-rate", "-1"])
