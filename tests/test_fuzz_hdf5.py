"""Fuzzing the HDF5 readers (split-4bins, pack-varlength, the trainer's shard reader) with seeded corruptions
of a small padded MLPerf HDF5: each case ends in success or a project error naming the file; never another
exception, never a hang, never an interpreter crash (the cases run in subprocesses: tests/fuzz_hdf5_cases.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from core.errors import BertpipeError
from core.schema import HDF5_DATASETS
from preprocessing.hdf5_io import open_padded
from preprocessing.mlperf.split_4bins import Split4BinsConfig, run_split_4bins
from preprocessing.nvidia.varlength import pack_varlength
from pretrain.data import discover_shards

WORKER = Path(__file__).with_name("fuzz_hdf5_cases.py")
SEED = 20251122
CASES, PROCS = 1000, 4


@pytest.fixture(scope="module")
def small_padded(golden: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two rows of each length bin of golden eval_100.hdf5, in the MLPerf layout (33 kB: metadata is ~10%)."""
    path = tmp_path_factory.mktemp("fuzz_h5") / "small.hdf5"
    with h5py.File(golden / "eval_100.hdf5", "r") as src, h5py.File(path, "w") as dst:
        lengths = src["input_mask"][()].sum(axis=1)
        rows = sorted(int(i) for lo, hi in ((1, 128), (129, 256), (257, 384), (385, 512))
                      for i in np.flatnonzero((lengths >= lo) & (lengths <= hi))[:2])
        assert len(rows) == 8
        for name, dtype, _ in HDF5_DATASETS:
            dst.create_dataset(name, data=src[name][rows], dtype=dtype)
    return path


def _scratch_root() -> str | None:
    """tmpfs when there is one: a case writes a dozen small files."""
    return "/dev/shm" if os.access("/dev/shm", os.W_OK) else None


