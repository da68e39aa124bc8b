"""Scratch files past the page cache, for scratch larger than memory: record streams appended with ``O_DIRECT``
and read back whole.

An external shuffle writes every row to scratch once and reads it back once. Written through the page cache, each
byte is first copied into a cache page the kernel must find (reclaim, or a free page the host took back), which
costs 0.25 to 1.7 system seconds a GB on the 2-core VM, moving by 4x from run to run. Scratch that fits in memory
is best left there (it is read back from the cache, and removed before it is written back). Scratch that does not
(the full set's: the cut rows, ~160 GB for the shuffles) goes to the disk and comes back from it
anyway; with ``O_DIRECT`` the disk reads and writes the process's own buffers, and the copies and the page hunt are
gone. :func:`use_direct` decides, once per stage, from the scratch's size against the memory available
(``BERTPIPE_DIRECT_IO=1`` always, ``0`` never).

The price is alignment: a direct write takes whole blocks from an aligned buffer. :class:`RecordWriter` therefore
copies a batch of records into aligned buffers and pads it with zeros to the next :data:`ALIGN` boundary. The
padding is 0 bytes or at least :data:`MIN_PAD` bytes, so a reader that meets 8 zero bytes where a record's header
starts (a record never begins with a zero count) skips to the next boundary (:func:`next_block`). Where the file
system refuses ``O_DIRECT`` (tmpfs, some overlays; ``EINVAL``), the same bytes go through the page cache.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

#: The block size direct writes and reads are aligned to (a multiple of every logical block size in use).
ALIGN = 4096
#: The smallest padding a batch gets when it does not end on a boundary: room for a record header of zeros.
MIN_PAD = 32
#: Bytes one direct read asks for.
READ_STEP = 64 << 20
_O_DIRECT = getattr(os, "O_DIRECT", 0)


#: Direct scratch when it would fill more than this share of the memory available.
MEMORY_SHARE = 0.5


def direct_io_enabled() -> bool:
    """Whether scratch I/O may use ``O_DIRECT`` (Linux; not with ``BERTPIPE_DIRECT_IO=0``)."""
    return bool(_O_DIRECT) and os.environ.get("BERTPIPE_DIRECT_IO", "auto") != "0"


def memory_available() -> int:
    """Bytes of memory available (``MemAvailable`` of /proc/meminfo), or 0 where it is not known."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def use_direct(folder: Path | str, scratch_bytes: int) -> bool:
    """Whether a stage's scratch of about ``scratch_bytes`` goes past the page cache: ``BERTPIPE_DIRECT_IO=1``
    always and ``0`` never; otherwise when it exceeds :data:`MEMORY_SHARE` of the memory available (it would be
    written back to the disk and read from it anyway). Only where ``folder``'s file system takes ``O_DIRECT``."""
    mode = os.environ.get("BERTPIPE_DIRECT_IO", "auto")
    if not direct_io_enabled():
        return False
    if mode != "1":
        avail = memory_available()
        if not avail or scratch_bytes <= MEMORY_SHARE * avail:
            return False
    probe = Path(folder) / ".direct-probe"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | _O_DIRECT, 0o644)
    except OSError:
        return False
    os.close(fd)
    probe.unlink(missing_ok=True)
    return True


def aligned_empty(nbytes: int) -> np.ndarray:
    """An uninitialised uint8 array of ``nbytes`` whose first byte lies on an :data:`ALIGN` boundary."""
    raw = np.empty(int(nbytes) + ALIGN, dtype=np.uint8)
    off = (-raw.ctypes.data) % ALIGN
    return raw[off:off + int(nbytes)]


def aligned_from(space: Any, name: str, nbytes: int) -> np.ndarray:
    """:func:`aligned_empty` from a :class:`preprocessing.pack_fast.Space` buffer (used again call after call)."""
    raw = space.get(name, int(nbytes) + ALIGN, np.uint8)
    off = (-raw.ctypes.data) % ALIGN
    return raw[off:off + int(nbytes)]


