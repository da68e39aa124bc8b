"""Safe writes (a room of core.manifest): temporary names, atomic renames, fsyncs, hashing while writing, the
commit gate of a run, a full disk said in one line, and the fault-injection hooks of the tests.
"""

from __future__ import annotations

import contextvars
import errno
import hashlib
import io
import logging
import os
import re
import signal
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from core.costs import fsync_wait
from core.errors import DiskFullError

log = logging.getLogger(__name__)


#: Set around a call run for a DAG run (tasks.runtoken.entered): called with what is about to start, be committed
#: or deleted; it raises when the run has ended, so a call still running after its run commits nothing.
_COMMIT_GATE: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar("bertpipe_commit_gate",
                                                                                           default=None)

#: True inside core.manifest.deferred_md5: a file closed there is not fsynced at once. Its writeback is started
#: (sync_file_range: the disk writes it while the call goes on), and the block's end fsyncs it with the other
#: files, after their md5s and before any manifest lists it. Same guarantee (on disk before its manifest); the
#: call waits for the disk once, at the end, for what it has not written back yet.
_LATE_FSYNC: contextvars.ContextVar[bool] = contextvars.ContextVar("bertpipe_late_fsync", default=False)
_SYNC_FILE_RANGE: list[Any] = []


def _sync_file_range() -> Any:
    """libc's sync_file_range, or None where there is none."""
    if not _SYNC_FILE_RANGE:
        try:
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            fn = libc.sync_file_range
            fn.argtypes = (ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint)
            _SYNC_FILE_RANGE.append(fn)
        except (OSError, AttributeError):
            _SYNC_FILE_RANGE.append(None)
    return _SYNC_FILE_RANGE[0]


class _Writeback:
    """A thread of this process that starts the writeback of the files handed to it (a duplicate of each fd,
    closed once done). sync_file_range(SYNC_FILE_RANGE_WRITE) waits no I/O, but it submits every dirty page of
    the file, and the block layer's queue (and its writeback throttling) holds the caller back until it can take
    them: ~0.23 s for each 0.5-0.7 GB file here, 0.46 s a part of the fused call's wall (strace: 8 calls,
    1.85 s), with its core idle. On this thread, the call that writes the files goes on meanwhile."""

    def __init__(self) -> None:
        import queue
        import threading

        self.pid = os.getpid()
        self.todo: queue.SimpleQueue[int] = queue.SimpleQueue()
        threading.Thread(target=self._run, name="bertpipe-writeback", daemon=True).start()

    def _run(self) -> None:
        fn = _sync_file_range()
        while True:
            fd = self.todo.get()
            try:
                fn(fd, 0, 0, 2)  # SYNC_FILE_RANGE_WRITE; an error here is not one: the fsync that follows reports it
            finally:
                os.close(fd)


_WRITEBACK: list[_Writeback] = []
#: Files the writeback thread may have waiting (each an open fd); beyond, the caller starts its file's writeback
#: itself (many small files, as the bins' 8,192, never hold more descriptors open than this)
WRITEBACK_PENDING = 32


def start_writeback(fd: int) -> None:
    """Have the kernel start writing ``fd``'s dirty pages to the disk, without waiting for it here (Linux's
    sync_file_range(SYNC_FILE_RANGE_WRITE), called on this process's writeback thread with a duplicate of ``fd``,
    which the caller may close at once; here when :data:`WRITEBACK_PENDING` files wait for that thread already);
    nothing where that call does not exist."""
    fn = _sync_file_range()
    if fn is None:
        return
    if not _WRITEBACK or _WRITEBACK[0].pid != os.getpid():  # none yet, or a forked child's (no thread)
        _WRITEBACK[:] = [_Writeback()]
    wb = _WRITEBACK[0]
    if wb.todo.qsize() >= WRITEBACK_PENDING:
        fn(fd, 0, 0, 2)
        return
    wb.todo.put(os.dup(fd))


