"""Artifacts and manifests: how every stage writes its outputs and proves they are complete.

Rules (../shared/design/architecture.md, "Artifacts, manifests, caching"):

* outputs are written to temporary names (``.<name>.tmp-<pid>``), md5 computed while writing, then
  renamed into place;
* ``_manifest.json`` is written last, atomically: "done" means the manifest exists and verifies;
  anything in a stage directory without a manifest is debris from an interrupted run;
* a stage checks its inputs against the upstream manifest and refuses a mismatch with an error
  naming the file, the expected and the actual md5;
* what a work dir says never leads outside it: a manifest is checked against its schema before use
  (:func:`schema_problem`; a damaged one is :class:`~core.errors.ManifestCorrupt`), outputs are read only as
  plain files reached without a link (:func:`output_problem`), manifests and markers only as plain files
  (:func:`read_plain`), and deleting (:func:`drop_files`, :func:`begin_redo`, :func:`remove_debris`) stays
  inside the stage folder and never follows a link.

Fault injection (a test hook, a no-op unless ``BERTPIPE_FAULT`` is set): see :func:`fault_point`.

Typical use inside a stage::

    with StageOutput(out_dir, "clean", params=cfg_dict, upstream=[in_manifest]) as out:
        with out.open_text("wiki_00.1") as f:
            f.write(text)
        out.count("articles", 12)
    manifest = out.manifest
"""

from __future__ import annotations

import contextvars
import errno
import hashlib
import io
import json
import logging
import os
import platform
import re
import signal
import stat
import sys
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from core.errors import ChecksumError, DiskFullError, InputError, ManifestCorrupt, ManifestError
from core.native import NativeModule

log = logging.getLogger(__name__)

MANIFEST_NAME = "_manifest.json"
#: Beside a manifest whose files were deleted on purpose (``--keep training``): what went, when. The manifest
#: stays, so downstream keys and checks still hold; the DAG rebuilds the files when something needs them.
DROPPED_NAME = "_dropped.json"
#: Beside the manifest of a work dir's stage: each file's (size, mtime, ctime, inode) when its md5 was last
#: known to hold, so a re-check re-hashes only files whose record changed (any write changes mtime and ctime).
#: Written for stages run by the DAG (:func:`recording_stats`) and renewed by ``verify_manifest(trust_stat=True)``;
#: a standalone command's output folder gets none.
STAT_NAME = ".verified.json"
_RECORD_STATS: contextvars.ContextVar[bool] = contextvars.ContextVar("bertpipe_record_stats", default=False)


@contextmanager
def recording_stats() -> Iterator[None]:
    """Stages written within this block leave :data:`STAT_NAME` beside their manifest."""
    token = _RECORD_STATS.set(True)
    try:
        yield
    finally:
        _RECORD_STATS.reset(token)
MANIFEST_FORMAT = 1
_CHUNK = 1 << 20


def md5_file(path: str | os.PathLike, chunk: int = _CHUNK) -> str:
    """md5 hex digest of a file, read in 1 MiB chunks."""
    h = hashlib.md5()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


_MD5 = NativeModule("core._md5_native", Path(__file__).with_name("_native"), "md5.c", 1, "md5 C core")


def md5_files(paths: Iterable[str | os.PathLike]) -> list[str]:
    """md5 hex digests of several files, in order: the same as :func:`md5_file` of each, in less CPU.

    One md5 stream is a chain of dependent steps (~0.7 GB/s on a core, whatever the code), so the C extension
    ``core._md5_native`` hashes the files side by side on one core: 2-3 streams interleaved, or 8/16 as the
    lanes of AVX2/AVX-512 vectors (about 4x, 6x the speed of hashlib in all). Without it (no C compiler,
    ``BERTPIPE_NATIVE=0``) each file goes through :func:`md5_file`.

    Raises:
        OSError: a file cannot be read (the exception names it).
    """
    paths = list(paths)
    native = _MD5.load() if len(paths) > 1 else None
    if native is None:
        return [md5_file(p) for p in paths]
    return native.md5_files([os.fspath(p) for p in paths])