def test_fuzz_hdf5_readers(small_padded: Path) -> None:
    # the uncorrupted file goes through every reader
    with tempfile.TemporaryDirectory(dir=_scratch_root()) as d:
        run_split_4bins([small_padded], Path(d) / "bins", Split4BinsConfig(n_output_shards=2))
        assert pack_varlength(small_padded, Path(d) / "p.hdf5") == 8
    assert discover_shards(small_padded)[512][0].rows == 8

    per = CASES // PROCS
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=_scratch_root()) as scratch:
        procs = [subprocess.Popen([sys.executable, str(WORKER), str(small_padded), f"{scratch}/w{k}", "--seed",
                                   str(SEED), "--first", str(k * per), "--count", str(per)],
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for k in range(PROCS)]
        outs = []
        for p in procs:
            try:
                out, err = p.communicate(timeout=180)
            except subprocess.TimeoutExpired:
                p.kill()
                out, err = p.communicate()
            outs.append((p.returncode, out, err))
    elapsed = time.perf_counter() - t0

    problems, records = [], []
    for rc, out, err in outs:
        lines = out.splitlines()
        if rc != 0 or not lines or lines[-1] != "finished":
            started = [ln for ln in lines if ln.startswith("start ")]
            problems.append(f"worker died (exit {rc}) during {started[-1] if started else 'start-up'}: {err[-2000:]}")
        records += [json.loads(ln) for ln in lines if ln.startswith("{")]
    for r in records:
        if r["outcome"] in ("other", "hang"):
            problems.append(f"case {r['case']} ({r['mutation']}), {r['reader']}: {r['type']}: {r['message']}")
        elif r["outcome"] == "project" and "case.hdf5" not in r["message"]:
            problems.append(f"case {r['case']}, {r['reader']}: the error does not name the file: {r['message']}")
    assert not problems, f"{len(problems)} problem(s) (seed {SEED}):\n" + "\n".join(problems[:20])
    cases = {r["case"] for r in records}
    assert len(cases) == CASES and len(records) == 3 * CASES
    outcome = {o: sum(r["outcome"] == o for r in records) for o in ("ok", "project")}
    assert outcome["project"] > 1000 and outcome["ok"] > 300, outcome  # the corruptions reach the readers
    assert elapsed < 120, elapsed


def _with_signature_broken(src: Path, dst: Path, signature: bytes) -> Path:
    data = bytearray(src.read_bytes())
    i = data.find(signature)
    assert i >= 0
    data[i:i + 4] = b"XXXX"
    dst.write_bytes(bytes(data))
    return dst


@pytest.mark.parametrize("signature", [b"TREE", b"HEAP", b"SNOD"])
def test_damaged_group_metadata_is_a_project_error(small_padded: Path, tmp_path: Path, signature: bytes) -> None:
    """Regression: h5py's RuntimeError ('wrong B-tree signature', 'bad local heap signature') escaped."""
    bad = _with_signature_broken(small_padded, tmp_path / "bad.hdf5", signature)
    with pytest.raises(BertpipeError, match=str(bad)):
        open_padded(bad)
    with pytest.raises(BertpipeError, match=str(bad)):
        run_split_4bins([bad], tmp_path / "bins", Split4BinsConfig(n_output_shards=2))
    with pytest.raises(BertpipeError, match=str(bad)):
        pack_varlength(bad, tmp_path / "p.hdf5")
    with pytest.raises(BertpipeError, match=str(bad)):
        discover_shards(bad)


def test_a_group_where_a_dataset_belongs_is_a_project_error(small_padded: Path, tmp_path: Path) -> None:
    """Regression: a name that resolves to a group (or a named datatype) gave AttributeError: no .shape."""
    bad = tmp_path / "group.hdf5"
    with h5py.File(small_padded, "r") as src, h5py.File(bad, "w") as dst:
        for name, _, _ in HDF5_DATASETS:
            if name == "input_mask":
                dst.create_group(name)
            else:
                dst.create_dataset(name, data=src[name][()])
    with pytest.raises(BertpipeError, match="'input_mask' is a Group, not a dataset"):
        open_padded(bad)
    with pytest.raises(BertpipeError, match="input_mask \\(Group\\) not dataset"):
        discover_shards(bad)


def _rows(path: Path) -> dict[str, list[np.ndarray]]:
    with h5py.File(path, "r") as f:
        return {k: [np.asarray(x) for x in f[k][()]] for k in f}


@pytest.mark.parametrize("chunk_rows", [1, 2])
def test_pack_varlength_of_chunks_whose_rows_have_one_length(golden: Path, tmp_path: Path, chunk_rows: int) -> None:
    """Regression (found by the fuzz): rows of equal length in a chunk (a chunk of 512-token rows, a last
    chunk of one row) made h5py fail with TypeError "Can't broadcast (k, n) -> (k,)"."""
    from preprocessing.nvidia.varlength import PackConfig

    out = tmp_path / "packed.hdf5"
    assert pack_varlength(golden / "eval_100.hdf5", out, PackConfig(chunk_rows=chunk_rows)) == 100
    ours, ref = _rows(out), _rows(golden / "nvidia_varlength" / "eval_100_varlength.numpy1.hdf5")
    assert sorted(ours) == sorted(ref)
    for k in ref:
        assert len(ours[k]) == len(ref[k]) == 100, k
        assert all(np.array_equal(a, b) for a, b in zip(ours[k], ref[k], strict=True)), k


def test_pack_varlength_refuses_a_corrupt_input_mask(small_padded: Path, tmp_path: Path) -> None:
    bad = tmp_path / "mask.hdf5"
    with h5py.File(small_padded, "r") as src, h5py.File(bad, "w") as dst:
        for name, dtype, _ in HDF5_DATASETS:
            data = src[name][()]
            if name == "input_mask":
                data[3] = -1  # sums to -512: sliced as [:-512] it silently gave an empty row
            dst.create_dataset(name, data=data, dtype=dtype)
    with pytest.raises(BertpipeError, match=f"{bad}: row 3 has sequence length -512"):
        pack_varlength(bad, tmp_path / "p.hdf5")
