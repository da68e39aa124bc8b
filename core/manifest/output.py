"""The stage writer (a room of core.manifest): :class:`StageOutput` owns a stage (or shard) directory while the
stage writes into it (temporary names, md5 while writing, the manifest last), and :func:`deferred_md5` batches the
md5s of many small stages.
"""

from __future__ import annotations

import contextvars
import io
import logging
import os
import platform
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from core.errors import InputError
from core.manifest.format import (
    _CHUNK,
    _RECORD_STATS,
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    md5_file,
    md5_files,
    name_problem,
    stage_key,
    write_stat_records,
)
from core.manifest.guards import begin_redo, check_inside, remove_debris, remove_entry
from core.manifest.writes import (
    _LATE_FSYNC,
    FAULT_ENV,
    SLOW_ENV,
    HashingWriter,
    _tmp_name,
    atomic_write_text,
    fault_point,
    fsync_paths,
    gate,
    raise_if_disk_full,
    slow_point,
)

log = logging.getLogger(__name__)


def _versions() -> dict[str, str]:
    from core import __version__

    return {"bertpipe": __version__, "python": platform.python_version()}

_DEFERRED: contextvars.ContextVar[list[StageOutput] | None] = contextvars.ContextVar("bertpipe_deferred_md5",
                                                                                     default=None)

@contextmanager
def deferred_md5() -> Iterator[None]:
    """Stage outputs that finish inside this block take their files' md5s when it ends, all in one
    :func:`md5_files` call (side by side on this core), and write their manifests then, in the order they
    finished, each still last in its directory.

    For one call that writes several stages' files (the DAG's fused tfrecord+hdf5 call: a 500 MB TFRecord and a
    700 MB HDF5 hash in about 0.75x the time one after the other), and for several such calls in one process
    (tasks.calls.execute_group: 4 parts' 8 files hash in 8 vector lanes, 2.5-3x the speed of one part's 2). A
    block inside another joins it (its outputs wait for the outer block's end). A later output of the block whose
    upstream is an earlier one (``upstream=[that manifest]``) gets that manifest's final digest, and its key is
    derived from it, as if the two had run one after the other. If the block raises, no manifest is written:
    the files are debris of an unfinished stage and are redone (a caller that wants the outputs finished before
    the error kept them: :func:`flush_deferred`, then raise).
    """
    if _DEFERRED.get() is not None:  # inside an outer block: its end takes these md5s too
        yield
        return
    pending: list[StageOutput] = []
    token, late = _DEFERRED.set(pending), _LATE_FSYNC.set(True)
    try:
        yield
    finally:
        _LATE_FSYNC.reset(late)
        _DEFERRED.reset(token)
    _finish_deferred(pending)


def flush_deferred() -> None:
    """Inside a :func:`deferred_md5` block: take the md5s and write the manifests of the outputs finished so far,
    now (a stage that reads them is about to run, or the caller stops at an error). Outside one: nothing."""
    pending = _DEFERRED.get()
    if pending:
        done = list(pending)
        pending.clear()
        _finish_deferred(done)


def _finish_deferred(pending: list[StageOutput]) -> None:
    todo = [(out, e) for out in pending for e in out.manifest.files if not e.md5]
    for (out, e), md5 in zip(todo, md5_files([out.path(e.name) for out, e in todo], written=True), strict=True):
        out._entries[e.name] = FileEntry(e.name, e.bytes, md5)
    # their writeback started when each was closed (sync_fd); wait for the rest before a manifest lists them
    files = [out.path(e.name) for out in pending for e in out.manifest.files]
    try:
        fsync_paths(files)
    except OSError as exc:
        raise_if_disk_full(exc, Path(exc.filename) if exc.filename else files[0])
        raise
    digests: dict[str, str] = {}
    for out in pending:
        m = out.manifest
        m.files = sorted(out._entries.values(), key=lambda f: f.name)
        if any(ref in digests for ref in m.upstream):
            m.upstream = {ref: digests.get(ref, d) for ref, d in m.upstream.items()}
            if not out._key_given:
                m.key = stage_key(m.stage, m.code_version, m.params, m.upstream.values())
        out._write_manifest()
        digests[f"{m.stage}:{m.key}"] = m.digest


