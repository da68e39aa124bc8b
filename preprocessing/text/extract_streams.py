"""Reading dumps for the extract stage: one read-ahead thread, or, for multistream bz2, the workers.

``open_lines`` gives the text lines of a ``.xml.bz2`` (or ``.xml``) dump, decompressed by a background thread
(bz2 releases the GIL) ahead of the parser, with decoding errors turned into InputErrors naming the file.

Wikimedia's ``pages-articles-multistream.xml.bz2`` is a concatenation of independent bz2 streams of 100
``<page>``s each (the first holds the ``<siteinfo>`` header, the last ``</mediawiki>``). Decompressing the
dump is about half of the extract stage's single-process time and is done twice (template scan, then
extraction), so with one reader the workers starve. Here each worker decompresses and parses its own range
of streams: the template scan returns the template pages of its range, the extraction the ``<doc>`` texts.
The main process only orders results, so the output is byte-identical to the serial reader's.

A file whose streams do not end on page boundaries (e.g. made by ``pbzip2``, which cuts at fixed sizes) is
detected during the template scan, before any output, and read serially instead.
"""

from __future__ import annotations

import bz2
import io
import logging
import queue
import re
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from core.errors import InputError
from core.pools import ordered_map
from core.progress import progress

log = logging.getLogger(__name__)

_STREAM_START = re.compile(rb"BZh[1-9]1AY&SY")  # stream header + first block magic (pi)
_MIN_CHUNK, _MAX_CHUNK = 256 << 10, 4 << 20  # compressed bytes per job (4 MB: ~20 MB of XML)


@contextmanager
def open_lines(dump: Path, desc: str) -> Iterator[Iterator[str]]:
    """The dump's text lines (bz2 or plain XML), with a progress bar over the file's bytes.

    Decoding problems surface as InputError naming the file, wherever in the stream they happen.
    """
    with open(dump, "rb") as raw:
        magic = raw.read(3)
        raw.seek(0)
        if magic == b"BZh":
            stream: io.IOBase = io.BufferedReader(ReadAhead(bz2.BZ2File(raw)), 1 << 20)
        elif dump.suffix == ".bz2":
            raise InputError(f"{dump} is not a bz2 file (it does not start with 'BZh'); "
                             "give the .xml.bz2 dump as downloaded, or an uncompressed .xml")
        else:
            stream = raw
        text = io.TextIOWrapper(stream, encoding="utf-8")
        size = dump.stat().st_size

        def lines() -> Iterator[str]:
            with progress(total=size, desc=desc, unit="B", unit_scale=True) as bar:
                n, seen = 0, 0
                try:
                    for line in text:
                        yield line
                        n += 1
                        if n % 4096 == 0:
                            bar.update(raw.tell() - seen)
                            seen = raw.tell()
                except EOFError:
                    raise InputError(f"{dump} is truncated (the bz2 stream ends early); download it again") from None
                except OSError as exc:
                    raise InputError(f"{dump} is not a valid bz2 file ({exc}); download it again") from None
                except UnicodeDecodeError as exc:
                    raise InputError(f"{dump} is not UTF-8 text at byte {exc.start} of a line ({exc.reason})") from None
                bar.update(size - seen)

        try:
            yield lines()
        finally:
            text.close()  # stops the read-ahead thread before the file closes


class ReadAhead(io.RawIOBase):
    """Decompress in a background thread (bz2 releases the GIL) while the caller parses the text."""

    def __init__(self, stream: io.IOBase, block: int = 1 << 20, depth: int = 8) -> None:
        super().__init__()
        self._q: queue.Queue = queue.Queue(depth)
        self._buf, self._stop = b"", threading.Event()
        self._end: bytes | BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(stream, block), daemon=True)
        self._thread.start()

    def _run(self, stream: io.IOBase, block: int) -> None:
        try:
            while not self._stop.is_set():
                data = stream.read(block)
                self._put(data)
                if not data:
                    return
        except BaseException as exc:  # EOFError (truncated), OSError (not bz2): re-raised in the reader
            self._put(exc)

    def _put(self, item: object) -> None:
        while not self._stop.is_set():
            try:
                self._q.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:  # type: ignore[override]
        if not self._buf:
            if self._end is None:
                item = self._q.get()
                if isinstance(item, BaseException) or not item:
                    self._end = item  # EOF (b"") or the error: every later read returns the same
                else:
                    self._buf = item
            if isinstance(self._end, BaseException):
                raise self._end
        n = min(len(b), len(self._buf))
        b[:n] = self._buf[:n]
        self._buf = self._buf[n:]
        return n

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        super().close()


