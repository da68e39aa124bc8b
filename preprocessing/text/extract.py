"""Stage 2, extract: wikiextractor 3.1.0 over a MediaWiki dump -> ``AA/wiki_00``, ``AA/wiki_01`` ...

The reference runs ``WikiExtractor.py <dump>`` with no flags (spec §2). This stage drives the PyPI package
``wikiextractor==3.1.0`` as a library with the same defaults (templates expanded, links dropped, 1 MB
files, main-namespace non-redirect pages only) and writes the reference layout: per article
``<doc id=".." url="..?curid=ID" title="..">``, the title line, the text, ``</doc>``; a new file when the
next article would make the current one exceed ``bytes_per_file``; 100 files per directory ``AA``, ``AB`` ...

What differs from running the package's own ``process_dump``:

* the bz2 dump is read directly and checked first (a truncated or non-bz2 file, XML that is not a MediaWiki
  dump and a dump without articles each raise one :class:`InputError` naming the file, before any output);
* ``{{CURRENTYEAR}}``, ``{{CURRENTMONTH}}``, ``{{CURRENTDAY}}``, ``{{CURRENTHOUR}}``, ``{{CURRENTTIME}}`` (the
  five words 3.1.0 fills from the clock) expand from ``ExtractConfig.current_time``, so output is
  reproducible; 3.1.0 leaves the other date words (CURRENTMONTHNAME ...) empty, and so does this stage;
* a dump without ``<siteinfo>`` still works (Template namespace and URL base default to enwiki's);
* the output is identical whatever the number of worker processes (jobs are written back in dump order);
* a multistream dump (Wikimedia's ``-multistream.xml.bz2``) is decompressed and parsed by the workers
  themselves, in both passes (extract_streams.py); other dumps are read by one thread that decompresses
  ahead of the parser.

Text differs from the 2020 extractor that made MLPerf's data (section titles kept, paragraph spacing; spec
§2): that is accepted, the layout is what the text stages need.
"""

from __future__ import annotations

import io
import logging
import os
import re
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime
from itertools import chain
from pathlib import Path
from typing import Any

from core.errors import InputError
from core.manifest import Manifest, StageOutput, verify_file
from core.pools import can_fork, ordered_map
from core.stage import Stage
from preprocessing.text.extract_streams import open_lines
from preprocessing.text.textio import check_output_dir

log = logging.getLogger(__name__)

STAGE_VERSION = "1"
EXTRACTOR_31 = "wikiextractor-3.1"  # the PyPI package wikiextractor 3.1.0 (this module)
EXTRACTOR_MLPERF = "mlperf"  # the script MLPerf pins (preprocessing/text/mlperf_extractor.py)
EXTRACTORS = (EXTRACTOR_MLPERF, EXTRACTOR_31)
MLPERF_DUMP = "enwiki-20200101"  # the dump of MLPerf's data set: MLPerf's extractor is its default


def default_extractor(source: str | None) -> str:
    """MLPerf's extractor for MLPerf's dump (the preset, or a file named after it); 3.1.0 for any other."""
    name = os.path.basename(str(source or ""))
    return EXTRACTOR_MLPERF if name.startswith(MLPERF_DUMP) else EXTRACTOR_31


def check_extractor(name: str, what: str = "--extractor") -> str:
    if name not in EXTRACTORS:
        raise InputError(f"{what} {name!r}: choose {' or '.join(EXTRACTORS)}")
    return name
_OUTPUT_FILE = re.compile(r"^[A-Z]{2}/wiki_\d{2}$")


