"""The data DAG's train_dir is what the reference trainers read (tests/loader_rules.py re-enacts their discovery
and reading): only the int-named bin folders, every shard with the six datasets (zero-length when empty); the
manifest beside it still verifies (status, verify); export-dataset lays it out for NVIDIA's and Habana's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from flowhelpers import FAST, last_run, run_cli

from bertpipe.cli import main
from core.manifest import verify_manifest
from tests.loader_rules import flat_training_files, mlperf_eval_files, rows_of, samsung_bins


@pytest.fixture(scope="module")
def dag_work(prefect_harness, three_part_text: Path, shared_data: Path, tmp_path_factory) -> Path:
    """The three-part text through the DAG with 128 shards per bin: bin 384 (86 rows) has empty shards."""
    w = tmp_path_factory.mktemp("layouts") / "w"
    assert run_cli("--text-dir", three_part_text, "--vocab", shared_data / "vocab.txt", "--work-dir", w, *FAST,
                   "--n-output-shards", "128") == 0
    return w


def test_train_dir_holds_only_bins_that_every_trainer_reads(dag_work: Path, capsys) -> None:
    from flows.pretrain_flow import resolve_dataset
    from pretrain.data import discover_shards

    out = last_run(dag_work)["outputs"]
    train = Path(out["train_dir"])
    assert sorted(os.listdir(train)) == ["128", "256", "384", "512"]
    m = verify_manifest(train.parent)  # the manifest (and .verified.json) sit beside data/, not in it
    assert {f.name.split("/")[0] for f in m.files} == {"data"} and len(m.files) == 4 * 128
    bins = samsung_bins(train)  # Samsung: sorted by int(name); a stray file would be a ValueError
    assert [b for b, _ in bins] == [128, 256, 384, 512] and all(len(files) == 128 for _, files in bins)
    rows = [rows_of(f) for _, files in bins for f in files]  # NVIDIA/Habana reading: six datasets by name
    assert sum(rows) == m.counters["rows"] and rows.count(0) == m.counters["empty_shards"] > 0
    ours = discover_shards(train)
    assert sum(s.rows for ss in ours.values() for s in ss) == m.counters["rows"]
    assert discover_shards(train.parent) == ours  # the stage dir is followed to data/
    assert resolve_dataset(str(dag_work), "", None)[0] == str(train)  # the training deployment's datasets/latest

    capsys.readouterr()
    assert main(["status", "--work-dir", str(dag_work)]) == 0
    assert main(["verify", "--work-dir", str(dag_work)]) == 0
    assert "ok   bins/" in capsys.readouterr().out


@pytest.mark.parametrize("layout", ["samsung", "nvidia-dle"])
def test_export_dataset_from_the_dag(layout: str, dag_work: Path, tmp_path: Path) -> None:
    out = tmp_path / "ds"
    assert main(["export-dataset", "--layout", layout, "--work-dir", str(dag_work), str(out), "-q"]) == 0
    total = verify_manifest(Path(last_run(dag_work)["outputs"]["train_dir"]).parent).counters["rows"]
    if layout == "samsung":
        files = [f for _, fs in samsung_bins(out / "train") for f in fs]
        assert len(files) == 4 * 128
    else:
        files = flat_training_files(out / "train")
        assert len(files) == len(os.listdir(out / "train")) and all(rows_of(f) > 0 for f in files)
    assert sum(rows_of(f) for f in files) == total
    evals = mlperf_eval_files(out / "eval")
    assert len(evals) == 1 and rows_of(evals[0]) == 50  # FAST picks 50 eval examples


def test_the_nvidia_layout_of_a_run_without_its_target_is_refused(dag_work: Path, tmp_path: Path, capsys) -> None:
    """NVIDIA's MLPerf trainer reads variable-length rows: padded rows are never exported for it (issue 20)."""
    out = tmp_path / "ds"
    assert main(["export-dataset", "--layout", "nvidia", "--work-dir", str(dag_work), str(out), "-q"]) == 2
    err = capsys.readouterr().err
    assert "--layout nvidia needs the folder of --target nvidia-4320 or nvidia-varlength" in err, err
    assert f"run `bertpipe run --work-dir {dag_work} --target nvidia-varlength`" in err, err
    assert not out.exists()