def plan_chunks(dump: Path, processes: int) -> list[tuple[int, int]]:
    """Byte ranges of whole bz2 streams, a few per worker; [] when the file has a single stream."""
    offsets = stream_offsets(dump)
    size = dump.stat().st_size
    if len(offsets) < 2 or offsets[0] != 0:
        return []
    target = min(_MAX_CHUNK, max(_MIN_CHUNK, size // (8 * max(1, processes))))
    chunks, start = [], 0
    for off in offsets[1:]:
        if off - start >= target:
            chunks.append((start, off))
            start = off
    chunks.append((start, size))
    return chunks if len(chunks) > 1 else []


def stream_offsets(dump: Path, block: int = 16 << 20, give_up: int = 64 << 20) -> list[int]:
    """Offsets of the bz2 stream headers in ``dump`` (candidates: confirmed when decompressed).

    Stops after ``give_up`` bytes without a second stream (a single-stream dump is not read twice for this).
    """
    offsets: list[int] = []
    pos, tail = 0, b""
    with open(dump, "rb") as f:
        while (len(offsets) > 1 or pos < give_up) and (data := f.read(block)):
            buf, base = tail + data, pos - len(tail)
            for m in _STREAM_START.finditer(buf):
                if not offsets or base + m.start() > offsets[-1]:
                    offsets.append(base + m.start())
            tail, pos = buf[-9:], pos + len(data)
    return offsets


def scan_templates(dump: Path, chunks: Sequence[tuple[int, int]], template_prefix: str, processes: int,
                   builders: tuple[Any, Any]) -> int | None:
    """Template pass over the chunks in ``processes`` workers, feeding ``builders`` in dump order.

    Returns the number of template pages, or None when the streams are not page-aligned (read serially).
    """
    jobs = [(str(dump), s, e, k == 0, k == len(chunks) - 1, template_prefix) for k, (s, e) in enumerate(chunks)]
    count = 0
    for result in ordered(scan_chunk, jobs, processes, [e - s for s, e in chunks], f"templates {dump.name}"):
        if result is None:
            log.info("extract: %s has bz2 streams that split pages; reading it serially", dump)
            return None
        templates, redirects = result
        for title, text in templates:
            builders[0].add(title, text)
        for title, target in redirects:
            builders[1].add(title, target)
        count += len(templates) + len(redirects)
    return count


def extract_chunks(dump: Path, chunks: Sequence[tuple[int, int]], processes: int, init: Callable[..., None],
                   initargs: tuple) -> Iterator[list[str | None]]:
    """Extraction pass: the ``<doc>`` texts of each chunk, in dump order."""
    jobs = [(str(dump), s, e) for s, e in chunks]
    yield from ordered(extract_chunk, jobs, processes, [e - s for s, e in chunks], f"extract {dump.name}",
                       init, initargs)


def ordered(fn: Callable[[tuple], Any], jobs: Sequence[tuple], processes: int, sizes: Sequence[int], desc: str,
            init: Callable[..., None] | None = None, initargs: tuple = ()) -> Iterator[Any]:
    """``fn`` over ``jobs`` in ``processes`` workers (in-process for 1), results in job order.

    At most two jobs per worker are in flight, so memory stays bounded on a 20 GB dump. A job that
    returns an ``("error", message)`` tuple raises InputError(message) here.
    """
    with progress(total=sum(sizes), desc=desc, unit="B", unit_scale=True) as bar:
        if processes <= 1:
            if init:
                init(*initargs)
            for job, size in zip(jobs, sizes, strict=True):
                yield _checked(fn(job))
                bar.update(size)
            return
        for result, size in zip(ordered_map(fn, jobs, processes, initializer=init, initargs=initargs), sizes,
                                strict=True):
            yield _checked(result)
            bar.update(size)


def _checked(result: Any) -> Any:
    if isinstance(result, tuple) and len(result) == 2 and result[0] == "error":
        raise InputError(result[1])
    return result


# -- worker side --------------------------------------------------------------------------------------
class _Collect:
    """Stands in for template_blob's builder inside a worker: keeps (title, text) pairs in order."""

    def __init__(self) -> None:
        self.items: list[tuple[str, str]] = []

    def add(self, title: str, text: str) -> None:
        self.items.append((title, text))


def _read_chunk_bytes(dump: str, start: int, end: int) -> bytes:
    """The decompressed bytes of one range of whole bz2 streams (raises _ChunkError naming the file)."""
    with open(dump, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    try:
        return bz2.decompress(data)
    except (EOFError, ValueError):
        raise _ChunkError(f"{dump} is truncated (the bz2 stream at byte {start} ends early); download it again") from None
    except OSError as exc:
        raise _ChunkError(f"{dump} is not a valid bz2 file at bytes {start}-{end} ({exc}); download it again") from None


def _read_chunk(dump: str, start: int, end: int) -> str:
    with open(dump, "rb") as f:
        f.seek(start)
        data = f.read(end - start)
    try:
        raw = bz2.decompress(data)
    except (EOFError, ValueError):
        raise _ChunkError(f"{dump} is truncated (the bz2 stream at byte {start} ends early); download it again") from None
    except OSError as exc:
        raise _ChunkError(f"{dump} is not a valid bz2 file at bytes {start}-{end} ({exc}); download it again") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _ChunkError(f"{dump} is not UTF-8 text near byte {exc.start} of the stream at {start}") from None


class _ChunkError(Exception):
    pass


def _aligned(text: str, first: bool, last: bool) -> bool:
    """The range starts and ends on page boundaries (Wikimedia's multistream dumps have the header and the closing
    ``</mediawiki>`` in streams of their own: a first range may be the header alone, a last one the tag)."""
    head, tail = text.lstrip(), text.rstrip()
    return ((first or head.startswith("<page>") or (last and head.startswith("</mediawiki>")))
            and (tail.endswith("</page>") or (last and tail.endswith("</mediawiki>"))
                 or (first and tail.endswith("</siteinfo>"))))


def scan_chunk(job: tuple) -> tuple | None:
    """Worker: the template and redirect definitions of one chunk (None if it splits a page)."""
    from wikiextractor.WikiExtractor import load_templates

    dump, start, end, first, last, prefix = job
    try:
        text = _read_chunk(dump, start, end)
    except _ChunkError as exc:
        return ("error", str(exc))
    if not _aligned(text, first, last):
        return None
    templates, redirects = _Collect(), _Collect()
    load_templates(io.StringIO(text, newline=None), blob_builder=templates, redirects_blob_builder=redirects,
                   template_prefix=prefix)
    return templates.items, redirects.items


def extract_chunk(job: tuple) -> list[str | None] | tuple[str, str]:
    """Worker: the ``<doc>`` text of every article page of one chunk (needs extract.init_worker)."""
    from wikiextractor.WikiExtractor import collect_pages

    from preprocessing.text.extract import extract_batch

    dump, start, end = job
    try:
        text = _read_chunk(dump, start, end)
    except _ChunkError as exc:
        return ("error", str(exc))
    return extract_batch(list(collect_pages(io.StringIO(text, newline=None))))


def to_multistream(xml: bytes, pages_per_stream: int = 100) -> bytes:
    """Re-pack a dump the way Wikimedia's -multistream files are: header, then N pages per bz2 stream.

    For tests and benchmarks (the shipped test dumps are single-stream).
    """
    starts = [m.start() for m in re.finditer(rb"^\s*<page>", xml, re.M)]
    cuts = [0] + starts[::pages_per_stream] + [xml.rfind(b"</mediawiki>")] if starts else [0]
    cuts = sorted(set(c for c in cuts if c >= 0)) + [len(xml)]
    return b"".join(bz2.compress(xml[a:b], 9) for a, b in zip(cuts, cuts[1:], strict=False) if b > a)