@dataclass(frozen=True, kw_only=True)
class ExtractConfig:
    processes: int = 1  # worker processes for wikitext -> text (output identical for any count)
    bytes_per_file: int = 1 << 20  # WikiExtractor --bytes 1M: max bytes per output file
    current_time: str | None = None  # ISO time for {{CURRENTYEAR}} & co.; None: the clock at the start of the run
    expand_templates: bool = True  # WikiExtractor default (the reference passes no --no-templates)
    url_base: str = "https://en.wikipedia.org/wiki"  # <doc url=...> base when the dump has no <siteinfo><base>
    batch_pages: int = 32  # pages per job sent to a worker process (throughput only)
    multistream: bool = True  # workers decompress a multistream dump's bz2 streams themselves (same output)
    extractor: str = "wikiextractor-3.1"  # or "mlperf": WikiExtractor.py @ 3162bb6c (preprocessing/text/mlperf_extractor.py)
    extractor_script: str | None = None  # mlperf: an offline copy of the pinned script (default: fetched, cached)
    gather_templates: bool = False  # mlperf: collect the dump's templates first (the script's --templates FILE;
    #                                 MLPerf's command line has none: its templates expand to nothing)

    def params(self) -> dict[str, Any]:
        """The fields that decide output bytes (the stage key); worker count and batch size do not. The
        extractor is in it; for MLPerf's, the pinned script's sha256 (not where the copy lies)."""
        d = asdict(self)
        for k in ("processes", "batch_pages", "multistream", "extractor_script"):
            d.pop(k)
        if self.extractor != EXTRACTOR_MLPERF:
            d.pop("gather_templates")
        else:
            from preprocessing.text.mlperf_extractor import SCRIPT_SHA256

            d.pop("url_base")  # the script takes the <siteinfo> base (or none)
            d["extractor_sha256"] = SCRIPT_SHA256
        return d


@dataclass
class _DumpInfo:
    url_base: str
    template_ns: str
    known_namespaces: set[str]
    templates: Any = None  # template_blob owners (shared memory), or None without template expansion
    redirects: Any = None
    chunks: list[tuple[int, int]] = field(default_factory=list)  # bz2 stream ranges read by workers ([]: serial)


def run_extract(dump: Path, out_dir: Path, cfg: ExtractConfig = ExtractConfig(),
                upstream: Sequence[Manifest] = ()) -> Manifest:
    """Extract the articles of ``dump`` (``.xml.bz2`` or ``.xml``) into ``out_dir/AA/wiki_00`` ...

    Raises:
        InputError: the dump is missing, truncated, not bz2, not a MediaWiki dump, or holds no article.
        ChecksumError / ManifestError: the dump does not match its upstream (download) manifest.
    """
    dump, out_dir = Path(dump), Path(out_dir)
    check_extractor(cfg.extractor, "extractor")
    _check_dump(dump, upstream)
    if cfg.extractor == EXTRACTOR_MLPERF:
        return _run_mlperf(dump, out_dir, cfg, upstream)
    if not can_fork(cfg.processes):  # a daemonic process (a Dask worker under its nanny): the work runs here
        cfg = replace(cfg, processes=1)
    clock = clock_values(cfg.current_time)
    check_output_dir(out_dir)
    t0 = time.perf_counter()
    info = _scan(dump, cfg)  # whole first pass: validates the stream, collects templates
    readers = "bz2 streams in the workers" if info.chunks else "one reader"
    try:
        with StageOutput(out_dir, "extract", params=cfg.params(), upstream=upstream,
                         code_version=STAGE_VERSION) as out:
            _remove_old_outputs(out_dir)
            with _SplitWriter(out, cfg.bytes_per_file) as writer:
                for text in _extract_pages(dump, info, clock, cfg, out):
                    writer.write(text)
                    out.count("articles")
            if not out.manifest.counters.get("articles"):
                raise InputError(f"{dump} holds no articles (no main-namespace, non-redirect <page> with text); "
                                 "is it the right dump?")
            out.manifest.counters.update(files=writer.files, current_time=clock["currenttime_iso"],
                                         processes=cfg.processes, dump_bytes=dump.stat().st_size,
                                         bz2_chunks=len(info.chunks))
    finally:
        _release(info)
    log.info("extract: %s -> %s: %d articles in %d files, %.1fs (%d processes, %s)", dump, out_dir,
             out.manifest.counters["articles"], writer.files, time.perf_counter() - t0, cfg.processes, readers)
    return out.manifest


