"""Stage 2, extract, with the extractor MLPerf pins: attardi/wikiextractor @ 3162bb6c, ``WikiExtractor.py``.

MLPerf's BERT data notes run ``python WikiExtractor.py <dump> -o text`` at that commit (2019-04-13). The script is
GPL-3.0, so bertpipe does not ship it: it is a pinned dependency, fetched once per user from its commit's URL
(:data:`SCRIPT_URL`) into ``~/.cache/bertpipe/`` (``$XDG_CACHE_HOME``) or given as a file
(``--extractor-script PATH``), and checked against :data:`SCRIPT_SHA256` before use. Nothing of its code is in
this project; this module only loads it and drives its own functions.

**Compatibility layer.** The script is executed from its bytes as a fresh module whose ``import`` of

* ``re`` gets :class:`_CompatRe`: the same module, except that a pattern with an inline *global* flag group
  (``(?i)``) that is not at its start has that group moved to the front first. Python <= 3.10 applied such a flag
  to the whole pattern (with a DeprecationWarning); Python >= 3.11 refuses it (``re.error: global flags not at the
  start of the expression``). Every other pattern is passed through untouched. This is the one change Python 3.11
  needs (the script compiles two such patterns at import time: external links and images);
* ``cgi`` gets an empty stand-in where the module no longer exists (Python >= 3.13; the script calls
  ``cgi.escape`` only with ``escape_doc``, which its command line never sets);
* ``time`` gets the time module with ``strftime(fmt)`` read from a pinned clock (``--current-time``): the script
  expands ``{{CURRENTYEAR}}``, ``{{CURRENTMONTH}}``, ``{{CURRENTDAY}}``, ``{{CURRENTHOUR}}`` and ``{{CURRENTTIME}}``
  from ``time.strftime``, so an unpinned run depends on the day it runs.

**Same bytes as the script alone, in parallel.** The script's options are set by its own ``main()`` with the
command line MLPerf uses (``DUMP -o OUT``; only ``process_dump`` is intercepted). Then, as ``process_dump`` does,
the ``<siteinfo>`` is read and every page that ``pages_from`` yields and ``keepPage`` keeps goes through
``Extractor.extract``. That command line has no ``--templates``, so the script gathers no template definitions
(every template expands to nothing) and reads the pages on from the end of the ``<siteinfo>`` (a dump whose
``<siteinfo>`` never ends gives nothing); ``gather_templates`` does what ``--templates FILE`` does (a template pass
over the whole dump, ``load_templates``, then the pages from the start). The texts are written in dump order with
the script's file rotation (``OutputSplitter``: a file is opened before the first page, a page that would take it
past ``--bytes`` opens the next one; 100 files per folder ``AA``, ``AB`` ...; a page that failed writes nothing
but still counts for the rotation, as the script's empty text does). The dump is read as the script reads it on
the Python it was run with (3.7): a ``.bz2`` as bytes split at ``\\n`` and decoded line by line, a plain ``.xml``
as text with universal newlines.

Workers: with a multistream dump each worker decompresses and parses its own range of bz2 streams, in the
template pass and in the extraction pass (extract_streams.py); other dumps are parsed by this process and the
pages sent to the workers in batches. Each worker loads the script itself and the siteinfo and gathered templates
(one pickle, written once). Streams are used only when every range starts and ends on a page boundary, every page in
it has its own ``<ns>`` line, and no page repeats the id of the page before it across ranges (the script's
``pages_from`` carries ``ns`` and the last id from page to page); otherwise the dump is read serially.
"""

from __future__ import annotations

import builtins
import bz2
import contextlib
import gzip
import hashlib
import io
import logging
import os
import pickle
import re
import sys
import tempfile
import time
import types
import urllib.request
import warnings
from collections.abc import Iterable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

from core.errors import InputError

log = logging.getLogger(__name__)

