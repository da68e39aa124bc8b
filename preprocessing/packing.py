"""What both packers share (NVIDIA's ``preprocessing.nvidia.pack`` and Habana's ``preprocessing.habana.pack``): the
size of the packing-strategy space (refused before any work when it would not fit), gathers of runs of values
(the C loop of ``preprocessing.pack_fast`` where it runs, NumPy otherwise: the same values), scratch arrays
saved under temporary names (and their maps kept per process: :func:`scratch_map`), and HDF5 files built in memory
and written behind (:class:`ImageOutputs`; files of contiguous datasets laid out once per shape and their values
written straight into the image: :func:`image_layout`)."""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import BertpipeError, InputError
from core.manifest import raise_if_disk_full
from preprocessing import pack_fast, scratch
from preprocessing.hdf5_io import close_after_failure, h5_close_for_good, h5_create, h5_open_new, tmp_path

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


def stable_argsort(values: np.ndarray) -> np.ndarray:
    """``np.argsort(values, kind="stable")``, through a 16-bit copy where the integers fit one: NumPy then sorts by
    radix (lengths, strategies: ~5x faster than its merge sort of int64 here)."""
    v = np.asarray(values)
    if v.size and v.dtype.kind in "iu" and v.dtype.itemsize > 2:
        lo, hi = int(v.min()), int(v.max())
        if 0 <= lo and hi < 1 << 16:
            return np.argsort(v.astype(np.uint16), kind="stable")
        if -(1 << 15) <= lo and hi < 1 << 15:
            return np.argsort(v.astype(np.int16), kind="stable")
    return np.argsort(v, kind="stable")


def distinct_argsort(keys: np.ndarray) -> np.ndarray:
    """The order that sorts ``keys``, which are distinct (places: each held once), so every sort gives the stable
    sort's order: NumPy's default (its vectorized quicksort, ~4x faster than the merge sort of int64 here)."""
    return np.argsort(np.asarray(keys))


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


#: A direct scratch array's ``.npy`` header is padded to one block, so its values start on a block boundary.
_PIECE = 8 << 20  # bytes a direct save writes at a time, through one aligned buffer per thread
_PIECES = threading.local()


def _piece_buffer() -> np.ndarray:
    buf = getattr(_PIECES, "buf", None)
    if buf is None:
        buf = _PIECES.buf = scratch.aligned_empty(_PIECE)
    return buf


def npy_block_header(arr: np.ndarray) -> bytes:
    """A ``.npy`` (version 1.0) header for ``arr`` padded with spaces to :data:`preprocessing.scratch.ALIGN` bytes:
    ``np.load`` reads the file as any other, and its values start on a block boundary."""
    d = np.lib.format.header_data_from_array_1_0(arr)
    text = f"{{'descr': {d['descr']!r}, 'fortran_order': False, 'shape': {d['shape']!r}, }}"
    room = scratch.ALIGN - 10 - 1 - len(text)
    if room < 0:  # pragma: no cover - a 1-D array's header is ~70 bytes
        raise BertpipeError(f"npy_block_header: a header of {len(text)} bytes does not fit one block")
    head = b"\x93NUMPY\x01\x00" + (scratch.ALIGN - 10).to_bytes(2, "little")
    return head + text.encode("latin1") + b" " * room + b"\n"