def _run_mlperf(dump: Path, out_dir: Path, cfg: ExtractConfig, upstream: Sequence[Manifest]) -> Manifest:
    """MLPerf's extractor (preprocessing/text/mlperf_extractor.py): the bytes of ``WikiExtractor.py DUMP -o OUT``."""
    from preprocessing.text import extract_streams
    from preprocessing.text import mlperf_extractor as mx

    script = mx.script_path(cfg.extractor_script)
    if not can_fork(cfg.processes):
        cfg = replace(cfg, processes=1)
    now = cfg.current_time or datetime.now().replace(microsecond=0).isoformat()  # one time for the whole run
    mx.pinned_struct_time(now)
    check_output_dir(out_dir)
    t0 = time.perf_counter()
    with open(dump, "rb") as f:
        if dump.suffix == ".bz2" and f.read(3) != b"BZh":
            raise InputError(f"{dump} is not a bz2 file (it does not start with 'BZh'); "
                             "give the .xml.bz2 dump as downloaded, or an uncompressed .xml")
    _check_mediawiki(dump)
    chunks = extract_streams.plan_chunks(dump, cfg.processes) if cfg.multistream and _is_bz2(dump) else []
    state, chunks = mx.gather(dump, script, now, cfg.expand_templates, cfg.gather_templates, cfg.processes, chunks)
    try:
        out = _write_mlperf(dump, out_dir, cfg, upstream, script, now, state, chunks)
    except mx.Serial as why:  # found while extracting: the whole output again, one reader
        log.info("extract: %s: %s; extracting it again with one reader", dump, why)
        chunks = []
        out = _write_mlperf(dump, out_dir, cfg, upstream, script, now, state, chunks)
    c = out.manifest.counters
    log.info("extract (MLPerf's WikiExtractor.py): %s -> %s: %d articles in %d files, %.1fs (%d processes, %s)",
             dump, out_dir, c["articles"], c["files"], time.perf_counter() - t0, cfg.processes,
             "bz2 streams in the workers" if chunks else "one reader")
    return out.manifest


def _write_mlperf(dump: Path, out_dir: Path, cfg: ExtractConfig, upstream: Sequence[Manifest], script: Path,
                  now: str, state: dict[str, Any] | None, chunks: list[tuple[int, int]]) -> StageOutput:
    from preprocessing.text import mlperf_extractor as mx

    with StageOutput(out_dir, "extract", params=cfg.params(), upstream=upstream, code_version=STAGE_VERSION) as out:
        _remove_old_outputs(out_dir)
        with mx.state_pickle(state or {}, out_dir) as state_file, mx.ScriptSplitter(out, cfg.bytes_per_file) as writer:
            pages = [] if state is None else mx.texts(dump, script, now, cfg.expand_templates, cfg.gather_templates,
                                                      cfg.processes, chunks, state_file)
            for text in pages:
                writer.write(text)
                out.count("articles" if text else "pages_failed")
        if not out.manifest.counters.get("articles"):
            raise InputError(f"{dump} holds no articles that MLPerf's WikiExtractor.py extracts (no main-namespace, "
                             "non-redirect <page> after a complete <siteinfo>); is it the right dump?")
        out.manifest.counters.update(files=writer.files, current_time=now, processes=cfg.processes,
                                     dump_bytes=dump.stat().st_size, bz2_chunks=len(chunks),
                                     templates=len((state or {}).get("templates", {})), extractor=EXTRACTOR_MLPERF)
    return out


def _check_mediawiki(dump: Path) -> None:
    """The start of the dump is a MediaWiki export, and (bz2) the whole stream decompresses: one InputError."""
    with open_lines(dump, f"check {dump.name}") as lines:
        for i, line in enumerate(lines):
            if "<mediawiki" in line:
                break
            if i >= 50 or "<page" in line:
                raise InputError(f"{dump} is not a MediaWiki XML dump (no <mediawiki> root element at its start); "
                                 "give a pages-articles dump from dumps.wikimedia.org")
        else:
            raise InputError(f"{dump} is not a MediaWiki XML dump (no <mediawiki> root element at its start); "
                             "give a pages-articles dump from dumps.wikimedia.org")


def clock_values(current_time: str | None) -> dict[str, str]:
    """The magic-word values wikiextractor 3.1.0 reads from ``time.strftime``, for a pinned time."""
    try:
        t = datetime.fromisoformat(current_time) if current_time else datetime.now()
    except ValueError:
        raise InputError(f"current_time {current_time!r} is not an ISO date/time (e.g. 2026-11-22T00:00:00)") from None
    return {"currentyear": t.strftime("%Y"), "currentmonth": t.strftime("%m"), "currentday": t.strftime("%d"),
            "currenthour": t.strftime("%H"), "currenttime": t.strftime("%H:%M:%S"),
            "currenttime_iso": t.isoformat()}