class StageOutput:
    """Context manager that owns one stage (or shard) directory while a stage writes into it.

    On enter: creates the directory, removes a previous manifest (the stage is being redone) and
    debris from killed runs. Files opened with :meth:`open` / :meth:`open_text` go to temporary names
    and are renamed when closed, their md5 computed while writing. On a clean exit the manifest is
    written last, atomically. On an exception no manifest is written and temporary files are removed.
    """

    def __init__(
        self,
        out_dir: str | os.PathLike,
        stage: str,
        *,
        params: dict[str, Any] | None = None,
        upstream: Iterable[Manifest] | dict[str, str] = (),
        code_version: str = "1",
        key: str | None = None,
        manifest_name: str = MANIFEST_NAME,
        root: str | os.PathLike | None = None,  # the work dir: out_dir must resolve inside it
    ) -> None:
        self.dir = Path(out_dir)
        self.root = Path(root) if root is not None else None
        self.manifest_name = manifest_name
        up = upstream if isinstance(upstream, dict) else {f"{m.stage}:{m.key}": m.digest for m in upstream}
        params = dict(params or {})
        self.manifest = Manifest(
            stage=stage,
            key=key or stage_key(stage, code_version, params, up.values()),
            code_version=code_version,
            params=params,
            upstream=dict(up),
        )
        self._key_given = key is not None
        self._entries: dict[str, FileEntry] = {}
        self._t0 = 0.0
        self._faults: dict[str, int] = {}  # fault point -> times reached (BERTPIPE_FAULT)

    # -- lifecycle -----------------------------------------------------------------------------
    def __enter__(self) -> StageOutput:
        if self.root is not None:
            check_inside(self.dir, self.root)
        gate(str(self.dir))
        begin_redo(self.dir, self.manifest_name)
        self._t0 = time.perf_counter()
        self.fault("start")
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            remove_debris(self.dir)
            return
        m = self.manifest
        m.files = sorted(self._entries.values(), key=lambda e: e.name)
        m.seconds = round(time.perf_counter() - self._t0, 3)
        m.versions = _versions()
        deferred = _DEFERRED.get()
        if deferred is not None and (deferred or any(not f.md5 for f in m.files)):
            deferred.append(self)  # md5s and manifest when the deferred_md5 block ends (after those before it)
            return
        self._write_manifest()

    def _write_manifest(self) -> None:
        m = self.manifest
        if _RECORD_STATS.get():
            write_stat_records(self.dir, {f.name: f.md5 for f in m.files})
        gate(str(self.dir / self.manifest_name))
        atomic_write_text(self.dir / self.manifest_name, m.to_json(), before_rename=lambda: self.fault("manifest"))
        try:
            gate(str(self.dir / self.manifest_name))  # the run may have ended during the write: take it back
        except BaseException:
            (self.dir / self.manifest_name).unlink(missing_ok=True)
            raise
        self.fault("done")

    def fault(self, point: str) -> None:
        """Fault-injection point ``point`` of this stage directory (see :func:`fault_point`)."""
        spec = os.environ.get(FAULT_ENV)
        if spec:
            self._faults[point] = n = self._faults.get(point, 0) + 1
            fault_point(spec, point, n, {self.manifest.stage, *self.dir.parts})
        if os.environ.get(SLOW_ENV):
            slow_point(os.environ[SLOW_ENV], point, {self.manifest.stage, *self.dir.parts})

    # -- writing -------------------------------------------------------------------------------
    @contextmanager
    def open(self, name: str) -> Iterator[io.BufferedWriter]:
        """Open ``name`` (relative to the stage dir) for binary writing via a temporary name."""
        final = self.path(name)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = _tmp_name(final)
        raw = HashingWriter(tmp, hashing=_DEFERRED.get() is None)
        buf = io.BufferedWriter(raw, buffer_size=_CHUNK)
        try:
            yield buf
            buf.flush()
            buf.close()
        except BaseException as exc:
            try:
                buf.close()
            except OSError:
                pass  # the buffer could not be flushed (disk full): the temp file is dropped anyway
            tmp.unlink(missing_ok=True)
            raise_if_disk_full(exc, final)
            raise
        self.fault("rename")
        if os.path.isdir(final) and not os.path.islink(final):
            remove_entry(self.dir, name)  # a folder where the output belongs (inside the stage folder)
        os.replace(tmp, final)  # a symbolic link there is replaced itself, never followed
        self._entries[name] = FileEntry(name, raw.nbytes, raw.md5.hexdigest() if raw.md5 is not None else "")
        self.fault("file")

    @contextmanager
    def open_text(self, name: str) -> Iterator[io.TextIOWrapper]:
        """Open ``name`` for UTF-8 text writing, newlines written exactly as given."""
        with self.open(name) as b:
            t = io.TextIOWrapper(b, encoding="utf-8", newline="", write_through=False)
            try:
                yield t
                t.flush()
            finally:
                t.detach()

    def add_file(self, name: str, md5: str | None = None) -> FileEntry:
        """Record a file that was already written (atomically) into the stage dir by other means."""
        p = self.path(name)
        entry = FileEntry(name, p.stat().st_size, md5 or ("" if _DEFERRED.get() is not None else md5_file(p)))
        self._entries[name] = entry
        self.fault("file")
        return entry

    def path(self, name: str) -> Path:
        """``name`` in the stage directory; InputError when it is no name of an output (``..``, absolute, a
        reserved name: :func:`name_problem`) or its folder resolves outside the stage directory."""
        why = name_problem(name)
        p = (self.dir / name).parent.resolve() if not why else None
        if why or not p.is_relative_to(self.dir.resolve()):
            raise InputError(f"refusing to write {name!r} in {self.dir}: "
                             f"{why or f'its folder resolves to {p}, outside the stage folder (a symlink?)'}")
        return self.dir / name

    def count(self, name: str, n: int | float = 1) -> None:
        self.manifest.counters[name] = self.manifest.counters.get(name, 0) + n
