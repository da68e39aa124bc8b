"""The manifest format (a room of core.manifest): what a stage's ``_manifest.json`` holds and how it is read and
verified.

``Manifest`` / ``FileEntry`` (stage, key, parameters, upstream digests, per-file name, bytes and md5), the stage key,
the md5 of files (streaming; the native side-by-side hasher), the schema check of a manifest read from disk (a
damaged one is :class:`~core.errors.ManifestCorrupt`), reading manifests and markers only as plain files
(:func:`read_plain`), outputs only as plain files reached without a link (:func:`output_problem`), and
verification (:func:`verify_manifest`, with the stat records of ``.verified.json``).
"""

from __future__ import annotations

import contextvars
import errno
import hashlib
import json
import logging
import os
import re
import stat
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from core.costs import md5_work
from core.errors import ChecksumError, ManifestCorrupt, ManifestError
from core.manifest.writes import atomic_write_text
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
    with md5_work(os.path.getsize(path)), open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()

_MD5 = NativeModule("core._md5_native", Path(__file__).resolve().parent.parent / "_native", "md5.c", 3, "md5 C core")

def md5_files(paths: Iterable[str | os.PathLike], *, written: bool = False) -> list[str]:
    """md5 hex digests of several files, in order: the same as :func:`md5_file` of each, in less CPU.

    One md5 stream is a chain of dependent steps (~0.7 GB/s on a core, whatever the code), so the C extension
    ``core._md5_native`` hashes the files side by side on one core: 2-3 streams interleaved, or 8/16 as the
    lanes of AVX2/AVX-512VL/AVX-512 vectors (about 3x, 5x, 6x the speed of hashlib in all). Without it (no C compiler,
    ``BERTPIPE_NATIVE=0``) each file goes through :func:`md5_file`.

    ``written=True``: the files are outputs this process has just written and closed, under names no other
    process writes (a stage's files before its manifest lists them). The C core then maps each file of 1 MiB or
    more and hashes its page-cache pages where they lie, instead of copying them into its buffers with read(2):
    ~0.1 CPU-s less a GB (4.7 GB of one group's TFRecords and HDF5s: 1.94-2.10 CPU-s read, 1.44-1.53 mapped).
    Not for inputs: a mapped file that another process cuts short while it is hashed ends this process with
    SIGBUS, where a read gives an error naming the file.

    Raises:
        OSError: a file cannot be read (the exception names it).
    """
    paths = list(paths)
    native = _MD5.load() if len(paths) > 1 else None
    if native is None:
        return [md5_file(p) for p in paths]
    with md5_work(sum(os.path.getsize(p) for p in paths)):
        return native.md5_files([os.fspath(p) for p in paths], mapped=written)

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