# -- reading the dump ----------------------------------------------------------------------------
def _check_dump(dump: Path, upstream: Sequence[Manifest]) -> None:
    if not dump.is_file():
        raise InputError(f"{dump} does not exist (or is not a file); give the path of a MediaWiki .xml.bz2 dump")
    for m in upstream:
        for f in m.files:
            if f.name == dump.name:
                verify_file(dump, f.md5, f.bytes, what=f"from the {m.stage} stage")
                return
    if upstream:
        raise InputError(f"{dump} is not listed in the upstream manifest(s) {[m.stage for m in upstream]}")


def _read_siteinfo(lines: Iterator[str], dump: Path, cfg: ExtractConfig) -> tuple[_DumpInfo, Iterator[str]]:
    """Check the root element, read <siteinfo> (if any); returns the info and the remaining lines."""
    from wikiextractor.WikiExtractor import tagRE

    info = _DumpInfo(url_base=cfg.url_base, template_ns="Template", known_namespaces={"Template"})
    root = False
    for i, line in enumerate(lines):
        if not root:
            if "<mediawiki" in line:
                root = True
            elif i >= 50 or "<page" in line:
                break
            continue
        m = tagRE.search(line)
        tag = m.group(2) if m else ""
        if tag == "page":  # no <siteinfo>: keep the defaults
            return info, chain([line], lines)
        if tag == "base":
            info.url_base = m.group(3)[: m.group(3).rfind("/")]
        elif tag == "namespace" and m.group(3):
            info.known_namespaces.add(m.group(3))
            if 'key="10"' in line:
                info.template_ns = m.group(3)
        elif tag == "/siteinfo":
            return info, lines
    if not root:
        raise InputError(f"{dump} is not a MediaWiki XML dump (no <mediawiki> root element at its start); "
                         "give a pages-articles dump from dumps.wikimedia.org")
    return info, lines  # a root but no page: the empty-dump error comes later


def _scan(dump: Path, cfg: ExtractConfig) -> _DumpInfo:
    """First pass over the whole dump: siteinfo, template definitions; proves the stream is intact.

    A multistream dump is scanned by the workers (see extract_streams); any other by one reader.
    """
    from wikiextractor import WikiExtractor as wx
    from wikiextractor import template_blob

    from preprocessing.text import extract_streams

    def builders() -> tuple:
        return template_blob.StreamingTemplateBlobBuilder(), template_blob.StreamingTemplateBlobBuilder()

    chunks = extract_streams.plan_chunks(dump, cfg.processes) if cfg.multistream and _is_bz2(dump) else []
    count = None
    if chunks:
        with open_lines(dump, f"siteinfo {dump.name}") as lines:  # closed (no reader thread) before forking
            info, _ = _read_siteinfo(lines, dump, cfg)
        built = builders()
        count = extract_streams.scan_templates(dump, chunks, info.template_ns + ":", cfg.processes, built)
        info.chunks = chunks if count is not None else []
    if count is None:
        built = builders()
        with open_lines(dump, f"templates {dump.name}") as lines:
            info, rest = _read_siteinfo(lines, dump, cfg)
            count, _ = wx.load_templates(rest, blob_builder=built[0], redirects_blob_builder=built[1],
                                         template_prefix=info.template_ns + ":")
    if cfg.expand_templates:  # (without, the pass above still proved the dump intact before any output)
        info.templates = template_blob.compact_blobs(*built[0].finish())
        info.redirects = template_blob.compact_blobs(*built[1].finish())
        log.info("extract: %d templates in %s", count, dump)
    return info


def _is_bz2(dump: Path) -> bool:
    with open(dump, "rb") as f:
        return f.read(3) == b"BZh"


def _release(info: _DumpInfo) -> None:
    for owner in (info.templates, info.redirects):
        if owner is not None:
            owner.__exit__(None, None, None)  # close + unlink the shared memory


# -- extracting pages ----------------------------------------------------------------------------
def _pages(dump: Path, info: _DumpInfo) -> Iterator[tuple[str, str, str, list[str]]]:
    """(id, revid, title, wikitext lines) of every main-namespace, non-redirect page, in dump order."""
    from wikiextractor import WikiExtractor as wx

    wx.templateNamespace = info.template_ns  # collect_pages drops titles starting with it ('' drops all)
    with open_lines(dump, f"extract {dump.name}") as lines:
        yield from wx.collect_pages(lines)