COMMIT = "3162bb6c3c9ebd2d15be507aa11d6fa818a454ac"
SCRIPT_URL = f"https://raw.githubusercontent.com/attardi/wikiextractor/{COMMIT}/WikiExtractor.py"
SCRIPT_SHA256 = "36c067293e68c2d04d886bd410cc7529b791c6ea3cfa1c46b3e032838298471a"
SCRIPT_ENV = "BERTPIPE_WIKIEXTRACTOR"  # a path to an offline copy, as --extractor-script
NAME = "mlperf"  # the --extractor choice
WHERE = (f"get it from {SCRIPT_URL} (sha256 {SCRIPT_SHA256}) and pass it as --extractor-script PATH "
         f"(or ${SCRIPT_ENV})")


# -- the pinned script: where it comes from ------------------------------------------------------------
def cache_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "bertpipe" / f"wikiextractor-{COMMIT[:8]}" / "WikiExtractor.py"


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_script(path: Path, what: str = "--extractor-script") -> Path:
    """``path`` if it is the pinned WikiExtractor.py (sha256), else one InputError line saying where to get it."""
    path = Path(path)
    if not path.is_file():
        raise InputError(f"{what} {path} does not exist; MLPerf's extractor is WikiExtractor.py at "
                         f"attardi/wikiextractor@{COMMIT[:8]}: {WHERE}")
    digest = _sha256(path)
    if digest != SCRIPT_SHA256:
        raise InputError(f"{what} {path} is not WikiExtractor.py at attardi/wikiextractor@{COMMIT[:8]} (sha256 "
                         f"{digest[:16]}..., expected {SCRIPT_SHA256[:16]}...): {WHERE}")
    return path


def script_path(given: str | os.PathLike | None = None, fetch: bool = True, timeout: float = 60.0) -> Path:
    """The checked path of the pinned script: ``given`` (or ``$BERTPIPE_WIKIEXTRACTOR``), else the per-user cache,
    fetched from :data:`SCRIPT_URL` if absent (``fetch``)."""
    if given or os.environ.get(SCRIPT_ENV):
        return check_script(Path(given or os.environ[SCRIPT_ENV]),
                            "--extractor-script" if given else f"${SCRIPT_ENV}")
    cached = cache_path()
    if cached.is_file() and _sha256(cached) == SCRIPT_SHA256:
        return cached
    if not fetch:
        raise InputError(f"MLPerf's extractor is not in {cached}: {WHERE}")
    try:
        with urllib.request.urlopen(SCRIPT_URL, timeout=timeout) as r:  # noqa: S310 (a fixed https URL)
            data = r.read(4 << 20)
    except (OSError, ValueError) as exc:
        raise InputError(f"could not fetch MLPerf's extractor ({' '.join(str(exc).split())[:120]}): {WHERE}") from None
    if hashlib.sha256(data).hexdigest() != SCRIPT_SHA256:
        raise InputError(f"{SCRIPT_URL} did not give the pinned bytes (sha256 {hashlib.sha256(data).hexdigest()[:16]}"
                         f"...): {WHERE}")
    cached.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=cached.parent, prefix=".WikiExtractor.py.tmp-")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    os.replace(tmp, cached)
    log.info("extract: fetched %s into %s", SCRIPT_URL, cached)
    return cached


# -- the compatibility layer ---------------------------------------------------------------------------
_FLAG_LETTERS = "aiLmsux"


def hoist_global_flags(pattern: Any) -> Any:
    """``pattern`` with every inline global flag group ``(?imsx...)`` that is not at its start moved to its start
    (the meaning Python <= 3.10 gave it); anything else (compiled patterns, patterns without one) unchanged."""
    if isinstance(pattern, bytes):
        fixed = hoist_global_flags(pattern.decode("latin-1"))
        return pattern if fixed is None or fixed == pattern.decode("latin-1") else fixed.encode("latin-1")
    if not isinstance(pattern, str) or "(?" not in pattern:
        return pattern
    out, flags, i, n, in_class, moved = [], [], 0, len(pattern), False, False
    class_start = False  # just after a class's '[' (or '[^'): a ']' there is a literal
    while i < n:
        c = pattern[i]
        if c == "\\":
            out.append(pattern[i:i + 2])
            i += 2
            continue
        if in_class:
            if c == "]" and not class_start:
                in_class = False
            class_start = False
            out.append(c)
            i += 1
            continue
        if c == "[":
            in_class, class_start = True, True
            out.append(c)
            i += 1
            if i < n and pattern[i] == "^":
                out.append("^")
                i += 1
            continue
        if pattern.startswith("(?", i):
            j = i + 2
            while j < n and pattern[j] in _FLAG_LETTERS:
                j += 1
            if j > i + 2 and j < n and pattern[j] == ")":  # a global flag group
                flags.append(pattern[i + 2:j])
                moved = moved or i > 0 and bool(out)
                i = j + 1
                continue
        out.append(c)
        i += 1
    if not moved:
        return pattern
    letters = "".join(dict.fromkeys("".join(flags)))
    return f"(?{letters})" + "".join(out)


