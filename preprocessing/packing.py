"""What both packers share (NVIDIA's ``preprocessing.nvidia.pack`` and Habana's ``preprocessing.habana.pack``): the
size of the packing-strategy space (refused before any work when it would not fit), gathers of runs of values
(the C loop of ``preprocessing.pack_fast`` where it runs, NumPy otherwise: the same values), and scratch arrays
saved under temporary names."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from core.errors import BertpipeError, InputError
from core.manifest import raise_if_disk_full
from preprocessing import pack_fast
from preprocessing.hdf5_io import tmp_path

#: The most packing strategies a recipe may weigh: its NNLS matrix is max_seq_length x strategies float64 (512 x
#: 100,000: 410 MB), and each round's time grows with it. NVIDIA's and Habana's 3 sequences at 512 make 22,102.
MAX_STRATEGIES = 100_000


def strategy_count(target: int, depth: int) -> int:
    """How many packing strategies :func:`packing_strategies` lists (partitions of ``target`` into at most ``depth``
    parts), counted without listing them."""
    row = [1] + [0] * target  # depth 0: only the empty partition of 0
    for j in range(1, depth + 1):
        new = row[:]
        for n in range(j, target + 1):
            new[n] += new[n - j]  # partitions into at most j parts: those into j-1, plus j parts (each >= 1)
        row = new
    return row[target]


def check_strategy_space(target: int, depth: int, flags: tuple[str, str]) -> None:
    """Refuse, before any work, a pack depth whose strategy space would not fit (one line naming the flags)."""
    n = strategy_count(target, depth)
    if n > MAX_STRATEGIES:
        fits = max(k for k in range(2, depth + 1) if strategy_count(target, k) <= MAX_STRATEGIES) \
            if strategy_count(target, 2) <= MAX_STRATEGIES else 0
        fix = f"use {flags[0]} {fits} or less" if fits else f"use a shorter {flags[1]}"
        raise InputError(f"{flags[0]} {depth} at {flags[1]} {target} makes {n:,} packing strategies (a {target} x "
                         f"{n:,} NNLS matrix of {target * n * 8 / 2**30:,.1f} GiB); at most {MAX_STRATEGIES:,}: {fix}")


#: Runs gathered per step of :func:`take_runs` (a small index buffer, reused, instead of one index per value).
TAKE_RUNS = 4096


def _spans(starts: np.ndarray, lens: np.ndarray, dt: type) -> np.ndarray:
    """``starts[i], starts[i] + 1, ..., starts[i] + lens[i] - 1`` for every i, concatenated: a running sum of steps,
    1 inside a run and the jump from the previous run's end at each run's start (a fifth of the time of
    repeat + arange)."""
    nz = lens > 0
    s, n = starts[nz], lens[nz]
    idx = np.ones(int(n.sum()), dtype=dt)
    if len(idx):
        step = np.empty(len(s), np.int64)
        step[0] = s[0]
        step[1:] = s[1:] - (s[:-1] + n[:-1]) + 1
        idx[np.cumsum(n) - n] = step
        np.cumsum(idx, dtype=dt, out=idx)
    return idx


def take_runs(srcs: Sequence[np.ndarray], lengths: np.ndarray, order: np.ndarray) -> list[np.ndarray]:
    """Each of ``srcs`` holds runs back to back (run i: ``lengths[i]`` values); the runs in ``order`` (a
    permutation or selection), concatenated, one array per source. Gathered :data:`TAKE_RUNS` runs at a time
    into the outputs, so no index array as long as the values is made (nor its memory faulted in)."""
    lengths = np.asarray(lengths, dtype=np.int64)
    if any(len(src) != int(lengths.sum()) for src in srcs):  # pragma: no cover - a bug, not bad input
        raise BertpipeError(f"take_runs: sources of {[len(x) for x in srcs]} values for runs of {int(lengths.sum())}")
    starts = (np.cumsum(lengths) - lengths)[order]
    lens = lengths[order]
    if pack_fast.available() and all(np.dtype(src.dtype).kind == "i" for src in srcs):  # the C loop: one copy
        return [pack_fast.gather_runs([src], None, starts, lens, src.dtype) for src in srcs]
    outs = [np.empty(int(lens.sum()), dtype=src.dtype) for src in srcs]
    # 4-byte indices where they fit: the same values
    dt = np.int32 if max((len(src) for src in srcs), default=0) < 2**31 else np.int64
    o = 0
    for a in range(0, len(lens), TAKE_RUNS):
        idx = _spans(starts[a:a + TAKE_RUNS], lens[a:a + TAKE_RUNS], dt)
        for src, out in zip(srcs, outs, strict=True):
            np.take(src, idx, out=out[o:o + len(idx)], mode="clip")  # indices in range by construction
        o += len(idx)
    return outs


def save_array(path: Path, arr: np.ndarray) -> None:
    """``np.save`` to a temporary name, renamed into place (the packers' scratch arrays)."""
    tmp = tmp_path(path)
    try:
        with open(tmp, "wb") as f:
            np.save(f, np.ascontiguousarray(arr), allow_pickle=False)
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        raise_if_disk_full(exc, path)
        raise


def padded_maps(f: object, path: Path, names: Sequence[str]) -> dict[str, np.ndarray] | None:
    """Datasets ``names`` of the open padded HDF5 ``f`` (h5py) as read-only memory maps of ``path`` when each is
    stored contiguous, unfiltered and in native byte order (as tfrecord-to-hdf5 writes them); else None (chunked
    or compressed files are read through h5py). A dataset that reaches past the end of the file is refused."""
    out = {}
    size = Path(path).stat().st_size
    for name in names:
        ds = f[name]  # type: ignore[index]
        if ds.chunks is not None or ds.compression is not None or not ds.dtype.isnative or ds.size == 0:
            return None
        offset = ds.id.get_offset()
        if offset is None:
            return None
        if offset + ds.id.get_storage_size() > size or ds.id.get_storage_size() != ds.size * ds.dtype.itemsize:
            raise InputError(f"{path}: dataset {name!r} lies outside the file; the file is truncated or corrupt, "
                             "re-create it")
        try:
            out[name] = np.memmap(path, dtype=ds.dtype, mode="r", offset=offset, shape=ds.shape)
        except OSError:  # a file system that cannot map files: read through h5py
            return None
    return out