def sync_fd(fd: int) -> None:
    """A written file's data to the disk before anything lists it: fsync now, or inside a deferred-md5 block,
    start its writeback and leave the fsync to the block's end (:data:`_LATE_FSYNC`)."""
    if _LATE_FSYNC.get():
        start_writeback(fd)
    else:
        with fsync_wait():
            os.fsync(fd)


@contextmanager
def late_fsyncs() -> Iterator[None]:
    """Files closed inside this block (through :func:`sync_fd`: every HDF5 writer of bertpipe, StageOutput's files)
    have their writeback started, not waited for. The caller fsyncs them before anything lists them:
    :func:`md5_then_fsync` hashes them meanwhile and then waits for the disk once. For a call that writes many
    files one after another (a chop group's shards, a shuffle bucket's, a packer's group): one file's fsync no
    longer waits for the disk before the next is written, and the disk writes while the md5s run."""
    token = _LATE_FSYNC.set(True)
    try:
        yield
    finally:
        _LATE_FSYNC.reset(token)


def md5_buffers(buffers: Sequence[Any]) -> list[str]:
    """md5 hex digests of C-contiguous byte buffers: files a stage built in memory and wrote past the page cache
    (preprocessing.packing.ImageOutputs), hashed side by side as :func:`core.manifest.md5_files` hashes files
    (``core._md5_native``'s lanes), or one by one with hashlib without it."""
    from core.costs import md5_work
    from core.manifest.format import _MD5

    native = _MD5.load() if len(buffers) > 1 else None
    with md5_work(sum(memoryview(b).nbytes for b in buffers)):
        return native.md5_buffers(list(buffers)) if native else [hashlib.md5(b).hexdigest() for b in buffers]


def md5_then_fsync(paths: Iterable[Path | str], known: Mapping[str, str] | None = None) -> list[str]:
    """The md5s of closed files (side by side: core.manifest.md5_files), then their fsyncs (side by side:
    :func:`fsync_paths`): the files written in a :func:`late_fsyncs` block, on the disk when this returns; a
    full disk said in one line naming the file. ``known``: path (``os.fspath``) -> md5 of files already hashed
    (from the bytes the caller wrote: not read again)."""
    from core.manifest.format import md5_files

    paths = list(paths)
    known = known or {}
    todo = [p for p in paths if os.fspath(p) not in known]
    read = dict(zip(map(os.fspath, todo), md5_files(todo, written=True), strict=True))  # hashed in the page cache
    md5s = [known.get(os.fspath(p)) or read[os.fspath(p)] for p in paths]
    try:
        fsync_paths(paths)
    except OSError as exc:
        raise_if_disk_full(exc, Path(exc.filename) if exc.filename else paths[0])
        raise
    return md5s


def fsync_path(path: Path | str) -> None:
    """fsync a closed file by its path (a file system that cannot fsync: nothing to do); an error names the file."""
    with fsync_wait():
        _fsync_path(path)