def canonical_json(obj: Any) -> str:
    """JSON with sorted keys and no whitespace: the form every digest is computed over."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)


def stage_key(stage: str, code_version: str, params: dict[str, Any], upstream: Iterable[str] = ()) -> str:
    """The content key of a stage run: same stage code, parameters and upstream content -> same key.

    This names the stage's output directory (``work/<stage>/<key>``) and is Prefect's cache key.
    """
    payload = canonical_json({"stage": stage, "v": code_version, "params": params, "up": sorted(upstream)})
    return hashlib.md5(payload.encode()).hexdigest()[:16]


@dataclass(frozen=True)
class FileEntry:
    name: str  # path relative to the stage directory, '/'-separated
    bytes: int
    md5: str


@dataclass
class Manifest:
    stage: str
    key: str = ""
    code_version: str = "1"
    params: dict[str, Any] = field(default_factory=dict)
    upstream: dict[str, str] = field(default_factory=dict)  # upstream stage/shard -> its manifest digest
    files: list[FileEntry] = field(default_factory=list)
    counters: dict[str, Any] = field(default_factory=dict)
    seconds: float = 0.0
    versions: dict[str, str] = field(default_factory=dict)
    format: int = MANIFEST_FORMAT

    @property
    def digest(self) -> str:
        """md5 over what the outputs *are* (stage, key, files): stable across re-runs, unlike timings."""
        files = [[f.name, f.bytes, f.md5] for f in sorted(self.files, key=lambda e: e.name)]
        return hashlib.md5(canonical_json({"stage": self.stage, "key": self.key, "files": files}).encode()).hexdigest()

    def file(self, name: str) -> FileEntry:
        for f in self.files:
            if f.name == name:
                return f
        raise KeyError(f"{name!r} is not in the {self.stage} manifest")

    def to_json(self) -> str:
        d = asdict(self)
        d["digest"] = self.digest
        return json.dumps(d, indent=1, sort_keys=True, ensure_ascii=False, default=str) + "\n"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Manifest:
        """A manifest from its JSON form, checked against the schema first (:func:`schema_problem`).

        Raises:
            ValueError: it does not fit the schema, or its ``digest`` is not that of its stage, key and files.
        """
        why = schema_problem(d)
        if why:
            raise ValueError(why)
        d = dict(d)
        digest = d.pop("digest", None)
        d["files"] = [FileEntry(**f) for f in d["files"]]
        m = cls(**d)
        if digest is not None and digest != m.digest:
            raise ValueError(f"its digest {digest} is not that of its stage, key and files ({m.digest}): edited "
                             "after it was written")
        return m


#: Names bertpipe keeps beside a stage's files: never an output, never listed in a manifest.
RESERVED_NAMES = frozenset({"_manifest.json", "_dropped.json", ".verified.json"})
_MD5_HEX = re.compile(r"^[0-9a-f]{32}$")
_TMP_NAME = re.compile(r"^\..+\.tmp-\d+$")
#: key -> (type, required) of a manifest's JSON form (``digest`` is written by :meth:`Manifest.to_json`)
_SCHEMA: dict[str, tuple[type | tuple[type, ...], bool]] = {
    "stage": (str, True), "key": (str, True), "files": (list, True), "code_version": (str, False),
    "params": (dict, False), "upstream": (dict, False), "counters": (dict, False), "seconds": ((int, float), False),
    "versions": (dict, False), "format": (int, False), "digest": (str, False)}


def name_problem(name: Any) -> str:
    """Why ``name`` cannot be a file entry of a manifest ("" when it can): it must be a relative,
    '/'-separated path inside its stage folder - no absolute path, no '.', '..' or empty component, no
    backslash, drive letter or control character, not a name bertpipe keeps for itself or a temporary name."""
    if not isinstance(name, str):
        return f"a file name is a {type(name).__name__}, not a string"
    if not name:
        return "a file name is empty"
    shown = repr(name) if len(name) <= 120 else repr(name[:120] + "...")
    if name.startswith("/"):
        return f"file name {shown} is an absolute path"
    if "\\" in name:
        return f"file name {shown} holds a backslash"
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return f"file name {shown} holds a control character"
    if re.match(r"^[A-Za-z]:", name):
        return f"file name {shown} starts with a drive letter"
    parts = name.split("/")
    if any(p in ("", ".", "..") for p in parts):
        return f"file name {shown} has an empty, '.' or '..' component (it must stay inside its stage folder)"
    if parts[-1] in RESERVED_NAMES or _TMP_NAME.match(parts[-1]):
        return f"file name {shown} is one bertpipe keeps for itself (a manifest, a marker or a temporary file)"
    return ""


def schema_problem(d: Any) -> str:
    """Why ``d`` is not the JSON form of a :class:`Manifest` ("" when it is): keys and their types, every file
    entry ``{name, bytes, md5}`` (:func:`name_problem`; bytes an int >= 0; md5 32 lowercase hex digits), and at
    least one file: every stage writes one, so a missing or empty ``files`` list is a damaged manifest."""
    if not isinstance(d, dict):
        return f"it is a JSON {type(d).__name__}, not an object"
    for k in d:
        if k not in _SCHEMA:
            return f"unknown key {str(k)[:40]!r}"
    for k, (typ, required) in _SCHEMA.items():
        if k not in d:
            if required:
                return f"no {k!r} key"
            continue
        v = d[k]
        if not isinstance(v, typ) or isinstance(v, bool):
            return f"{k!r} is a {type(v).__name__}"
    if not d["stage"]:
        return "'stage' is empty"
    if d.get("format", MANIFEST_FORMAT) != MANIFEST_FORMAT:
        return f"format {d['format']} (this bertpipe reads format {MANIFEST_FORMAT})"
    for k in ("upstream", "versions"):
        if any(not isinstance(a, str) or not isinstance(b, str) for a, b in d.get(k, {}).items()):
            return f"{k!r} maps a name to something other than a string"
    files = d["files"]
    if not files:
        return "its 'files' list is empty (every stage writes at least one file)"
    seen: set[str] = set()
    for i, f in enumerate(files):
        if not isinstance(f, dict) or set(f) != {"name", "bytes", "md5"}:
            return f"file entry {i} is not an object with exactly name, bytes and md5"
        why = name_problem(f["name"])
        if why:
            return why
        if not isinstance(f["bytes"], int) or isinstance(f["bytes"], bool) or f["bytes"] < 0:
            return f"file {f['name']!r}: bytes {f['bytes']!r} is not an integer >= 0"
        if not isinstance(f["md5"], str) or not _MD5_HEX.match(f["md5"]):
            return f"file {f['name']!r}: md5 {str(f['md5'])[:40]!r} is not 32 lowercase hex digits"
        if f["name"] in seen:
            return f"file {f['name']!r} is listed twice"
        seen.add(f["name"])
    return ""


def fsync_dir(path: Path | str) -> None:
    """Flush a directory's entries (renames into it) to the disk; a no-op where the file system cannot."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
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
                os.fsync(self._f.fileno())
            finally:
                self._f.close()
        super().close()