class _CompatRe(types.ModuleType):
    """The ``re`` module for the script: patterns pass through :func:`hoist_global_flags` first.

    The script compiles patterns at run time too (``findBalanced`` makes one per call); the compiled patterns are
    kept here by (pattern, flags), so the layer costs less than ``re``'s own cache lookup."""

    _MAX = 4096

    def __init__(self) -> None:
        super().__init__("re")
        self._cache: dict[tuple, re.Pattern] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(re, name)

    def compile(self, pattern, flags=0):  # noqa: ANN001, ANN201
        key = (type(pattern), pattern, flags)
        try:
            return self._cache[key]
        except KeyError:
            pass
        except TypeError:  # an unhashable argument: let re say what is wrong
            return re.compile(pattern, flags)
        if isinstance(pattern, re.Pattern):
            return re.compile(pattern, flags)
        compiled = re.compile(hoist_global_flags(pattern), flags)
        if len(self._cache) >= self._MAX:
            self._cache.clear()
        self._cache[key] = compiled
        return compiled

    def search(self, pattern, string, flags=0):  # noqa: ANN001, ANN201
        return self.compile(pattern, flags).search(string)

    def match(self, pattern, string, flags=0):  # noqa: ANN001, ANN201
        return self.compile(pattern, flags).match(string)

    def fullmatch(self, pattern, string, flags=0):  # noqa: ANN001, ANN201
        return self.compile(pattern, flags).fullmatch(string)

    def sub(self, pattern, repl, string, count=0, flags=0):  # noqa: ANN001, ANN201
        return self.compile(pattern, flags).sub(repl, string, count)

    def subn(self, pattern, repl, string, count=0, flags=0):  # noqa: ANN001, ANN201
        return self.compile(pattern, flags).subn(repl, string, count)

    def split(self, pattern, string, maxsplit=0, flags=0):  # noqa: ANN001, ANN201
        return self.compile(pattern, flags).split(string, maxsplit)

    def findall(self, pattern, string, flags=0):  # noqa: ANN001, ANN201
        return self.compile(pattern, flags).findall(string)

    def finditer(self, pattern, string, flags=0):  # noqa: ANN001, ANN201
        return self.compile(pattern, flags).finditer(string)


def pinned_struct_time(current_time: str | None) -> time.struct_time | None:
    if not current_time:
        return None
    try:
        return datetime.fromisoformat(current_time).timetuple()
    except ValueError:
        raise InputError(f"current_time {current_time!r} is not an ISO date/time (e.g. 2020-01-01T00:00:00)") from None


class _PinnedTime(types.ModuleType):
    """The ``time`` module for the script, with ``strftime(fmt)`` at the pinned time (None: the clock)."""

    def __init__(self, pinned: time.struct_time | None) -> None:
        super().__init__("time")
        self._pinned = pinned

    def __getattr__(self, name: str) -> Any:
        return getattr(time, name)

    def strftime(self, fmt: str, t: Any = None) -> str:
        if t is None:
            t = self._pinned if self._pinned is not None else time.localtime()
        return time.strftime(fmt, t)