def _batches(pages: Iterable[tuple], size: int) -> Iterator[list[tuple]]:
    batch: list[tuple] = []
    for page in pages:
        batch.append(page)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch


def _extract_pages(dump: Path, info: _DumpInfo, clock: dict[str, str], cfg: ExtractConfig,
                   out: StageOutput) -> Iterator[str]:
    """Each article's ``<doc>`` text, in dump order, computed by ``cfg.processes`` workers."""
    setup = _worker_setup(info, clock)
    if info.chunks:
        from preprocessing.text.extract_streams import extract_chunks

        try:
            for texts in extract_chunks(dump, info.chunks, cfg.processes, init_worker, setup):
                yield from _keep(texts, out)
        finally:
            reset_worker()  # (in-process run with 1 worker)
        return
    batches = _batches(_pages(dump, info), max(1, cfg.batch_pages))
    if cfg.processes <= 1:
        init_worker(*setup)
        try:
            for batch in batches:
                yield from _keep(extract_batch(batch), out)
        finally:
            reset_worker()
        return
    # at most 2 batches per worker in flight: bounded memory on a 20 GB dump
    for texts in ordered_map(extract_batch, batches, cfg.processes, initializer=init_worker, initargs=setup):
        yield from _keep(texts, out)


def _keep(texts: list[str | None], out: StageOutput) -> Iterator[str]:
    for text in texts:
        if text is None:
            out.count("pages_failed")  # logged by the worker, with the page's id and title
        else:
            yield text


def _remove_old_outputs(out_dir: Path) -> None:
    """Delete ``XX/wiki_NN`` left from an earlier run, so a shorter output leaves no stale files."""
    for p in out_dir.glob("[A-Z][A-Z]/wiki_[0-9][0-9]"):
        if p.parent.is_symlink():  # never delete through a link (it may lead out of the output folder)
            raise InputError(f"{p.parent} is a symbolic link; an output folder of extract holds real folders "
                             "only: remove the link and run again")
        if p.is_file() and _OUTPUT_FILE.match(p.relative_to(out_dir).as_posix()):
            p.unlink()


class _SplitWriter:
    """wikiextractor's OutputSplitter over StageOutput files: same names, same roll-over rule.

    Like the original, a file is opened before the first article and rolled over when
    ``size + len(article) > max``, so an article bigger than ``max`` leaves an empty file before it.
    """

    def __init__(self, out: StageOutput, max_bytes: int) -> None:
        self.out, self.max, self.files, self.size = out, max_bytes, 0, 0
        self._stack: ExitStack | None = None
        self._f: io.BufferedWriter | None = None

    def __enter__(self) -> _SplitWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._stack is not None:
            self._stack.__exit__(*exc)

    def write(self, text: str) -> None:
        data = text.encode("utf-8")
        if self._f is None:
            self._next()
        if self.size + len(data) > self.max:  # OutputSplitter.reserve
            self._next()
        self._f.write(data)
        self.size += len(data)

    def _next(self) -> None:
        if self._stack is not None:
            self._stack.close()
        self._stack = ExitStack()
        self._f = self._stack.enter_context(self.out.open(output_name(self.files)))
        self.files += 1
        self.size = 0


def output_name(index: int) -> str:
    """wikiextractor's NextFile naming: 100 files per directory, directories AA, AB, ... AZ, BA ..."""
    d, f = divmod(index, 100)
    return f"{chr(ord('A') + d // 26 % 26)}{chr(ord('A') + d % 26)}/wiki_{f:02d}"


# -- worker side (module-level so that worker processes can import them) ------------------------------
_WORKER: dict[str, Any] = {}


def _worker_setup(info: _DumpInfo, clock: dict[str, str]) -> tuple:
    """Picklable arguments of :func:`init_worker`: shared-memory names, Extractor keyword arguments."""
    from wikiextractor.extract import _DEFAULT_IGNORED_TAG_PATTERNS, ignoreTag

    kwargs = {  # what WikiExtractor.main() passes without flags (links dropped: <a> ignored too)
        "templatePrefix": info.template_ns + ":", "knownNamespaces": set(info.known_namespaces),
        "ignored_tag_patterns": list(_DEFAULT_IGNORED_TAG_PATTERNS) + [ignoreTag("a")],
        "keepLinks": False, "HtmlFormatting": False, "to_json": False, "to_text": False, "discard_empty": False,
    }
    names = [o.names if o is not None else None for o in (info.templates, info.redirects)]
    return names[0], names[1], info.url_base, kwargs, clock