#: Set around a call run for a DAG run (tasks.runtoken.entered): called with what is about to start, be committed
#: or deleted; it raises when the run has ended, so a call still running after its run commits nothing.
_COMMIT_GATE: contextvars.ContextVar[Callable[[str], None] | None] = contextvars.ContextVar("bertpipe_commit_gate",
                                                                                           default=None)


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


_DEFERRED: contextvars.ContextVar[list[StageOutput] | None] = contextvars.ContextVar("bertpipe_deferred_md5",
                                                                                     default=None)


@contextmanager
def deferred_md5() -> Iterator[None]:
    """Stage outputs that finish inside this block take their files' md5s when it ends, all in one
    :func:`md5_files` call (side by side on this core), and write their manifests then, in the order they
    finished, each still last in its directory.

    For one call that writes several stages' files (the DAG's fused tfrecord+hdf5 call: a 500 MB TFRecord and a
    700 MB HDF5 hash in about 0.75x the time one after the other). A later output of the block whose upstream is
    an earlier one (``upstream=[that manifest]``) gets that manifest's final digest, and its key is derived from
    it, as if the two had run one after the other. If the block raises, no manifest is written: the files are
    debris of an unfinished stage and are redone.
    """
    pending: list[StageOutput] = []
    token = _DEFERRED.set(pending)
    try:
        yield
    finally:
        _DEFERRED.reset(token)
    todo = [(out, e) for out in pending for e in out.manifest.files if not e.md5]
    for (out, e), md5 in zip(todo, md5_files([out.path(e.name) for out, e in todo]), strict=True):
        out._entries[e.name] = FileEntry(e.name, e.bytes, md5)
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