def load_script(path: Path, current_time: str | None = None) -> types.ModuleType:
    """The pinned script (checked) as a fresh module, under the compatibility layer and the pinned clock."""
    path = check_script(path)
    pinned = pinned_struct_time(current_time)
    compat = {"re": _CompatRe(), "time": _PinnedTime(pinned)}
    real_import = builtins.__import__

    def _import(name, globals=None, locals=None, fromlist=(), level=0):  # noqa: ANN001, ANN202, A002
        if level == 0 and name in compat:
            return compat[name]
        if level == 0 and name == "cgi":
            try:
                return real_import(name, globals, locals, fromlist, level)
            except ImportError:  # Python >= 3.13
                return types.ModuleType("cgi")
        return real_import(name, globals, locals, fromlist, level)

    mod = types.ModuleType("bertpipe_wikiextractor_" + COMMIT[:8])
    mod.__file__ = str(path)
    mod.__dict__["__builtins__"] = {**builtins.__dict__, "__import__": _import}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # invalid escapes ('\[') and the like: the script's own business
        code = compile(path.read_bytes(), str(path), "exec", dont_inherit=True)
        exec(code, mod.__dict__)  # noqa: S102 (the pinned, checked script)
    return mod


def configure(mod: types.ModuleType, expand_templates: bool = True) -> None:
    """Set the script's options with its own ``main()`` and MLPerf's command line (``DUMP -o OUT``), without
    running ``process_dump`` and without touching this process's logging or folders."""
    captured: list[tuple] = []
    root = logging.getLogger()
    saved = (root.level, list(root.handlers), sys.argv)
    argv = ["WikiExtractor.py", "dump.xml.bz2", "-o", "-", "-q"] + ([] if expand_templates else ["--no_templates"])
    mod.process_dump = lambda *a: captured.append(a)
    try:
        sys.argv = argv
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mod.main()
    finally:
        sys.argv = saved[2]
        root.setLevel(saved[0])
        for h in list(root.handlers):
            if h not in saved[1]:
                root.removeHandler(h)
    if not captured:
        raise RuntimeError("WikiExtractor.py's main() did not reach process_dump")


# -- reading the dump as the script does on Python 3.7 ---------------------------------------------------
def dump_lines(dump: Path) -> Iterator[str]:
    """The dump's lines as fileinput.hook_compressed gave them on Python 3.7: .bz2/.gz as bytes split at
    ``\\n``, each decoded as UTF-8; anything else as text (locale encoding, universal newlines)."""
    ext = os.path.splitext(str(dump))[1]
    if ext in (".bz2", ".gz"):
        opener = bz2.BZ2File if ext == ".bz2" else gzip.GzipFile
        with opener(dump, "rb") as f:
            for line in io.BufferedReader(f, 1 << 20):
                yield line.decode("utf-8")
    else:
        with open(dump) as f:  # noqa: PLW1514 (the script's own open: locale encoding)
            yield from f


def chunk_lines(text_bytes: bytes) -> Iterator[str]:
    for line in io.BytesIO(text_bytes):
        yield line.decode("utf-8")


def read_siteinfo(mod: Any, lines: Iterator[str]) -> bool:
    """Fill the script's options from the ``<siteinfo>`` header (what process_dump does before the templates),
    consuming ``lines`` up to ``</siteinfo>`` (the whole input when there is none, as the script)."""
    o = mod.options
    for line in lines:
        m = mod.tagRE.search(line)
        if not m:
            continue
        tag = m.group(2)
        if tag == "base":
            o.urlbase = m.group(3)[: m.group(3).rfind("/")]
        elif tag == "namespace":
            mk = mod.keyRE.search(line)
            o.knownNamespaces[m.group(3)] = "".join(mk.groups()) if mk else ""
            if 'key="10"' in line:
                o.templateNamespace, o.templatePrefix = m.group(3), m.group(3) + ":"
            elif 'key="828"' in line:
                o.moduleNamespace, o.modulePrefix = m.group(3), m.group(3) + ":"
        elif tag == "/siteinfo":
            return True
    return False


_STATE = ("urlbase", "knownNamespaces", "templateNamespace", "templatePrefix", "moduleNamespace", "modulePrefix",
          "templates", "redirects")


def state_of(mod: types.ModuleType) -> dict[str, Any]:
    return {k: getattr(mod.options, k) for k in _STATE if hasattr(mod.options, k)}


# -- the worker side -----------------------------------------------------------------------------------
_W: dict[str, Any] = {}