def init_worker(template_names: tuple | None, redirect_names: tuple | None, url_base: str,
                kwargs: dict[str, Any], clock: dict[str, str]) -> None:
    """Attach to the templates in shared memory and prepare the pinned-clock Extractor."""
    from wikiextractor import WikiExtractor as wx
    from wikiextractor import template_blob

    wx.templateNamespace = kwargs["templatePrefix"][:-1]  # collect_pages reads this global
    _WORKER.update(
        templates=template_blob.attach(template_names) if template_names else None,
        redirects=template_blob.attach(redirect_names) if redirect_names else None,
        url_base=url_base, kwargs=kwargs, cls=_pinned_clock_extractor(clock))


def reset_worker() -> None:
    for key in ("templates", "redirects"):
        if _WORKER.get(key) is not None:
            _WORKER[key].close()
    _WORKER.clear()


def extract_batch(batch: list[tuple[str, str, str, list[str]]]) -> list[str | None]:
    """The ``<doc>`` text of each page (None for a page the extractor failed on, logged)."""
    w = _WORKER
    texts: list[str | None] = []
    for page_id, revid, title, lines in batch:
        buf = io.StringIO()
        try:
            extractor = w["cls"](page_id, revid, w["url_base"], title, lines, templates=w["templates"],
                                 redirects=w["redirects"], **w["kwargs"])
            extractor.extract(buf, True)  # html_safe=True, WikiExtractor's default
            texts.append(buf.getvalue())
        except Exception:  # one odd page must not sink a many-hour run: count it, log it, go on
            log.warning("extract: page id=%s title=%r failed; skipped", page_id, title, exc_info=True)
            texts.append(None)
    return texts


def _pinned_clock_extractor(clock: dict[str, str]) -> type:
    """wikiextractor's Extractor whose clock-based magic words come from ``clock``, not time.strftime.

    ``clean_text`` is 3.1.0's own, with the five ``time.strftime`` values replaced (see the module doc).
    """
    from wikiextractor import extract as wxe

    values = {k: v for k, v in clock.items() if not k.endswith("_iso")}

    class PinnedClockExtractor(wxe.Extractor):
        def clean_text(self, text: str, mark_headers: bool = False, expand_templates: bool = True,
                       html_safe: bool = True) -> list[str]:
            self.magicWords["namespace"] = self.title[:max(0, self.title.find(":"))]
            self.magicWords["pagename"] = self.title
            self.magicWords["fullpagename"] = self.title
            for name, value in values.items():
                self.magicWords[name] = value
            text = wxe.clean(self, text, expand_templates=expand_templates, html_safe=html_safe)
            return wxe.compact(text, mark_headers=mark_headers, extractor=self)

    return PinnedClockExtractor


# -- the DAG's declaration of this stage (core/stage.py) -----------------------------------------------
def _plan_extract(plan: Any) -> list[Any]:
    dl = plan.result("download")
    return [plan.unit(str(dl.path(dl.manifest.files[0].name)), cfg=plan.cfg)]


def _extract_config(p: Any) -> ExtractConfig:
    from core.pools import default_workers

    return ExtractConfig(current_time=p.resolved_current_time(), processes=p.workers or default_workers(),
                         extractor=p.resolved_extractor(), extractor_script=p.extractor_script)


def _check_extract(p: Any) -> None:
    """Before any stage runs: MLPerf's extractor is there (fetched, or the given copy) and checks out."""
    if p.source_kind == "dump" and p.resolved_extractor() == EXTRACTOR_MLPERF:
        from preprocessing.text.mlperf_extractor import script_path

        script_path(p.extractor_script)


DAG_STAGES = (Stage(name="extract", title="WikiExtractor: the dump's articles as text/AA/wiki_00 ...",
                    reads=("download",), run=run_extract, version=STAGE_VERSION, config=ExtractConfig,
                    check=_check_extract,
                    configure=_extract_config, key_params=ExtractConfig.params, plan=_plan_extract,
                    when=lambda p: p.source_kind == "dump"),)
