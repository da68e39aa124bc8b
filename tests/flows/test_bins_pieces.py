"""The data DAG's bins stage as pieces: counts per part, then shard groups, then one manifest. Whatever the number
of workers (and so the cut into groups), the bins are those of one split-4bins call over the same HDF5 files;
every shard has the six datasets; a bins stage found done costs no task run; a killed group leaves no manifest,
and the re-run redoes the stage with the same bytes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import h5py
import pytest
from flowhelpers import FAST, last_run, output_md5s, run_cli

from core.manifest import MANIFEST_NAME, load_manifest, md5_file
from core.schema import HDF5_FIELDS
from preprocessing.mlperf.split_4bins import Split4BinsConfig, group_count, run_split_4bins

ROOT = Path(__file__).resolve().parents[2]
SHARDS = 8  # 4 groups with 1 worker, 8 with 2: two different cuts of the same 4 x 8 files
ARGS = list(FAST[:-2])  # FAST without its "--workers 1"
assert FAST[-2:] == ["--workers", "1"]
ARGS[ARGS.index("--n-output-shards") + 1] = str(SHARDS)


def _bins(work: Path) -> dict[str, str]:
    train = Path(last_run(work)["outputs"]["train_dir"])
    return {p.relative_to(train).as_posix(): md5_file(p) for p in sorted(train.rglob("*.hdf5"))}


def test_bins_pieces_equal_one_split_call_for_any_worker_count(prefect_harness, three_part_text: Path,
                                                               shared_data: Path, tmp_path: Path) -> None:
    base = ["--text-dir", three_part_text, "--vocab", shared_data / "vocab.txt", *ARGS]
    runs = {}
    for workers in (1, 2):
        w = tmp_path / f"w{workers}"
        assert run_cli(*base, "--work-dir", w, "--workers", str(workers)) == 0
        runs[workers] = w
    assert group_count(10, SHARDS, 1) != group_count(10, SHARDS, 2)  # the runs cut the shards differently
    one, two = _bins(runs[1]), _bins(runs[2])
    assert one == two and len(one) == 4 * SHARDS

    s = last_run(runs[2])["stages"]
    h5 = Path(s["hdf5"]["dir"])
    parts = sorted(h5.glob("part-*/part-*.hdf5"))
    ref = run_split_4bins(parts, tmp_path / "ref", Split4BinsConfig(n_output_shards=SHARDS))
    assert {f.name: f.md5 for f in ref.files} == two  # the DAG's pieces = one call over the same inputs
    m = load_manifest(Path(s["bins"]["dir"]))
    assert m is not None and m.counters == ref.counters and s["bins"]["calls"] == 1
    assert 0 < s["bins"]["cpu_seconds"] and 0 <= s["bins"]["run_wait_seconds"] <= s["bins"]["seconds"]  # the pieces'
    assert last_run(runs[2])["task_runs"]["bins"] >= 2  # a count phase and a write phase
    train = Path(last_run(runs[2])["outputs"]["train_dir"])
    for p in train.rglob("*.hdf5"):
        with h5py.File(p, "r") as f:
            assert set(f) == set(HDF5_FIELDS), p

    before = output_md5s(runs[2])
    assert run_cli(*base, "--work-dir", runs[2], "--workers", "2") == 0  # all done: no bins task at all
    assert "bins" not in last_run(runs[2])["task_runs"] and output_md5s(runs[2]) == before


@pytest.mark.slow
def test_a_group_killed_mid_write_leaves_no_manifest_and_the_rerun_gives_the_same_bins(
        prefect_harness, three_part_text: Path, shared_data: Path, tmp_path: Path) -> None:
    w = tmp_path / "w"
    cmd = [str(Path(sys.executable).parent / "bertpipe"), "run", "--text-dir", str(three_part_text), "--vocab",
           str(shared_data / "vocab.txt"), "--work-dir", str(w), *ARGS, "--workers", "2", "-q"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    # a pool worker is SIGKILLed when its group call is about to rename its 3rd finished shard into place
    r = subprocess.run(cmd, env={**env, "BERTPIPE_FAULT": "split_4bins:rename:3"}, cwd=ROOT, capture_output=True,
                       text=True, timeout=600)
    assert r.returncode != 0, r.stderr[-2000:]
    bins_dirs = [d for d in (w / "bins").iterdir() if d.is_dir()]
    assert bins_dirs and not any((d / MANIFEST_NAME).exists() for d in bins_dirs)  # nothing taken as done
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    train = Path(last_run(w)["outputs"]["train_dir"])
    assert not [p for p in train.rglob(".*")]  # no temporary file left
    s = last_run(w)["stages"]
    ref = run_split_4bins(sorted(Path(s["hdf5"]["dir"]).glob("part-*/part-*.hdf5")), tmp_path / "ref",
                          Split4BinsConfig(n_output_shards=SHARDS))
    assert _bins(w) == {f.name: f.md5 for f in ref.files}