def init_worker(script: str, current_time: str | None, expand_templates: bool, state_file: str | None,
                state: dict | None = None) -> None:
    """Load the script (compat layer, pinned clock), set its options as its main() does, then the dump's
    siteinfo and templates (from ``state``, or the pickle ``state_file``)."""
    mod = load_script(Path(script), current_time)
    configure(mod, expand_templates)
    if state is None and state_file:
        with open(state_file, "rb") as f:
            state = pickle.load(f)  # noqa: S301 (written by this run)
    for k, v in (state or {}).items():
        setattr(mod.options, k, v)
    _W.clear()
    _W["mod"] = mod


def reset_worker() -> None:
    _W.clear()


def extract_pages(pages: Iterable[tuple]) -> list[str | None]:
    """Each kept page's text as the script's extract_process makes it ('' when it fails, logged; None for a
    page that keepPage drops: nothing is written for it)."""
    mod = _W["mod"]
    out: list[str | None] = []
    for page_id, revid, title, ns, cats, lines in pages:
        if not mod.keepPage(ns, cats, lines):
            continue
        buf = io.StringIO()
        try:
            mod.Extractor(page_id, revid, title, lines).extract(buf)
            out.append(buf.getvalue())
        except Exception:  # noqa: BLE001 - the script writes '' for a page it fails on, and goes on
            log.warning("extract: page id=%s title=%r failed in WikiExtractor.py; written empty, as the script "
                        "does", page_id, title, exc_info=True)
            out.append("")
    return out


def extract_batch(batch: list[tuple]) -> list[str | None]:
    return extract_pages(batch)


class _IdRecorder:
    """Wraps the script's pages_from: the ids it yields (first, last), and whether every page had an <ns> line."""

    def __init__(self, mod: types.ModuleType) -> None:
        self.mod, self.orig, self.first, self.last, self.pages = mod, mod.pages_from, None, None, 0

    def __call__(self, lines: Iterable[str]) -> Iterator[tuple]:
        for page in self.orig(lines):
            if self.first is None:
                self.first = page[0]
            self.last = page[0]
            self.pages += 1
            yield page


_NS_LINE = re.compile(rb"^\s*<ns>[^<]*</ns>\s*$", re.M)
_PAGE_LINE = re.compile(rb"^\s*<page>\s*$", re.M)


def _self_contained(raw: bytes) -> bool:
    """Every page of the range opens on its own line and has its own <ns> line (pages_from's state does not
    carry into it)."""
    return raw.count(b"<page>") == len(_PAGE_LINE.findall(raw)) == len(_NS_LINE.findall(raw)) \
        and raw.count(b"</page>") == raw.count(b"<page>")


def scan_chunk(job: tuple) -> tuple | None:
    """Worker: the template and redirect definitions of one range of bz2 streams, in order, with the first and
    last page ids (None: the range cannot be read on its own)."""
    from preprocessing.text.extract_streams import _aligned, _ChunkError, _read_chunk_bytes

    dump, start, end, first, last = job
    try:
        raw = _read_chunk_bytes(dump, start, end)
    except _ChunkError as exc:
        return ("error", str(exc))
    try:
        head = raw[:4096].decode("utf-8", "ignore")
        tail = raw[-4096:].decode("utf-8", "ignore")
    except Exception:  # noqa: BLE001
        return None
    if not _aligned(head + "\n" + tail if len(raw) > 8192 else raw.decode("utf-8", "ignore"), first, last) \
            or not _self_contained(raw if not first else raw[raw.find(b"</siteinfo>") + 1:]):
        return None
    mod = _W["mod"]
    o = mod.options
    o.templates, o.redirects = {}, {}
    rec = _IdRecorder(mod)
    mod.pages_from = rec
    try:
        lines = chunk_lines(raw)
        if first:
            read_siteinfo(_siteinfo_only(mod), lines)
        mod.load_templates(lines)
    except UnicodeDecodeError as exc:
        return ("error", f"{dump} is not UTF-8 text near byte {exc.start} of a line in the stream at {start}")
    finally:
        mod.pages_from = rec.orig
    return list(o.templates.items()), list(o.redirects.items()), rec.first, rec.last