def padded_size(nbytes: int) -> int:
    """``nbytes`` rounded up to a boundary, with at least :data:`MIN_PAD` bytes of padding when there is any."""
    size = -(-int(nbytes) // ALIGN) * ALIGN
    if 0 < size - nbytes < MIN_PAD:
        size += ALIGN
    return size


def next_block(at: int) -> int:
    """The first boundary past offset ``at`` (where a reader resumes after a zero header at ``at``)."""
    return (at // ALIGN + 1) * ALIGN


def _open(path: Path | str, flags: int, direct: bool) -> tuple[int, bool]:
    if direct and direct_io_enabled():
        try:
            return os.open(path, flags | _O_DIRECT, 0o644), True
        except OSError as exc:
            if exc.errno != errno.EINVAL:
                raise
    return os.open(path, flags, 0o644), False


class RecordWriter:
    """Appends batches of records to files, each batch padded to a boundary. Batches are copied, back to back,
    into one of two aligned buffers of :data:`PIECE` bytes (a batch larger than the room left goes on in the next
    one), and a full buffer is written by one background thread, each batch to its file, while the next buffer is
    filled (the disk's time overlaps the caller's work; the batches of all files are written in the order they
    were appended). :meth:`close` writes what is left, waits for every write and raises the first error; a scatter
    call opens one writer and closes it before it returns.

    Many small batches share a buffer and a hand-over to the thread: at the full set's ~300 buckets the shuffle's
    scatter appends records of ~0.3 MB, and a hand-over (and a wait for the other buffer) for each one cost 40 %
    more scatter CPU than the 8-part runs' 3 buckets."""

    #: Bytes of one buffer (two of them: 32 MB in all).
    PIECE = 16 << 20

    def __init__(self, direct: bool = True) -> None:
        self.direct = direct
        self._bufs: list[np.ndarray] = []
        self._jobs: list[Any] = [None, None]
        self._turn = 0
        self._pool: Any = None
        self._cur: int | None = None  # the buffer being filled
        self._at = 0  # its bytes taken
        self._segs: list[tuple[Path | str, int, int]] = []  # (path, start, end) of each batch's bytes in it

    def _next_buffer(self) -> tuple[int, np.ndarray]:
        """A buffer no write is using any more (waiting for the one that used it)."""
        i = self._turn
        self._turn = 1 - i
        if self._jobs[i] is not None:
            job, self._jobs[i] = self._jobs[i], None
            job.result()
        if len(self._bufs) <= i:
            self._bufs.append(aligned_empty(self.PIECE))
        return i, self._bufs[i]

    def _hand_over(self) -> None:
        """The buffer being filled, to the writer thread (each of its batches appended to its file)."""
        if self._cur is None:
            return
        i, segs = self._cur, self._segs
        self._cur, self._at, self._segs = None, 0, []
        if not segs:
            return
        if self._pool is None:
            from concurrent.futures import ThreadPoolExecutor

            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="scratch-writer")
        self._jobs[i] = self._pool.submit(_append_blocks, memoryview(self._bufs[i]), segs, self.direct)

    def _filling(self) -> np.ndarray:
        """The buffer being filled, with room in it (a full one handed over, a free one taken)."""
        if self._cur is not None and self._at == self.PIECE:
            self._hand_over()
        if self._cur is None:
            self._cur, _ = self._next_buffer()
        return self._bufs[self._cur]

    def append(self, path: Path | str, arrays: Sequence[np.ndarray]) -> int:
        """Append the bytes of ``arrays`` (C-contiguous), back to back, then the padding, to ``path`` (created if
        absent; its size is always a multiple of :data:`ALIGN`). Returns the bytes appended, padding included;
        they are written by :meth:`close` at the latest (which waits for them)."""
        total = sum(int(a.nbytes) for a in arrays)
        if not total:
            return 0
        if not self.direct:  # through the page cache: the arrays themselves, one vectored write, no padding
            _append_cached(path, arrays)
            return total
        size = padded_size(total)
        sources = [np.frombuffer(memoryview(a).cast("B"), dtype=np.uint8) for a in arrays if a.nbytes]
        src, src_at = 0, 0  # the next byte to copy: sources[src][src_at]
        done = 0
        while done < size:
            buf = self._filling()
            start = self._at
            end = start + min(self.PIECE - start, size - done)  # multiples of ALIGN: PIECE and size are
            at = start
            while at < end and src < len(sources):
                k = min(end - at, len(sources[src]) - src_at)
                buf[at:at + k] = sources[src][src_at:src_at + k]
                at += k
                src_at += k
                if src_at == len(sources[src]):
                    src, src_at = src + 1, 0
            buf[at:end] = 0  # the padding, at the end of the batch's last piece
            self._segs.append((path, start, end))
            self._at = end
            done += end - start
        return size

    def append_records(self, paths: Sequence[Path | str], addrs: np.ndarray, lens: np.ndarray) -> None:
        """Many small batches at once, as :meth:`append` appends them one by one (the same bytes): batch ``i``,
        to ``paths[i]``, is the byte runs ``addrs[i, j]``, ``lens[i, j]`` (2-D: uint64 addresses, int64 lengths;
        memory the caller keeps alive until this returns) back to back, then its padding. Each buffer's share of
        them is copied by one C gather (preprocessing.pack_fast), not a Python step a run. Every batch must fit
        a buffer once padded (:data:`PIECE`); through the page cache, or without the C extension, use append."""
        from preprocessing import pack_fast

        mod = pack_fast.native()
        if not self.direct or mod is None:
            raise ValueError("append_records: a direct writer and the C extension only (use append)")
        n, m = addrs.shape
        totals = lens.sum(axis=1)
        sizes = -(-totals // ALIGN) * ALIGN
        sizes[(sizes - totals > 0) & (sizes - totals < MIN_PAD)] += ALIGN  # padded_size, for every batch
        if n and int(sizes.max()) > self.PIECE:
            raise ValueError(f"append_records: a batch of {int(sizes.max())} bytes is larger than a buffer")
        runs_at = np.empty((n, m + 1), np.uint64)
        runs_len = np.empty((n, m + 1), np.int64)
        runs_at[:, :m], runs_len[:, :m] = addrs, lens
        runs_at[:, m], runs_len[:, m] = _ZEROS.ctypes.data, sizes - totals  # each batch's padding: zeros
        ends = np.cumsum(sizes)
        i = 0
        while i < n:
            self._filling()
            base = int(ends[i - 1]) if i else 0
            k = int(np.searchsorted(ends[i:], base + self.PIECE - self._at, side="right"))  # batches that fit
            if not k:
                self._hand_over()
                continue
            j = i + k
            span = int(ends[j - 1]) - base
            out = self._bufs[self._cur][self._at:self._at + span].view(np.int8)
            mod.gather_runs(out, runs_at[i:j].ravel(), runs_len[i:j].ravel(), 1)
            starts = self._at + ends[i:j] - sizes[i:j] - base
            self._segs.extend(zip(paths[i:j], starts.tolist(), (starts + sizes[i:j]).tolist(), strict=True))
            self._at += span
            i = j

    def close(self) -> None:
        """Write what is left, wait for every write; raise the first error."""
        first: BaseException | None = None
        try:
            self._hand_over()
        except BaseException as exc:  # noqa: BLE001 - raised below, once the writes under way are waited for
            first = exc
        for i, job in enumerate(self._jobs):
            self._jobs[i] = None
            if job is not None:
                try:
                    job.result()
                except BaseException as exc:  # noqa: BLE001 - the first one is raised below
                    first = first or exc
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
        if first is not None:
            raise first

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: The padding's source for :meth:`RecordWriter.append_records` (padding is under ALIGN + MIN_PAD bytes).
_ZEROS = np.zeros(2 * ALIGN, np.uint8)


def _append_blocks(view: memoryview, segs: Sequence[tuple[Path | str, int, int]], direct: bool) -> None:
    """Each ``(path, start, end)``: ``view[start:end]`` appended to ``path`` (:func:`_append_block`), in order."""
    for path, start, end in segs:
        _append_block(path, view[start:end], direct)


def _append_cached(path: Path | str, arrays: Sequence[np.ndarray]) -> None:
    """Append the bytes of ``arrays`` to ``path`` through the page cache, in vectored writes (of 512 arrays)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        bufs = [memoryview(x).cast("B") for x in arrays if x.nbytes]
        for k in range(0, len(bufs), 512):
            part = bufs[k:k + 512]
            done = os.writev(fd, part)
            if done != sum(len(x) for x in part):  # a short write (a full disk, a signal): the rest one by one
                rest = b"".join(part)[done:]
                while rest:
                    rest = rest[os.write(fd, rest):]
    finally:
        os.close(fd)


def _append_block(path: Path | str, view: memoryview, direct: bool = True) -> None:
    """Append ``view`` (aligned, whole blocks) to ``path``: past the page cache where the file system allows."""
    fd, direct = _open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, direct=direct)
    done = 0
    try:
        while done < len(view):
            try:
                done += os.write(fd, view[done:])
            except OSError as exc:
                if not direct or exc.errno != errno.EINVAL:
                    raise
                # the file system took the flag but not the write: the rest through the page cache
                os.close(fd)
                fd, direct = _open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, direct=False)
    finally:
        os.close(fd)


def open_for_write(path: Path | str) -> tuple[int, bool]:
    """A new file (truncated), opened for writing past the page cache where the file system allows: (fd, direct)."""
    return _open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, direct=True)


def write_all(fd: int, path: Path | str, view: memoryview, direct: bool) -> tuple[int, bool]:
    """Write all of ``view`` at ``fd``'s offset (direct: aligned, whole blocks). A file system that took
    ``O_DIRECT`` at open but refuses the write (``EINVAL``) gets the rest through the page cache: the fd is
    reopened without it at the same offset. Returns the (fd, direct) to go on with."""
    done = 0
    while done < len(view):
        try:
            done += os.write(fd, view[done:])
        except OSError as exc:
            if not direct or exc.errno != errno.EINVAL:
                raise
            at = os.lseek(fd, 0, os.SEEK_CUR)
            os.close(fd)
            fd, direct = _open(path, os.O_WRONLY, direct=False)
            os.lseek(fd, at, os.SEEK_SET)
    return fd, direct


def read_range(path: Path | str, offset: int, into: memoryview, need: int) -> None:
    """Read bytes ``offset ..`` of ``path`` into ``into`` (aligned, whole blocks, ``offset`` on a boundary), past
    the page cache where the file system allows; at least ``need`` bytes must come (the file may end sooner than
    ``into``, inside its last block)."""
    fd, direct = _open(path, os.O_RDONLY, direct=True)
    try:
        got = 0
        while got < need:
            try:
                n = os.preadv(fd, [into[got:]], offset + got)
            except OSError as exc:
                if not direct or exc.errno != errno.EINVAL:
                    raise
                os.close(fd)
                fd, direct = _open(path, os.O_RDONLY, direct=False)
                continue
            if n <= 0:
                raise OSError(errno.EIO, f"{path}: the file ended at byte {offset + got}, {need - got} bytes short")
            got += n
    finally:
        os.close(fd)


def read_whole(path: Path | str, into: np.ndarray | None = None) -> np.ndarray:
    """The bytes of ``path`` in an aligned uint8 array, read with ``O_DIRECT`` where the file system allows (in
    :data:`READ_STEP` pieces), else through the page cache. ``into``: read into the start of this aligned uint8
    array (at least the file's size) and return that view, instead of a new array."""
    fd, direct = _open(path, os.O_RDONLY, direct=True)
    try:
        size = os.fstat(fd).st_size
        if into is not None and (len(into) < size or into.ctypes.data % ALIGN or into.dtype != np.uint8):
            raise ValueError(f"read_whole: {path} needs an aligned uint8 array of {size} bytes")
        buf = aligned_empty(size) if into is None else into[:size]
        view = memoryview(buf)
        got = 0
        while got < size:
            want = min(READ_STEP, size - got)
            try:
                n = os.preadv(fd, [view[got:got + want]], got)  # direct: aligned, as the writers pad
            except OSError as exc:
                if not direct or exc.errno != errno.EINVAL:
                    raise
                os.close(fd)
                fd, direct = _open(path, os.O_RDONLY, direct=False)
                continue
            if n <= 0:
                raise OSError(errno.EIO, f"{path}: the file ended at byte {got} of {size} while it was read")
            got += n
        return buf
    finally:
        os.close(fd)