def check_inside(path: str | os.PathLike, root: str | os.PathLike) -> None:
    """Refuse ``path`` if it (through symlinks) resolves outside ``root`` (e.g. a symlinked output
    folder that would make a stage write outside the work dir)."""
    real, real_root = Path(path).resolve(), Path(root).resolve()
    if not real.is_relative_to(real_root):
        raise InputError(f"refusing to write to {path}: it resolves to {real}, outside the work dir {root} "
                         "(a symlink?). Remove the link or choose another --work-dir")


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


def remove_debris(directory: Path) -> None:
    """Delete temporary files left by killed writers (``.<name>.tmp-<pid>``) under ``directory``.

    Symbolic links to folders are not followed (a link of that name is unlinked itself, never its target)."""
    for dirpath, _dirs, files in os.walk(directory):  # os.walk does not descend into linked folders
        for n in files:
            if _TMP_NAME.match(n):
                p = os.path.join(dirpath, n)
                try:
                    if stat.S_ISREG(os.lstat(p).st_mode) or os.path.islink(p):
                        os.unlink(p)
                except FileNotFoundError:
                    pass


def outside(path: str | os.PathLike, root: str | os.PathLike) -> str:
    """Where ``path`` resolves, when that is outside ``root`` ("" when inside): a stage folder that is (or lies
    under) a symbolic link leading out of the work dir."""
    real = Path(path).resolve()
    return "" if real.is_relative_to(Path(root).resolve()) else str(real)


def output_problem(directory: str | os.PathLike, name: str) -> tuple[Path, str]:
    """(the path, why it is not an output) for ``directory/name`` ("" when it is a plain file): every component
    below ``directory`` is looked at without following links, so an output is never read (nor deleted)
    through a symbolic link or outside its stage folder. ``name`` must pass :func:`name_problem`."""
    p = Path(directory)
    parts = name.split("/")
    for i, part in enumerate(parts):
        p = p / part
        try:
            st = os.lstat(p)
        except (FileNotFoundError, NotADirectoryError):
            return p, "missing"
        except OSError as exc:
            return p, f"cannot be looked at ({exc.strerror})"
        if stat.S_ISLNK(st.st_mode):
            try:
                target = os.readlink(p)
            except OSError:
                target = "?"
            return p, f"a symbolic link (to {target}); outputs are plain files, never read through a link"
        if i < len(parts) - 1 and not stat.S_ISDIR(st.st_mode):
            return p, "missing"  # a file where a folder of the path belongs
    if stat.S_ISDIR(st.st_mode):
        return p, "a folder where an output file belongs"
    if not stat.S_ISREG(st.st_mode):
        return p, "not a plain file"
    return p, ""


def clear_links(directory: str | os.PathLike) -> list[str]:
    """Before a stage (or shard) folder is written: unlink every symbolic link, and every entry that is neither a
    plain file nor a folder (a FIFO, a socket, a device), anywhere under ``directory``, never following one.

    bertpipe writes only plain files and folders in a stage folder, so such an entry was planted (or left by
    another tool), and a stage that opened, listed, replaced or removed a file through it would reach outside the
    work dir. Called before the first byte of a redo, so that every later write resolves inside the folder; the
    folder itself must already be known to resolve inside the work dir (:func:`check_inside`). Returns the
    removed entries, relative to ``directory``."""
    top = Path(directory)
    removed: list[str] = []
    try:
        if not stat.S_ISDIR(os.lstat(top).st_mode):
            return removed
    except OSError:
        return removed
    for dirpath, dirnames, filenames in os.walk(top):  # never descends into a linked folder
        base = Path(dirpath)
        for n in list(dirnames) + filenames:
            p = base / n
            try:
                mode = os.lstat(p).st_mode
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(mode) or stat.S_ISREG(mode):
                continue
            p.unlink(missing_ok=True)  # the entry itself (a link is never followed)
            removed.append(p.relative_to(top).as_posix())
            if n in dirnames:
                dirnames.remove(n)
    if removed:
        log.warning("%s: removed %d entr%s bertpipe never writes in a stage folder (%s%s): a link there could "
                    "make this stage write outside the work dir", top, len(removed), "y" if len(removed) == 1
                    else "ies", ", ".join(removed[:3]), ", ..." if len(removed) > 3 else "")
    return removed