def extract_chunk(job: tuple) -> tuple:
    """Worker: the texts of the kept pages of one range of bz2 streams, in order, with the first and last page
    ids (("serial", why): the range cannot be read on its own with the script's page state)."""
    from preprocessing.text.extract_streams import _aligned, _ChunkError, _read_chunk_bytes

    dump, start, end, first, last = job
    try:
        raw = _read_chunk_bytes(dump, start, end)
    except _ChunkError as exc:
        return ("error", str(exc))
    if not _aligned(raw[:4096].decode("utf-8", "ignore") + "\n" + raw[-4096:].decode("utf-8", "ignore"), first, last):
        return ("serial", "bz2 streams that split pages")
    if not _self_contained(raw[raw.find(b"</siteinfo>") + 1:] if first else raw):
        return ("serial", "pages without their own <page> and <ns> lines")
    mod = _W["mod"]
    rec = _IdRecorder(mod)
    try:
        return ("ok", extract_pages(rec(chunk_lines(raw))), rec.first, rec.last)
    except UnicodeDecodeError as exc:
        return ("error", f"{dump} is not UTF-8 text near byte {exc.start} of a line in the stream at {start}")


# -- the driver ------------------------------------------------------------------------------------------
class Serial(Exception):
    """The dump's streams cannot be read range by range with the script's exact page state: read serially."""


def _siteinfo_only(mod: types.ModuleType) -> types.SimpleNamespace:
    return types.SimpleNamespace(options=types.SimpleNamespace(knownNamespaces={}), tagRE=mod.tagRE, keyRE=mod.keyRE)


def gather(dump: Path, script: Path, current_time: str | None, expand_templates: bool, gather_templates: bool,
           processes: int, chunks: list[tuple[int, int]]) -> tuple[dict[str, Any] | None, list[tuple[int, int]]]:
    """What process_dump does before the pages: read the ``<siteinfo>``; with ``gather_templates`` (the script's
    ``--templates FILE``, a file not there yet) collect the template definitions of the whole dump. MLPerf's
    command passes no ``--templates``: the script then collects none (every template expands to nothing) and
    reads the pages on from the end of the ``<siteinfo>``. Returns the script's options state for the workers
    (None: the siteinfo never ends, so the script finds no page) and the bz2 ranges the passes may use."""
    from core.pools import ordered_map

    init_worker(str(script), current_time, expand_templates, None)
    mod = _W["mod"]
    lines = dump_lines(dump)
    try:
        if not read_siteinfo(mod, lines):
            return None, []
        if not (expand_templates and gather_templates):
            return state_of(mod), chunks
        if chunks and mod.options.templateNamespace and mod.options.moduleNamespace:
            siteinfo = state_of(mod)
            lines.close()
            try:
                templates, redirects, prev_last = {}, {}, None
                jobs = [(str(dump), s, e, k == 0, k == len(chunks) - 1) for k, (s, e) in enumerate(chunks)]
                init = (str(script), current_time, expand_templates, None, siteinfo)
                for res in ordered_map(scan_chunk, jobs, processes, initializer=init_worker, initargs=init):
                    if res is None:
                        raise Serial("bz2 streams that split pages or pages without their own <ns> line")
                    if res[0] == "error":
                        raise InputError(res[1])
                    t, r, first_id, last_id = res
                    if first_id is not None and first_id == prev_last:
                        raise Serial("a page repeats the id of the page before it across bz2 streams")
                    prev_last = last_id if last_id is not None else prev_last
                    templates.update(t)
                    redirects.update(r)
                init_worker(str(script), current_time, expand_templates, None, siteinfo)  # (this process again)
                mod = _W["mod"]
                mod.options.templates, mod.options.redirects = templates, redirects
                return state_of(mod), chunks
            except Serial as why:
                log.info("extract: %s: %s; reading it serially", dump, why)
                init_worker(str(script), current_time, expand_templates, None, siteinfo)
                mod = _W["mod"]
                lines = dump_lines(dump)
                read_siteinfo(_siteinfo_only(mod), lines)
        mod.load_templates(lines)
        return state_of(mod), []
    except UnicodeDecodeError as exc:
        raise InputError(f"{dump} is not UTF-8 text at byte {exc.start} of a line ({exc.reason})") from None
    except EOFError:
        raise InputError(f"{dump} is truncated (the bz2 stream ends early); download it again") from None
    except OSError as exc:
        raise InputError(f"{dump} is not a valid bz2 file ({exc}); download it again") from None
    finally:
        lines.close()
        reset_worker()