def save_array(path: Path, arr: np.ndarray, direct: bool = False) -> None:
    """``np.save`` to a temporary name, renamed into place (the packers' scratch arrays). ``direct``: past the page
    cache (``O_DIRECT`` where the file system takes it; :mod:`preprocessing.scratch`), its header one block long
    (:func:`npy_block_header`), read back with :func:`read_slices`. An array that starts on a block boundary (a
    pack_fast.Space buffer's) is written from where it is, its last partial block through an aligned buffer;
    another goes through that buffer of :data:`_PIECE` bytes; the last block padded and the file cut to its size."""
    if not direct:
        _save_cached(path, arr)
        return
    arr = np.ascontiguousarray(arr)
    tmp = tmp_path(path)
    try:
        fd, is_direct = scratch.open_for_write(tmp)
        try:
            buf = _piece_buffer()
            head = npy_block_header(arr)
            data = arr.reshape(-1).view(np.uint8)
            buf[:len(head)] = np.frombuffer(head, np.uint8)
            fill, at = len(head), 0
            whole = len(data) // scratch.ALIGN * scratch.ALIGN
            if whole and data.ctypes.data % scratch.ALIGN == 0 and len(head) % scratch.ALIGN == 0:
                # the header block, then the array's whole blocks from where they are (no copy), the rest below
                fd, is_direct = scratch.write_all(fd, tmp, memoryview(buf)[:len(head)], is_direct)
                fd, is_direct = scratch.write_all(fd, tmp, memoryview(data)[:whole], is_direct)
                fill, at = 0, whole
            while True:
                k = min(len(buf) - fill, len(data) - at)
                buf[fill:fill + k] = data[at:at + k]
                fill, at = fill + k, at + k
                last = at >= len(data)
                size = -(-fill // scratch.ALIGN) * scratch.ALIGN if last else fill
                buf[fill:size] = 0
                fd, is_direct = scratch.write_all(fd, tmp, memoryview(buf)[:size], is_direct)
                if last:
                    break
                fill = 0
            os.ftruncate(fd, len(head) + len(data))
        finally:
            os.close(fd)
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        raise_if_disk_full(exc, path)
        raise


def _save_cached(path: Path, arr: np.ndarray) -> None:
    tmp = tmp_path(path)
    try:
        with open(tmp, "wb") as f:
            np.save(f, np.ascontiguousarray(arr), allow_pickle=False)
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        raise_if_disk_full(exc, path)
        raise


#: The scratch arrays this process has mapped (:func:`scratch_map`), by path: (inode, size, mtime), the map.
_MAPS: dict[str, tuple[tuple[int, int, int], np.ndarray]] = {}
#: At most this many kept (a full-size group maps ~8 files of each of 500 inputs).
_MAPS_KEPT = 8192


def scratch_map(path: Path | str) -> np.ndarray:
    """``np.load(path, mmap_mode="r")``, kept from call to call in this process while the file is the same one
    (its inode, size and modification time). A packer's group reads a slice of each input's scratch files: at full
    size ~8 files of each of 500 inputs a group, and ~3,500 groups for pack-habana's set, so opening and parsing
    each file again every group cost ~0.8 CPU-s a group (0.8 core-hours in all) for ~40 ms of reading. A stage
    calls :func:`forget_scratch_maps` before it removes its scratch (a kept map holds a removed file's space)."""
    p = os.fspath(path)
    st = os.stat(p)
    key = (st.st_ino, st.st_size, st.st_mtime_ns)
    hit = _MAPS.get(p)
    if hit is not None and hit[0] == key:
        return hit[1]
    m = np.load(p, mmap_mode="r", allow_pickle=False)
    if len(_MAPS) >= _MAPS_KEPT:
        _MAPS.clear()
    _MAPS[p] = (key, m)
    return m


def forget_scratch_maps(folder: Path | str | None = None) -> None:
    """Drop the kept maps (of files under ``folder``; all without one): their files' space is freed once removed."""
    if folder is None:
        _MAPS.clear()
        return
    top = os.path.join(os.fspath(folder), "")
    for p in [p for p in _MAPS if p.startswith(top)]:
        del _MAPS[p]


def read_slices(slices: Sequence[tuple[Path | str, int, int]], space: Any, name: str) -> list[np.ndarray]:
    """Values ``a .. b - 1`` of each ``(path, a, b)``, a 1-D scratch array saved with :func:`save_array`. One saved
    with ``direct=True`` (its header one block long) is read past the page cache (``O_DIRECT`` where the file
    system allows: whole blocks, one read a slice) into one aligned buffer of ``space`` (buffer ``name``: valid
    until its next use); any other is a view of its memory map."""
    out: list[np.ndarray | None] = []
    wanted = []
    total = 0
    for path, a, b in slices:
        m = scratch_map(path)
        if m.ndim != 1 or not 0 <= a <= b <= len(m):
            raise BertpipeError(f"read_slices: {path} holds {m.shape} values, asked for {a}..{b}")
        if getattr(m, "offset", 0) != scratch.ALIGN:  # saved through the page cache: its map
            out.append(m[a:b])
            continue
        lo, hi = scratch.ALIGN + a * m.itemsize, scratch.ALIGN + b * m.itemsize
        first, end = lo // scratch.ALIGN * scratch.ALIGN, -(-hi // scratch.ALIGN) * scratch.ALIGN
        wanted.append((len(out), path, m.dtype, first, end, lo - first, b - a))
        out.append(None)
        total += end - first
        del m
    if wanted:
        buf = scratch.aligned_from(space, name, total)
        at = 0
        reads = []
        for i, path, dtype, first, end, skip, n in wanted:
            if n:
                reads.append((path, first, memoryview(buf)[at:at + end - first], skip + n * dtype.itemsize))
            out[i] = buf[at + skip:at + skip + n * dtype.itemsize].view(dtype)
            at += end - first
        _read_ranges(reads)
    return out  # type: ignore[return-value]


#: Direct reads in flight at once (:func:`read_slices`). A full-size group reads ~1 MB from each of 500 parts'
#: scratch: one at a time, each waits for the disk (0.7 GB/s on the 2-core VM's disk in 0.87 MB reads); two to four
#: at once keep it busy (2.0-2.3 GB/s).
READ_THREADS = 4


def _read_ranges(reads: Sequence[tuple[Path | str, int, memoryview, int]]) -> None:
    """``scratch.read_range(path, offset, into, need)`` for each read (into distinct memory), up to
    :data:`READ_THREADS` at once; the first error raised once all have ended."""
    if len(reads) < 2 or READ_THREADS < 2:
        for path, first, into, need in reads:
            scratch.read_range(path, first, into, need=need)
        return
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(min(READ_THREADS, len(reads)), thread_name_prefix="bertpipe-read") as ex:
        futs = [ex.submit(scratch.read_range, path, first, into, need=need) for path, first, into, need in reads]
    for f in futs:
        f.result()


def segment_slices(items: Sequence[tuple[Path | str, int, int] | tuple[np.ndarray, np.ndarray]], space: Any,
                   name: str) -> list[np.ndarray]:
    """The segment ids of each scratch slice, int8 values back to back: an item ``(path, a, b)`` is a slice of a
    saved array of the values (:func:`read_slices`), an item ``(bounds, lens)`` rows kept as one number each
    (pack_fast.segment_bounds: ``bounds[i]`` 0s then 1s up to ``lens[i]``), filled into ``space``'s buffer
    ``name + "-filled"``."""
    saved = [it for it in items if not isinstance(it[0], np.ndarray)]
    read = iter(read_slices(saved, space, name))  # type: ignore[arg-type]
    kept = [it for it in items if isinstance(it[0], np.ndarray)]
    views: list[np.ndarray] = []
    if kept:
        lens = [np.asarray(it[1], dtype=np.int64) for it in kept]
        filled = pack_fast.fill_segments(np.concatenate([np.asarray(it[0], np.int64) for it in kept]),
                                         np.concatenate(lens), space, name + "-filled")
        cuts = np.concatenate([[0], np.cumsum([int(x.sum()) for x in lens])])
        views = [filled[cuts[i]:cuts[i + 1]] for i in range(len(kept))]
    fill = iter(views)
    return [next(fill) if isinstance(it[0], np.ndarray) else next(read) for it in items]


def save_segments(scratch_dir: Path, stem: str, values: np.ndarray | None, bounds: np.ndarray | None,
                  direct: bool = False) -> None:
    """A scatter's segment ids into the scratch: ``<stem>_segb.npy`` (one number a row, int16) where the rows are
    0s then 1s (``bounds``), else ``<stem>_seg.npy`` (the values; ``direct``: past the page cache); the other name
    removed (a re-run scatter)."""
    b, v = Path(scratch_dir) / f"{stem}_segb.npy", Path(scratch_dir) / f"{stem}_seg.npy"
    if bounds is not None:
        save_array(b, bounds)
        v.unlink(missing_ok=True)
    else:
        save_array(v, values, direct=direct)
        b.unlink(missing_ok=True)


def segment_item(scratch_dir: Path, stem: str, a: int, b: int, t0: int, t1: int,
                 seq: np.ndarray) -> tuple[Path, int, int] | tuple[np.ndarray, np.ndarray]:
    """The :func:`segment_slices` item of rows ``a .. b - 1`` of a scatter's scratch (tokens ``t0 .. t1 - 1``;
    ``seq``: the rows' lengths), as :func:`save_segments` kept them."""
    bounds = Path(scratch_dir) / f"{stem}_segb.npy"
    if bounds.exists():
        return np.asarray(scratch_map(bounds)[a:b]), np.asarray(seq)
    return Path(scratch_dir) / f"{stem}_seg.npy", t0, t1


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


# -- packed files written by HDF5's own driver, their disk space reserved first ----------------------------------
#: fallocate(2)'s flag: reserve the blocks, keep the file's size (Linux).
_FALLOC_FL_KEEP_SIZE = 1
#: errnos of a file system (or platform) that cannot reserve space: such files are built in memory instead.
_NO_RESERVE = {errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL, errno.ENODEV}


def _fallocate(fd: int, size: int) -> None:
    """Reserve ``size`` bytes of disk for ``fd`` from offset 0 without changing its size (``fallocate(fd,
    FALLOC_FL_KEEP_SIZE, 0, size)``). Raises OSError: ENOSPC / EDQUOT (no room), EOPNOTSUPP and kin (cannot)."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        fn = libc.fallocate
    except (OSError, AttributeError):
        raise OSError(errno.ENOSYS, "fallocate is not available here") from None
    fn.argtypes = (ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64)
    if fn(fd, _FALLOC_FL_KEEP_SIZE, 0, max(1, int(size))) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))


def _can_reserve(path: Path, size: int) -> bool:
    """Create ``path`` (empty) and try to reserve ``size`` bytes for it: True, or False where the file system cannot
    reserve (then nothing is reserved); a full disk raises OSError here, before HDF5 has the file."""
    if not hasattr(os, "memfd_create"):
        return False
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _fallocate(fd, size)
    except OSError as exc:
        if exc.errno in _NO_RESERVE:
            return False
        raise
    finally:
        os.close(fd)
    return True


def _abandon(f: Any, fd: int) -> None:
    """Close HDF5's file ``f`` without a byte more reaching its disk: its descriptor ``fd`` is pointed at an
    anonymous memory file holding what was written so far, so every write and truncate of the close succeeds
    (HDF5 failing a write of its own close crashed the process)."""
    mem = os.memfd_create("bertpipe-abandoned-h5")
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        while chunk := os.read(fd, 1 << 20):
            os.write(mem, chunk)
        os.dup2(mem, fd)
    finally:
        os.close(mem)
    try:
        h5_close_for_good(f, fsync=False)
    except Exception:  # noqa: BLE001,S110 - the file is removed anyway; the reservation's error is what counts
        pass


@contextmanager
def h5_reserved(path: Path | str, bound: int) -> Iterator[Any]:
    """``with h5_reserved(tmp, bound) as f:`` write the new HDF5 file ``f``; when the block ends it is closed for
    good and fsynced, as hdf5_io.h5_create's: the same bytes. HDF5's own file driver writes it (one copy of the
    data, no image in memory), its disk space reserved first: ``bound`` bytes (at least the file's final size)
    taken with ``fallocate(KEEP_SIZE)`` as soon as HDF5 has created it, the part past its end given back after
    the close. A full disk fails the reservation, a plain call (OSError ENOSPC: the caller removes ``tmp`` and
    says so), never a write inside HDF5 (which crashed the process). Where space cannot be reserved (a file
    system without fallocate), the file is built in memory and its image written (h5_create's ``in_memory``)."""
    path = Path(path)
    if not _can_reserve(path, bound):
        with h5_create(path, in_memory=True) as f:
            yield f
        return
    f = h5_open_new(path)
    fd = f.id.get_vfd_handle()
    try:
        _fallocate(fd, bound)
    except OSError:  # the disk filled since the probe
        _abandon(f, fd)
        raise
    try:
        yield f
    except BaseException:
        close_after_failure(f)
        raise
    h5_close_for_good(f)
    os.truncate(path, os.path.getsize(path))  # the reserved blocks past the end given back


class ImageOutputs:
    """A call's HDF5 outputs (:meth:`create`: as :func:`h5_reserved`'s, the same bytes) built in memory by HDF5's core
    driver, each written in one go when it closes: past the page cache (``O_DIRECT``) where ``direct``, and then
    hashed from memory, up to :data:`LANES` files side by side (core.manifest.md5_buffers), instead of read back
    from the page cache. :meth:`md5s` gives the md5s by path (for md5_then_fsync's ``known``).

    Why: HDF5's own driver writes a file of variable-length rows as its 64 KiB heap collections, and every byte
    written through the page cache costs the kernel a page to find (with the memory full of cache: a reclaim),
    0.25-1.7 system seconds a GB on the 2-core VM, varying 4x from run to run; the full set's outputs (150-300 GB)
    do not stay in the cache anyway. The core driver's memory is a ``space`` buffer per held image (``"h5-image-<i>"``,
    pack_fast.Space: the same pages from one file to the next; ``pack_fast.native()``'s image arena). Without the C
    extension or HDF5's library at hand, the files are h5_reserved's and hashed from the page cache.

    The writes go behind (:data:`BEHIND`): each image is handed to one writer thread, which writes it (and does the
    :meth:`rename` that follows it) while the caller builds the next file; a held buffer is reused only once its
    write is done. A worker thus waits for the disk only when it outruns it, not at every file (past the page cache
    each write waits for the disk: ~30 % of a packer's wall on one worker, ~45 % on two). The files are on their
    paths once :meth:`md5s`, :meth:`wait` or :meth:`close` (the ``with`` block's end) returns; a failed write
    (a full disk: core.manifest.DiskFullError naming the file) is raised there."""

    #: Images held for hashing at once: at most the widest md5 kernel's 16 lanes (16 buffers of 15 MB hash at
    #: 8.7 GB/s where 8 hash at 5.0 GB/s on the AVX-512 VM), and hashed as soon as one more image of the last one's
    #: size would take them past HELD_BYTES (a stage's peak memory stays under 1.5 GB: before this bound, 8 of the
    #: 2,048 shuffle's 124 MB shards on 8 parts took it to 1.76 GB). 448 MiB holds 3 of those (4 took its peak
    #: from 1,306 to 1,401 MB), 8 of the 4,320 shuffle's 58 MB shards (4.1 GB/s; 5 at the 256 MiB bound before:
    #: 2.7 GB/s) and 16 of pack-habana's 15 MB files. The held images' buffers stay with the worker
    #: (pack_fast.Space), so this also bounds them.
    LANES = 16
    HELD_BYTES = 448 << 20
    #: The images written by a writer thread while the caller goes on (False: each written before create returns).
    BEHIND = True

    def __init__(self, space: Any = None, direct: bool = False,
                 spare: np.ndarray | Sequence[np.ndarray | None] | None = None, held_bytes: int | None = None) -> None:
        from preprocessing.hdf5_io import libhdf5

        self.space, self.direct = space, direct
        #: the bytes of held images (in buffers of their own) that start their hashing: HELD_BYTES unless the caller
        #: knows its files are few and large enough to take more (pack-habana's uncompressed files: 16 of 33 MB)
        self.held_bytes = self.HELD_BYTES if held_bytes is None else int(held_bytes)
        #: memory the caller no longer needs until the block of files ends (pack-nvidia: its group's read buffers,
        #: dead once the rows are in place order), one array or several: the images are built there, one after the
        #: other (each in the first spare it fits), before any buffer of ``space`` is made for them. Held images
        #: there do not count towards HELD_BYTES (the memory is the caller's anyway): up to LANES are hashed at
        #: once, and the spares are used again once they are.
        given = [spare] if isinstance(spare, np.ndarray) else list(spare or ())
        self.spares = [a for a in given if a is not None and a.dtype == np.uint8 and a.ndim == 1 and len(a)]
        self._bumps = [0] * len(self.spares)  # each spare's first free byte
        self._carved = -1  # the spare the last image was carved from
        #: the largest share of its bound an image has taken so far (0: none yet). A spare's room is asked for that
        #: share of the next bound (and 1/16 more), not the whole bound: a caller's bound is what a reservation on
        #: the disk needs (pack-nvidia's: twice its values and more, where its shards take ~0.6 of it), and an image
        #: that outgrows its room anyway moves to memory of its own (create: a copy), the same bytes.
        self._fill = 0.0
        self._asked = 0
        self._own = 0  # bytes of held images in buffers of their own (``space``'s, or malloc'd)
        self.mod = pack_fast.native()
        self.usable = self.mod is not None and libhdf5() is not None
        self.held: list[tuple[str, memoryview]] = []  # written (or being written), not hashed yet
        self.known: dict[str, str] = {}  # path at its write -> md5
        self.renamed: dict[str, str] = {}
        self._writer: Any = None  # concurrent.futures.ThreadPoolExecutor, one thread, made at the first write
        self._pending: list[tuple[str, Any]] = []  # (path, future) of the writes and renames handed to it, in order
        self._slot: dict[int, Any] = {}  # held buffer index -> the future of the write that reads it

    def __enter__(self) -> ImageOutputs:
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        self.close(failed=exc_type is not None)

    def close(self, failed: bool = False) -> None:
        """Wait for the writes still going (their error raised, unless ``failed``: the caller's own error is on
        its way and the files are removed anyway) and stop the writer thread."""
        try:
            self.wait(raise_errors=not failed)
        finally:
            if self._writer is not None:
                self._writer.shutdown(wait=True)
                self._writer = None

    def wait(self, raise_errors: bool = True) -> None:
        """Every write and rename handed to the writer thread done: the files on their paths. The first failure is
        raised (a full disk: DiskFullError naming the file) once all have ended."""
        pending, self._pending = self._pending, []
        self._slot.clear()
        first: tuple[str, BaseException] | None = None
        for path, fut in pending:
            try:
                fut.result()
            except BaseException as exc:  # noqa: BLE001 - every write waited for before any error goes up
                first = first or (path, exc)
        if first is not None and raise_errors:
            raise_if_disk_full(first[1], first[0])
            raise first[1]

    def _behind(self, path: str, job: Any) -> Any:
        """``job()`` on the writer thread (in this thread's context: core.manifest's late fsyncs), after the jobs
        handed to it before; its future."""
        import contextvars

        if self._writer is None:
            from concurrent.futures import ThreadPoolExecutor

            self._writer = ThreadPoolExecutor(1, thread_name_prefix="bertpipe-image-writer")
        fut = self._writer.submit(contextvars.copy_context().run, job)
        self._pending.append((path, fut))
        return fut

    def _reuse(self, slot: int) -> None:
        """Before held buffer ``slot`` takes a new image: the write that reads it done (its error raised)."""
        fut = self._slot.pop(slot, None)
        if fut is None:
            return
        try:
            fut.result()
        except BaseException as exc:
            path = next((p for p, f in self._pending if f is fut), "")
            raise_if_disk_full(exc, path)
            raise

    @contextmanager
    def create(self, path: Path | str, bound: int) -> Iterator[Any]:
        """``with outputs.create(tmp, bound) as f:`` the new HDF5 file ``f`` (``bound``: at least its size); when the
        block ends it is written to ``path`` (and fsynced as h5_reserved's: core.manifest.writes.sync_fd)."""
        if not self.usable:
            with h5_reserved(path, bound) as f:
                yield f
            return
        mod, path = self.mod, Path(path)
        slot, buf, carved = self._buffer(int(bound) + scratch.ALIGN)
        mod.image_arena(buf)
        try:
            f = h5_open_new(path, in_memory=True, backing_store=False, block_size=1 << 16,
                            image_callbacks=mod.image_callbacks())
            try:
                yield f
            except BaseException:
                close_after_failure(f)  # in memory: nothing reaches the disk
                raise
            h5_close_for_good(f, fsync=False)  # in memory: the image is final
            at, grown, in_buf = mod.image_view()
            if in_buf:
                image = memoryview(buf)[:grown]
            else:  # it outgrew the buffer: a copy, the arena's memory freed below
                image = memoryview(bytes((ctypes.c_char * grown).from_address(at)))
            size = image_size(image)
            if size > grown:
                raise BertpipeError(f"{path}: the HDF5 image holds {grown} bytes, its superblock says {size} (a bug)")
            self._written(path, buf if in_buf else None, image, size, slot, carved)
        finally:
            mod.image_arena(None)

    @contextmanager
    def create_laid_out(self, path: Path | str, layout: ImageLayout) -> Iterator[dict[str, np.ndarray]]:
        """``with outputs.create_laid_out(tmp, layout) as arrays:`` the new HDF5 file of ``layout``'s shape
        (:func:`image_layout`), its datasets' values written by the caller straight into ``arrays`` (name ->
        array of the dataset's shape and type: views of the file's image, their contents undefined until then);
        when the block ends the image is written to ``path`` as :meth:`create`'s. The same bytes as the datasets
        created with those values by HDF5 (the layout's other bytes are HDF5's), without HDF5's copy of each value
        into its image or its zeroing of the image first. Needs :attr:`usable`."""
        if not self.usable:
            raise BertpipeError("ImageOutputs.create_laid_out without the C extension and HDF5's library (a bug)")
        path = Path(path)
        slot, buf, carved = self._buffer(layout.size + scratch.ALIGN)
        for at, head in layout.gaps:
            buf[at:at + len(head)] = head
        yield {name: np.ndarray(shape, dt, buffer=buf, offset=at) for name, at, shape, dt in layout.datasets}
        image = memoryview(buf)[:layout.size]
        if image_size(image) != layout.size:  # pragma: no cover - the layout's own bytes say its size
            raise BertpipeError(f"{path}: a laid-out HDF5 image whose superblock disagrees with its size (a bug)")
        self._written(path, buf, image, layout.size, slot, carved)

    def _buffer(self, n: int) -> tuple[int, np.ndarray, bool]:
        """The next image's memory, ``n`` bytes or more: (held slot, buffer, whether carved from the spare)."""
        if len(self.held) >= self.LANES:
            self._hash()
        slot = len(self.held)
        self._asked = n
        room = n if not self._fill else min(n, int(n * self._fill) + int(n * self._fill) // 16 + scratch.ALIGN)
        buf = self._carve(room)
        if buf is None and self.spares and self.held:  # the spares full of held images: hashed, free
            self._hash()
            slot, buf = 0, self._carve(room)
        carved = buf is not None
        if buf is None:
            self._reuse(slot)
            buf = (scratch.aligned_from(self.space, f"h5-image-{slot}", n) if self.space is not None
                   else scratch.aligned_empty(n))
        return slot, buf, carved

    def _written(self, path: Path, buf: np.ndarray | None, image: memoryview, size: int, slot: int,
                 carved: bool) -> None:
        """The image ``image`` (``size`` bytes: the file) of held ``slot``'s buffer ``buf`` (None: a copy of its
        own) written to ``path``, behind or now, and held for hashing."""
        in_buf = buf is not None
        whole = memoryview(buf) if in_buf else image
        self._fill = max(self._fill, min(1.0, size / max(1, self._asked)))
        own = not (carved and in_buf)
        if own:
            self._own += size
        else:  # the spare taken up to its written end (the direct write's zeroed tail)
            self._bumps[self._carved] += -(-size // scratch.ALIGN) * scratch.ALIGN
        if self.BEHIND:
            fd, direct = _open_image(path, self.direct and in_buf)  # here: a rename after it finds the file
            fut = self._behind(os.fspath(path), partial(_finish_image, fd, path, whole, size, direct))
            if not carved:
                self._slot[slot] = fut
        else:
            _write_image(path, whole, size, self.direct and in_buf)
        self.held.append((os.fspath(path), image[:size]))
        if own and self._own + size > self.held_bytes:  # another image of this size would not fit
            self._hash()

    def _hash(self) -> None:
        from core.manifest import md5_buffers

        if self.held:
            for (p, _), md5 in zip(self.held, md5_buffers([v for _, v in self.held]), strict=True):
                self.known[p] = md5
            self.held.clear()
            self._own = 0

    def _carve(self, n: int) -> np.ndarray | None:
        """The rest of the first spare that ``n`` bytes fit in (from an :data:`scratch.ALIGN` boundary) as the next
        image's memory; None if none has the room (or without a spare). With no image held, the spares start over,
        once every write that reads them is done."""
        if not self.spares:
            return None
        if not self.held and any(self._bumps):
            self.wait()
            self._bumps = [0] * len(self.spares)
        for i, spare in enumerate(self.spares):
            base = spare.ctypes.data
            at = -(-(base + self._bumps[i]) // scratch.ALIGN) * scratch.ALIGN - base
            if len(spare) - at >= n:
                self._bumps[i], self._carved = at, i
                return spare[at:]
        return None

    def rename(self, tmp: Path | str, final: Path | str) -> None:
        """``os.replace(tmp, final)``, the md5 following the file; a file being written behind is renamed once it
        is written (the final name never shows a partial file)."""
        written = next((f for p, f in reversed(self._pending) if p == os.fspath(tmp)), None)
        if written is not None:  # after its write, on the same thread; not at all if the write failed
            self._behind(os.fspath(final), partial(_replace_after, written, tmp, final))
        else:
            os.replace(tmp, final)
        self.renamed[os.fspath(final)] = os.fspath(tmp)

    def md5s(self) -> dict[str, str]:
        """Every file's md5 so far, by its path (the name it was renamed to, if any): the held images hashed now,
        and every write and rename done."""
        self._hash()
        self.wait()
        got = dict(self.known)
        for final, tmp in self.renamed.items():
            if tmp in got:
                got[final] = got.pop(tmp)
        return got


def image_size(image: memoryview | bytes) -> int:
    """The size of the HDF5 file whose image starts ``image``: its superblock's base address plus its
    end-of-file address, the length HDF5's own file driver truncates the file to at its close."""
    head = bytes(image[:64])
    if head[:8] != b"\x89HDF\r\n\x1a\n":
        raise BertpipeError("an HDF5 image without a superblock at its start (a bug)")
    version = head[8]
    if version in (0, 1):
        width, at = head[13], 24 if version == 0 else 28  # addresses: base, free space, end of file, driver
        base = int.from_bytes(head[at:at + width], "little")
        eof = int.from_bytes(head[at + 2 * width:at + 3 * width], "little")
    elif version in (2, 3):
        width = head[9]  # addresses: base, superblock extension, end of file, root group
        base = int.from_bytes(head[12:12 + width], "little")
        eof = int.from_bytes(head[12 + 2 * width:12 + 3 * width], "little")
    else:
        raise BertpipeError(f"an HDF5 image with superblock version {version}, which bertpipe does not read")
    return base + eof


@dataclass(frozen=True)
class ImageLayout:
    """An HDF5 file of contiguous, uncompressed datasets, as HDF5 writes it for one shape of them
    (:func:`image_layout`): ``size`` bytes, of which each dataset's values lie at an offset of their own (``datasets``:
    name, offset, shape, type, in the order created) and every other byte is HDF5's and the same for every file of
    that shape (``gaps``: offset and bytes, its superblock and object headers). A file of that shape with other
    values is the gaps' bytes with its values at their offsets (ImageOutputs.create_laid_out)."""

    size: int
    gaps: tuple[tuple[int, np.ndarray], ...]  # uint8, read-only
    datasets: tuple[tuple[str, int, tuple[int, ...], np.dtype], ...]


#: Layouts already taken, by their caller's key (a worker writes hundreds of files of one shape): the last few kept.
_LAYOUTS: dict[Any, ImageLayout | None] = {}
_LAYOUTS_KEPT = 8


def image_layout(key: Any, build: Any, names: Sequence[str]) -> ImageLayout | None:
    """The :class:`ImageLayout` of the file that ``build(f)`` makes (it creates datasets ``names`` in the new HDF5
    file ``f``, their values 0: the layout depends on their shapes and types, never on the values), taken from the
    image HDF5's core driver holds for it, once per ``key`` (which must name everything ``build`` depends on) in a
    process. None where a dataset is not contiguous and uncompressed, or has no storage though it holds values (the
    caller writes such a file through HDF5). A dataset may lie at an offset that is not a multiple of its type's
    size (HDF5's small-data aggregator puts a short file's small datasets so): its array is then unaligned."""
    if key in _LAYOUTS:
        return _LAYOUTS[key]
    mod = pack_fast.native()
    if mod is None:
        return None
    buf = np.zeros(1 << 20, np.uint8)  # the arena; a larger image moves to memory of its own (image_view)
    mod.image_arena(buf)
    try:
        return _take_layout(key, build, names, mod, buf)
    finally:
        mod.image_arena(None)


def _take_layout(key: Any, build: Any, names: Sequence[str], mod: Any, buf: np.ndarray) -> ImageLayout | None:
    # built as ImageOutputs.create builds a file (the same driver, block size and callbacks), read after its close
    f = h5_open_new(f"bertpipe-layout-{os.getpid()}", in_memory=True, backing_store=False, block_size=1 << 16,
                    image_callbacks=mod.image_callbacks())
    closed = False
    try:
        build(f)
        datasets, ok = [], True
        for name in names:
            ds = f[name]
            dt = np.dtype(ds.dtype)
            nbytes = int(np.prod(ds.shape, dtype=np.int64)) * dt.itemsize
            at = ds.id.get_offset()
            if (ds.chunks is not None or ds.compression is not None or dt.kind not in "iuf"
                    or (dt.itemsize > 1 and not dt.isnative) or (nbytes and at is None)
                    or ds.id.get_storage_size() != nbytes):
                ok = False
                break
            datasets.append((name, int(at or 0), tuple(int(x) for x in ds.shape), dt))
        del ds
        h5_close_for_good(f, fsync=False)
        closed = True
    finally:
        if not closed:
            close_after_failure(f)
    at, grown, in_buf = mod.image_view()
    image = memoryview(buf)[:grown] if in_buf else memoryview(bytes((ctypes.c_char * grown).from_address(at)))
    layout = None
    if ok:
        size = image_size(image)
        if size > len(image):  # pragma: no cover
            raise BertpipeError(f"image_layout: the image holds {len(image)} bytes, its superblock says {size} (a bug)")
        used = sorted((at, at + int(np.prod(shape, dtype=np.int64)) * dt.itemsize)
                      for _, at, shape, dt in datasets if np.prod(shape, dtype=np.int64))
        gaps, end = [], 0
        for a, b in used:
            if a < end:  # pragma: no cover - HDF5 never overlaps two datasets' storage
                raise BertpipeError("image_layout: two datasets' values overlap (a bug)")
            if a > end:
                gaps.append((end, _frozen(image[end:a])))
            end = b
        if end > size:  # pragma: no cover
            raise BertpipeError("image_layout: a dataset's values reach past the file's end (a bug)")
        if end < size:
            gaps.append((end, _frozen(image[end:size])))
        layout = ImageLayout(size, tuple(gaps), tuple(datasets))
    while len(_LAYOUTS) >= _LAYOUTS_KEPT:
        _LAYOUTS.pop(next(iter(_LAYOUTS)))
    _LAYOUTS[key] = layout
    return layout


def _frozen(b: bytes) -> np.ndarray:
    a = np.frombuffer(bytes(b), np.uint8)
    a.flags.writeable = False
    return a


def _write_image(path: Path, image: memoryview, size: int, direct: bool) -> None:
    """The first ``size`` bytes of ``image`` as the file ``path`` (created or truncated), fsynced as every HDF5
    writer's (sync_fd). ``direct``: past the page cache, whole blocks (``image`` has room past ``size``: zeroed,
    then cut off), where the file system takes it."""
    fd, direct = _open_image(path, direct)
    _finish_image(fd, path, image, size, direct)


def _replace_after(written: Any, tmp: Path | str, final: Path | str) -> None:
    """``os.replace(tmp, final)`` once the write ``written`` (a future) has succeeded (else its error)."""
    written.result()
    os.replace(tmp, final)


def _open_image(path: Path, direct: bool) -> tuple[int, bool]:
    """``path`` created or truncated for :func:`_finish_image`: (fd, whether past the page cache)."""
    if direct:
        return scratch.open_for_write(path)
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644), False


def _finish_image(fd: int, path: Path, image: memoryview, size: int, direct: bool) -> None:
    """:func:`_write_image` on ``fd`` from :func:`_open_image`, which it closes."""
    from core.manifest.writes import sync_fd

    try:
        if direct:
            end = -(-size // scratch.ALIGN) * scratch.ALIGN
            image[size:end] = bytes(end - size)
            fd, _ = scratch.write_all(fd, path, image[:end], True)
            os.ftruncate(fd, size)
        else:
            done = 0
            while done < size:
                done += os.write(fd, image[done:size])
        sync_fd(fd)
    finally:
        os.close(fd)


def padded_lengths(path: Path, first: int, rows: dict[str, np.ndarray],
                   lengths: tuple[np.ndarray, int] | None = None) -> np.ndarray:
    """The lengths (int64) of a block of padded rows (``rows``: ``input_mask`` and any of ``masked_lm_positions``,
    ``masked_lm_ids``, ``next_sentence_labels``, the file's rows ``first``...), checked by hdf5_check.check_padded's
    rules: the mask 1s then 0s (one pass of the C loop), positions 0 or inside their row, ids >= 0, labels 0 or 1.
    A block that breaks a rule goes to check_padded itself, whose one-line error names the dataset and row.
    ``lengths``: what ``pack_fast.mask_lengths(rows["input_mask"])`` gave the caller already (not taken again)."""
    from preprocessing.hdf5_check import check_padded

    seq, bad = lengths if lengths is not None else pack_fast.mask_lengths(rows["input_mask"])
    ok = bad < 0
    if ok and "masked_lm_positions" in rows:
        p = np.asarray(rows["masked_lm_positions"])
        ok = not ((p < 0) | ((p != 0) & (p >= seq[:, None]))).any()
    if ok and "masked_lm_ids" in rows:
        ok = not (np.asarray(rows["masked_lm_ids"]) < 0).any()
    if ok and "next_sentence_labels" in rows:
        n = np.asarray(rows["next_sentence_labels"])
        ok = not ((n != 0) & (n != 1)).any()
    if not ok:
        check_padded(path, first, rows)
        raise BertpipeError(f"{path}: rows {first}...: a check failed that check_padded passes (a bug)")
    return seq