def remove_entry(directory: str | os.PathLike, name: str) -> bool:
    """Remove what sits at ``directory/name`` - a file, a symbolic link (unlinked itself, never followed) or a
    folder (with what it holds; links inside are unlinked, not followed) - only when every folder on the way
    is a real folder inside ``directory``; True when something was removed."""
    import shutil

    if name_problem(name) and name not in RESERVED_NAMES:
        return False
    p = Path(directory)
    parts = name.split("/")
    for part in parts[:-1]:
        p = p / part
        try:
            if not stat.S_ISDIR(os.lstat(p).st_mode):
                return False
        except OSError:
            return False
    p = p / parts[-1]
    try:
        st = os.lstat(p)
    except OSError:
        return False
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(p)  # fd-based on Linux: never follows a link inside
    else:
        p.unlink()
    return True


def begin_redo(directory: str | os.PathLike, manifest_name: str = MANIFEST_NAME) -> None:
    """Before a stage (or shard) directory is written again: the old manifest and drop record go, with the
    debris of killed writers, and whatever its old manifest listed that is no plain file - a symbolic link or a
    folder put where an output belongs, or a link where one of its folders belongs - is removed (links
    unlinked, never followed), so the new outputs are written inside the stage folder."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    try:
        old = load_manifest(d, manifest_name)
    except ManifestError:
        old = None
    for f in old.files if old is not None else ():
        p, why = output_problem(d, f.name)
        if why and why != "missing":
            remove_entry(d, p.relative_to(d).as_posix())
    if "/" in manifest_name:  # kept beside the stage folder (a standalone split-4bins): the caller's own name
        (d / manifest_name).unlink(missing_ok=True)
    else:
        remove_entry(d, manifest_name)
    remove_entry(d, DROPPED_NAME)
    remove_debris(d)


def _versions() -> dict[str, str]:
    from core import __version__

    return {"bertpipe": __version__, "python": platform.python_version()}


# -- reading and verifying ---------------------------------------------------------------------
def read_plain(path: str | os.PathLike, what: str = "file") -> str | None:
    """The UTF-8 text of a small bookkeeping file bertpipe wrote (a manifest, a marker), None when absent.

    Only a plain file is read: a symbolic link there is not followed (it could lead out of the work dir), and
    a FIFO or a folder is refused without blocking. Raises ManifestCorrupt naming the file otherwise."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        why = "a symbolic link, which is never followed" if exc.errno == errno.ELOOP else exc.strerror
        raise ManifestCorrupt(f"{p} is corrupt ({why}); not trusted: the next run redoes that {what}") from None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ManifestCorrupt(f"{p} is corrupt (not a plain file); not trusted: the next run redoes that {what}")
        data = f.read()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise ManifestCorrupt(f"{p} is corrupt (not UTF-8 text); not trusted: the next run redoes that "
                              f"{what}") from None


def load_manifest(directory: str | os.PathLike, name: str = MANIFEST_NAME) -> Manifest | None:
    """The manifest of a stage directory, or None when there is none (not done).

    Raises:
        ManifestCorrupt: it is not a manifest bertpipe wrote (:func:`schema_problem`: unparseable, a key missing
            or of the wrong type, no files, a file entry that leaves the stage folder, a digest that does not
            match); one line naming it. Nothing it lists is read.
    """
    p = Path(directory) / name
    text = read_plain(p, "stage")
    if text is None:
        return None
    try:
        return Manifest.from_dict(json.loads(text))
    except (ValueError, TypeError, RecursionError) as exc:
        why = f"not JSON: {exc}" if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise ManifestCorrupt(f"{p} is corrupt ({why}); not trusted: the next run redoes that stage") from None