def texts(dump: Path, script: Path, current_time: str | None, expand_templates: bool, from_start: bool,
          processes: int, chunks: list[tuple[int, int]], state_file: str, batch_pages: int = 64) -> Iterator[str]:
    """The extraction pass: every kept page's text, in dump order. ``from_start``: the pages are read from the
    start of the dump (after a template pass, the script opens it again), else from the end of the siteinfo.
    Raises :class:`Serial` (before yielding anything from the range concerned) when a bz2 range cannot be read
    on its own."""
    from core.pools import ordered_map
    from preprocessing.text.extract_streams import ordered

    init = (str(script), current_time, expand_templates, state_file)
    if chunks:
        jobs = [(str(dump), s, e, k == 0, k == len(chunks) - 1) for k, (s, e) in enumerate(chunks)]
        prev_last = None
        try:
            for res in ordered(extract_chunk, jobs, processes, [e - s for s, e in chunks], f"extract {dump.name}",
                               init_worker, init):
                if res[0] == "serial":
                    raise Serial(res[1])
                if res[2] is not None and res[2] == prev_last:
                    raise Serial("a page repeats the id of the page before it across bz2 streams")
                prev_last = res[3] if res[3] is not None else prev_last
                yield from res[1]
        finally:
            reset_worker()
        return
    init_worker(*init)  # this process parses the dump (pages_from, as the script's mapper)
    mod = _W["mod"]
    lines = dump_lines(dump)
    try:
        if not from_start:
            read_siteinfo(_siteinfo_only(mod), lines)
        batches = _batches(mod.pages_from(lines), batch_pages)
        if processes <= 1:
            for batch in batches:
                yield from extract_pages(batch)
        else:
            for res in ordered_map(extract_batch, batches, processes, initializer=init_worker, initargs=init):
                yield from res
    except UnicodeDecodeError as exc:
        raise InputError(f"{dump} is not UTF-8 text at byte {exc.start} of a line ({exc.reason})") from None
    except EOFError:
        raise InputError(f"{dump} is truncated (the bz2 stream ends early); download it again") from None
    finally:
        lines.close()
        reset_worker()


def _batches(pages: Iterable[tuple], size: int) -> Iterator[list[tuple]]:
    batch: list[tuple] = []
    for page in pages:
        batch.append(page)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


@contextlib.contextmanager
def state_pickle(state: dict[str, Any], folder: Path) -> Iterator[str]:
    """The gathered templates in one pickle for the workers (a dot-file swept as debris if the run dies)."""
    fd, name = tempfile.mkstemp(dir=folder, prefix=".mlperf-templates.tmp-")
    try:
        with os.fdopen(fd, "wb") as f:
            pickle.dump(state, f, protocol=pickle.HIGHEST_PROTOCOL)
        yield name
    finally:
        with contextlib.suppress(OSError):
            os.unlink(name)


class ScriptSplitter:
    """The script's OutputSplitter/NextFile rule over StageOutput files: the first file is opened before any
    page; a text that would take the file past ``max_bytes`` opens the next; every text counts, '' included."""

    def __init__(self, out: Any, max_bytes: int) -> None:
        from preprocessing.text.extract import output_name

        self.out, self.max, self.files, self.size, self.name = out, max_bytes, 0, 0, output_name
        self._stack: contextlib.ExitStack | None = None
        self._f: Any = None
        self._next()

    def __enter__(self) -> ScriptSplitter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stack is not None:
            self._stack.__exit__(*exc)

    def write(self, text: str) -> None:
        data = text.encode("utf-8")
        if self.size + len(data) > self.max:
            self._next()
        self._f.write(data)
        self.size += len(data)

    def _next(self) -> None:
        if self._stack is not None:
            self._stack.close()
        self._stack = contextlib.ExitStack()
        self._f = self._stack.enter_context(self.out.open(self.name(self.files)))
        self.files += 1
        self.size = 0
