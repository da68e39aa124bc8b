"""preprocessing.hdf5_io.vlen_write: a variable-length write straight to HDF5's H5Dwrite (h5py's own write first
converts every element into a buffer of its own) gives the bytes of h5py's write, and falls back to it."""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest
from h5py import h5s, h5t

from preprocessing import hdf5_io


def _write(path: Path, counts: np.ndarray, flat: np.ndarray, how: str, start: int = 0) -> str:
    n = len(counts)
    with h5py.File(path, "w") as f:
        ds = f.create_dataset("x", (n + start,), dtype=h5py.vlen_dtype(np.int16))
        if how == "write_vlen":
            hdf5_io.write_vlen(ds, flat, counts, start)
        else:
            hvl = np.empty(n, dtype=[("len", np.uintp), ("p", np.uintp)])
            hvl["len"] = counts
            hvl["p"] = flat.ctypes.data + (np.cumsum(counts) - counts) * flat.itemsize
            fspace = ds.id.get_space()
            fspace.select_hyperslab((start,), (n,))
            ds.id.write(h5s.create_simple((n,)), fspace, hvl, mtype=h5t.vlen_create(h5t.py_create(flat.dtype)))
    with h5py.File(path, "r") as f:
        rows = f["x"][start:]
        at = np.concatenate([[0], np.cumsum(counts)])
        assert all(np.array_equal(r, flat[at[i]:at[i + 1]]) for i, r in enumerate(rows))
    return hashlib.md5(path.read_bytes()).hexdigest()


@pytest.fixture
def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(3)
    counts = rng.integers(0, 600, 5000)
    return counts, rng.integers(-32768, 32767, int(counts.sum())).astype(np.int16)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the direct call looks in /proc/self/maps")
def test_the_direct_write_is_found_here_and_gives_h5pys_bytes(data, tmp_path) -> None:
    assert hdf5_io._h5dwrite() is not None  # so the comparison below compares the two paths
    counts, flat = data
    for start in (0, 7):
        theirs = _write(tmp_path / f"h5py{start}.h5", counts, flat, "h5py", start)
        assert _write(tmp_path / f"ours{start}.h5", counts, flat, "write_vlen", start) == theirs


def test_without_the_direct_call_or_when_it_fails_h5pys_write_runs(data, tmp_path, monkeypatch) -> None:
    counts, flat = data
    theirs = _write(tmp_path / "h5py.h5", counts, flat, "h5py")
    monkeypatch.setattr(hdf5_io, "_H5DWRITE", [None])
    assert _write(tmp_path / "none.h5", counts, flat, "write_vlen") == theirs
    calls = []
    monkeypatch.setattr(hdf5_io, "_H5DWRITE", [lambda *a: calls.append(a) or -1])  # HDF5 said no
    assert _write(tmp_path / "failed.h5", counts, flat, "write_vlen") == theirs and len(calls) == 1