def _stat_key(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


def read_stat_records(directory: Path) -> dict[str, list]:
    """:data:`STAT_NAME` of a stage directory: file name -> [size, mtime_ns, ctime_ns, inode, md5]; records of
    any other shape (a planted or damaged file) are left out, so those files are hashed."""
    try:
        data = json.loads(read_plain(Path(directory) / STAT_NAME) or "{}")
    except (ManifestError, ValueError, RecursionError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {n: r for n, r in data.items() if not name_problem(n) and isinstance(r, list) and len(r) == 5
            and all(isinstance(x, int) and not isinstance(x, bool) for x in r[:4])
            and isinstance(r[4], str) and _MD5_HEX.match(r[4])}


def write_stat_records(directory: Path, md5s: dict[str, str]) -> None:
    """Record each file's stat with the md5 it is known to have (best effort: a read-only dir keeps none)."""
    try:
        records = {n: [*_stat_key(directory / n), md5] for n, md5 in md5s.items()}
        atomic_write_text(directory / STAT_NAME, json.dumps(records, sort_keys=True) + "\n")
    except OSError:
        pass


def verify_manifest(
    directory: str | os.PathLike, name: str = MANIFEST_NAME, *, check_md5: bool = True, trust_stat: bool = False,
    root: str | os.PathLike | None = None,
) -> Manifest:
    """Load and check a stage directory: every file present, a plain file inside it (no symbolic link on the way:
    :func:`output_problem`), of the recorded size and md5.

    ``trust_stat``: a file whose size, mtime, ctime and inode are those recorded when its md5 was last
    known (:data:`STAT_NAME`) is not re-hashed; the others are, and the records are renewed when they hold.

    ``root`` (the work dir): a directory resolving outside it is refused before anything in it is read.

    Raises ManifestError (missing manifest/file, wrong size, a directory outside ``root``; ManifestCorrupt for a
    damaged manifest) or ChecksumError (md5 differs).
    """
    directory = Path(directory)
    if root is not None and (real := outside(directory, root)):
        raise ManifestError(f"{directory} resolves to {real}, outside the work dir {root} (a symbolic link?); "
                            "nothing in it is read")
    m = load_manifest(directory, name)
    if m is None:
        raise ManifestError(f"{directory / name} not found: the stage has not completed (run it first)")
    records = read_stat_records(directory) if check_md5 and trust_stat else {}
    checks = []
    for f in m.files:
        path, why = output_problem(directory, f.name)
        if why and why != "missing":
            raise ManifestError(f"{path} is {why} (listed in {directory / name}); the next run redoes the stage")
        path = directory / f.name
        rec = records.get(f.name)
        known = False
        if rec is not None and rec[-1] == f.md5:
            try:
                known = _stat_key(path) == rec[:-1]
            except OSError:
                known = False
        checks.append(FileCheck(path, f.md5, f.bytes, check_md5 and not known, f"listed in {directory / name}"))
    verify_files(checks)
    rehashed = any(c.check_md5 for c in checks)
    if rehashed and trust_stat:
        write_stat_records(directory, {f.name: f.md5 for f in m.files})
    return m


def verify_file(path: str | os.PathLike, md5: str, size: int | None = None, *, check_md5: bool = True,
                what: str = "") -> None:
    """Check one file against an expected size and md5; errors name the file and both values."""
    path = Path(path)
    hint = f" ({what})" if what else ""
    try:
        st = path.stat()
    except (FileNotFoundError, NotADirectoryError):
        raise ManifestError(f"{path} is missing{hint}; re-run the stage that produces it") from None
    if size is not None and st.st_size != size:
        raise ManifestError(f"{path} has {st.st_size} bytes, expected {size}{hint}; re-run the stage that produces it")
    if check_md5:
        _compare(path, md5, md5_file(path), what)


def _compare(path: Path, md5: str, actual: str, what: str) -> None:
    if actual != md5:
        hint = f" ({what})" if what else ""
        raise ChecksumError(path, md5, actual, hint=f"The file changed since it was written{hint}; "
                            "re-run the stage that produces it")


@dataclass(frozen=True)
class FileCheck:
    """One file for :func:`verify_files`: expected md5 and size, whether to hash it, and how errors name it."""

    path: Path
    md5: str
    size: int | None
    check_md5: bool = True
    what: str = ""


def verify_files(checks: Iterable[FileCheck]) -> None:
    """:func:`verify_file` over many files: every presence and size first, then the md5s that are due, hashed
    side by side (:func:`md5_files`); the first file that fails raises, as verify_file would."""
    checks = list(checks)
    for c in checks:
        verify_file(c.path, c.md5, c.size, check_md5=False, what=c.what)
    due = [c for c in checks if c.check_md5]
    for c, actual in zip(due, md5_files([c.path for c in due]), strict=True):
        _compare(Path(c.path), c.md5, actual, c.what)


def is_done(directory: str | os.PathLike, name: str = MANIFEST_NAME, *, check_md5: bool = True,
            trust_stat: bool = False) -> Manifest | None:
    """The verified manifest if the stage directory is complete and intact, else None."""
    try:
        return verify_manifest(directory, name, check_md5=check_md5, trust_stat=trust_stat)
    except (ManifestError, ChecksumError):
        return None


# -- dropping a stage's files (the disk budget) ----------------------------------------------------------
#: format of :data:`DROPPED_NAME`; a record of another format (an older bertpipe's) is not trusted
DROPPED_FORMAT = 2


def _drop_files_list(m: Manifest) -> list[list[Any]]:
    return [[f.name, f.bytes, f.md5] for f in sorted(m.files, key=lambda e: e.name)]


def dropped_info(directory: str | os.PathLike, manifest: Manifest | None = None) -> dict[str, Any] | None:
    """What :func:`drop_files` recorded for a stage directory, or None when its files are (meant to be) there.

    A record counts only when it names the very files its manifest lists (names, sizes, md5s) and that
    manifest's digest: a planted, damaged or older-format ``_dropped.json`` is ignored, and the files are
    checked as usual. ``manifest``: the directory's manifest, when the caller has it loaded already.
    """
    directory = Path(directory)
    try:
        m = manifest if manifest is not None else load_manifest(directory)
        text = read_plain(directory / DROPPED_NAME)
        info = json.loads(text) if text is not None else None
    except (ManifestError, ValueError, RecursionError):
        return None
    if m is None or not isinstance(info, dict) or info.get("format") != DROPPED_FORMAT:
        return None
    if info.get("manifest") != m.digest or info.get("files") != _drop_files_list(m):
        return None
    return info


def drop_files(directory: str | os.PathLike, why: str, root: str | os.PathLike | None = None) -> int:
    """Delete the files a stage directory's manifest lists, keep the manifest, record it; returns bytes freed.

    The record (:data:`DROPPED_NAME`, written first) names each file with its size and md5 and the manifest's
    digest. Only plain files and links (unlinked, never followed) are removed, and only inside the stage
    folder: a stage folder resolving outside ``root`` (the work dir), or an entry reached through a link or a
    non-folder, makes it refuse (ManifestError) before anything is deleted.
    """
    directory = Path(directory)
    if root is not None and (real := outside(directory, root)):
        raise ManifestError(f"refusing to delete the files of {directory}: it resolves to {real}, outside the work "
                            f"dir {root} (a symbolic link?); nothing was deleted. Remove the link")
    m = load_manifest(directory)
    if m is None or dropped_info(directory, m) is not None:
        return 0
    gate(f"the drop of {directory}")
    for f in m.files:
        p, problem = output_problem(directory, f.name)
        if problem and problem != "missing" and p != directory / f.name:  # a link or a file on the way there
            raise ManifestError(f"refusing to delete {directory / f.name}: {p} is {problem}; nothing was deleted")
    info = {"format": DROPPED_FORMAT, "manifest": m.digest, "files": _drop_files_list(m),
            "bytes": sum(f.bytes for f in m.files), "why": why, "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    remove_entry(directory, DROPPED_NAME)  # an old record of another form (or a folder of that name)
    atomic_write_text(directory / DROPPED_NAME, json.dumps(info, sort_keys=True) + "\n")  # first: a kill leaves
    for f in m.files:  # a marked dir with some files still there, which reads as dropped (rebuilt when needed)
        p = directory / f.name
        try:
            if not stat.S_ISDIR(os.lstat(p).st_mode):  # a plain file, or a link (the link itself goes)
                p.unlink()
        except FileNotFoundError:
            pass
    remove_entry(directory, STAT_NAME)
    return info["bytes"]