def _fsync_path(path: Path | str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise OSError(exc.errno, exc.strerror, os.fspath(path)) from exc
    finally:
        os.close(fd)


#: fsyncs in flight at once (fsync_paths): a journaling file system commits concurrent fsyncs together
FSYNC_THREADS = 32


def fsync_paths(paths: Iterable[Path | str]) -> None:
    """:func:`fsync_path` of many closed files, :data:`FSYNC_THREADS` at a time: one after the other, each new
    file's fsync waits for a journal commit of its own (8,192 bin shards of a few rows: 28 s on ext4 here); side by
    side, the file system commits them together and the disk's queue stays full. The first error is raised."""
    paths = list(paths)
    if len(paths) <= 1:
        for p in paths:
            fsync_path(p)
        return
    from concurrent.futures import ThreadPoolExecutor

    with fsync_wait(), ThreadPoolExecutor(min(FSYNC_THREADS, len(paths)), thread_name_prefix="bertpipe-fsync") as pool:
        for fut in [pool.submit(_fsync_path, p) for p in paths]:
            fut.result()


def fsync_dir(path: Path | str) -> None:
    """Flush a directory's entries (renames into it) to the disk; a no-op where the file system cannot."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        with fsync_wait():
            os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)

def _tmp_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp-{os.getpid()}")

def atomic_write_text(path: str | os.PathLike, text: str, *, before_rename=None) -> None:
    """Write a small file atomically (temp name, fsync, rename, fsync dir).

    ``before_rename``: called once the temporary file is complete, just before the rename (fault hook).
    """
    path = Path(path)
    tmp = _tmp_name(path)
    try:
        with open(tmp, "w", encoding="utf-8", newline="") as f:
            f.write(text)
            f.flush()
            with fsync_wait():
                os.fsync(f.fileno())
        if before_rename is not None:
            before_rename()
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        raise_if_disk_full(exc, path)
        raise
    fsync_dir(path.parent)

class HashingWriter(io.RawIOBase):
    """A raw binary file that hashes (md5) and counts every byte written to it."""

    def __init__(self, path: Path, *, hashing: bool = True) -> None:
        super().__init__()
        self._f = open(path, "wb", buffering=0)  # noqa: SIM115 - closed in close()
        self.md5 = hashlib.md5() if hashing else None  # None: hashed later (deferred_md5)
        self.nbytes = 0

    def writable(self) -> bool:
        return True

    def write(self, b) -> int:  # type: ignore[override]
        view = memoryview(b)
        n = self._f.write(view)
        if n is None:
            n = 0
        if self.md5 is not None:
            self.md5.update(view[:n])
        self.nbytes += n
        return n

    def fileno(self) -> int:
        return self._f.fileno()

    def close(self) -> None:
        if not self.closed:
            try:
                self._f.flush()
                sync_fd(self._f.fileno())
            finally:
                self._f.close()
        super().close()

@contextmanager
def commit_gate(check: Callable[[str], None]) -> Iterator[None]:
    """Inside this block, every stage output asks ``check(what)`` before it starts (removing an old manifest), before
    and after it commits its manifest (removing it again when the check fails then), and before files are dropped."""
    token = _COMMIT_GATE.set(check)
    try:
        yield
    finally:
        _COMMIT_GATE.reset(token)

def gate(what: str) -> None:
    """Ask the commit gate of this context (see :func:`commit_gate`); nothing when there is none."""
    check = _COMMIT_GATE.get()
    if check is not None:
        check(what)

# -- fault injection (tests) -------------------------------------------------------------------
FAULT_ENV = "BERTPIPE_FAULT"

#: The points where a stage directory can be killed, in the order a stage reaches them.
FAULT_POINTS = {
    "start": "the stage directory is ready (old manifest and debris removed), nothing written yet",
    "rename": "an output file is complete under its temporary name, not yet renamed into place",
    "file": "an output file was renamed into place and recorded",
    "manifest": "the manifest is written and fsynced under its temporary name, not yet renamed",
    "done": "the manifest was renamed into place (the stage is done; its caller has not returned)",
}

def parse_fault(spec: str) -> tuple[str, str, int, bool]:
    """``STAGE:POINT[:N][:pg]`` -> (stage, point, n, whole process group); ValueError if malformed."""
    parts = spec.strip().split(":")
    if len(parts) < 2 or not parts[0] or parts[1] not in FAULT_POINTS:
        raise ValueError(f"{FAULT_ENV}={spec!r}: expected STAGE:POINT[:N][:pg] with POINT one of "
                         f"{', '.join(FAULT_POINTS)}")
    n, group = 1, False
    for extra in parts[2:]:
        if extra == "pg":
            group = True
        elif extra.isdigit() and int(extra) >= 1:
            n = int(extra)
        else:
            raise ValueError(f"{FAULT_ENV}={spec!r}: {extra!r} is neither a count (1, 2, ...) nor 'pg'")
    return parts[0], parts[1], n, group

def fault_point(spec: str, point: str, n: int, names: Iterable[str]) -> None:
    """Test hook: SIGKILL this process (``pg``: its whole process group) at a named point of a stage.

    ``BERTPIPE_FAULT=STAGE:POINT[:N][:pg]`` kills when a stage directory reaches ``POINT`` (one of
    :data:`FAULT_POINTS`) for the ``N``-th time (default 1; counted per stage directory and process).
    ``STAGE`` is the library stage name (the manifest's ``stage``: text, vocab, create_pretraining_data,
    tfrecord_to_hdf5, split_4bins ...) or a folder name on the stage directory's path (the data DAG's
    ``work/<stage>/<key>``: tfrecord, eval_tfrecord, hdf5, bins ...). ``pg`` kills the process group, as
    ``kill -9 -PGID`` would (start the run in its own session). Used by bench/kill_campaign.py and
    tests/test_faults.py; when the variable is unset nothing happens (one environment lookup per point).
    """
    stage, want, count, group = parse_fault(spec)
    if want != point or count != n or stage not in set(names):
        return
    print(f"bertpipe: {FAULT_ENV}={spec}: SIGKILL at '{point}' ({FAULT_POINTS[point]})", file=sys.stderr, flush=True)
    if group:
        os.killpg(os.getpgid(0), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)  # the signal is delivered at once; never return into the stage

SLOW_ENV = "BERTPIPE_TEST_SLOW"

def slow_point(spec: str, point: str, names: Iterable[str]) -> None:
    """Test hook: ``BERTPIPE_TEST_SLOW=STAGE:POINT:SECONDS`` sleeps that long each time a stage directory of
    ``STAGE`` (as for BERTPIPE_FAULT) reaches ``POINT`` (keeps a run busy while a test stops its servers)."""
    parts = spec.strip().split(":")
    if len(parts) != 3 or parts[1] not in FAULT_POINTS:
        raise ValueError(f"{SLOW_ENV}={spec!r}: expected STAGE:POINT:SECONDS with POINT one of "
                         f"{', '.join(FAULT_POINTS)}")
    if parts[1] == point and parts[0] in set(names):
        time.sleep(float(parts[2]))

_DISK_FULL = {errno.ENOSPC, errno.EFBIG, errno.EDQUOT}

_ERRNO_IN_MESSAGE = re.compile(r"errno = (\d+)")  # how HDF5 reports a failed write(2) in h5py's messages

#: NumPy's short write (np.save, tofile): an OSError without errno, "N requested and M written"
_SHORT_WRITE = re.compile(r"^\d+ requested and \d+ written$")

def disk_full_errno(exc: BaseException | None) -> int | None:
    """ENOSPC / EFBIG / EDQUOT if ``exc`` comes from a full disk, else None.

    Looks at the error's own errno and, for h5py's errors (an OSError, or a RuntimeError when HDF5
    fails again while closing the file), at the ``errno = N`` in its message and at the errors it was
    raised from or while handling.
    """
    seen: set[int] = set()
    while isinstance(exc, (OSError, RuntimeError)) and id(exc) not in seen:
        seen.add(id(exc))
        code = exc.errno if isinstance(exc, OSError) else None
        if code not in _DISK_FULL and (m := _ERRNO_IN_MESSAGE.search(str(exc))):
            code = int(m.group(1))
        if code is None and isinstance(exc, OSError) and _SHORT_WRITE.match(str(exc)):
            code = errno.ENOSPC  # the write(2) under it came back short: the device (or the limit) is full
        if code in _DISK_FULL:
            return code
        exc = exc.__cause__ or exc.__context__
    return None

def raise_if_disk_full(exc: BaseException, path: str | os.PathLike) -> None:
    """Turn ENOSPC / EFBIG / EDQUOT into one clear error naming the file (no manifest is written)."""
    if isinstance(exc, DiskFullError) or (code := disk_full_errno(exc)) is None:
        return
    what = {errno.ENOSPC: "no space left on the device", errno.EFBIG: "the file-size limit was reached",
            errno.EDQUOT: "the disk quota was exceeded"}[code]
    raise DiskFullError(code, f"{what} while writing {path}; the stage was not marked done and its "
                        "partial output was removed. Free space (or raise the limit) and re-run: "
                        "finished stages and shards are kept") from exc
