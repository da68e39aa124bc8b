"""Stage 6, gather: ``do_gather.py`` of the MLPerf reference (``.4`` files -> part files).

Spec §7. Files are taken in sorted order and appended to ``part-00000-of-00500``, ``part-00001-...``;
a new part starts when the running total would exceed ``block_size_mb * 1024 * 1024`` — the size
counted is that of the **raw extractor file** (``wiki_nn``), not of the ``.4`` text. Each ``.4`` is
read as ``utf-8-sig`` with universal newlines, and when it ends with ``"\\n\\n"`` one ``"\\n"`` is
dropped (so articles stay separated by exactly one blank line across files).

Where the reference crashes we raise a clear error instead (a ``.4`` shorter than 2 characters) or,
for a first file alone larger than a block (``None.close()`` in the reference), simply start part 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from core.errors import InputError
from core.manifest import Manifest, StageOutput
from core.progress import progress
from preprocessing.text.textio import (
    check_input_dir,
    check_output_dir,
    list_wiki_files,
    read_utf8,
    universal_newlines,
    verify_upstream,
)

STAGE_VERSION = "1"


@dataclass(frozen=True, kw_only=True)
class GatherConfig:
    block_size_mb: float = 26.92  # part size limit in MiB of raw extractor input (reference --block_size)
    num_outputs: int = 500  # only used in the names: part-XXXXX-of-<num_outputs>
    worker_id: int = 0  # reference nworker id; parts are numbered count + 1000*worker_id


def part_name(index: int, cfg: GatherConfig) -> str:
    return f"part-{str(index + 1000 * cfg.worker_id).zfill(5)}-of-{str(cfg.num_outputs).zfill(5)}"


def gather_content(text: str, name: str = "") -> str:
    """What do_gather appends for one ``.4`` text (BOM and newline handling, last ``\\n`` dropped)."""
    if text.startswith("\ufeff"):
        text = text[1:]  # utf-8-sig
    text = universal_newlines(text)
    if len(text) < 2:
        raise InputError(f"{name or 'a .4 file'} holds {len(text)} characters: every article of it went to the "
                         "eval set (the reference crashes here); lower --num-test-articles")
    if text[-1] == text[-2] == "\n":
        text = text[:-1]
    return text


class PartWriter:
    """Appends texts to part files, starting a new part as do_gather does."""

    def __init__(self, out: StageOutput, cfg: GatherConfig) -> None:
        self.out, self.cfg = out, cfg
        self.limit = cfg.block_size_mb * 1024 * 1024
        self.count, self.total = 0, 0
        self._cm: AbstractContextManager[IO[str]] | None = None
        self._f: IO[str] | None = None
        self.names: list[str] = []

    def add(self, raw_size: int, text: str) -> None:
        if self._f is not None and self.limit < self.total + raw_size:
            self.close()
            self.count += 1
            self.total = 0
        if self._f is None:
            self.names.append(part_name(self.count, self.cfg))
            self._cm = self.out.open_text(self.names[-1])
            self._f = self._cm.__enter__()
        self.total += raw_size
        self._f.write(text)

    def close(self, exc: BaseException | None = None) -> None:
        if self._cm is not None:
            cm, self._cm, self._f = self._cm, None, None
            if exc is None:
                cm.__exit__(None, None, None)
            else:
                cm.__exit__(type(exc), exc, exc.__traceback__)


def gather_into(out: StageOutput, items: Iterable[tuple[int, str, str]], cfg: GatherConfig) -> list[str]:
    """Write (raw size, ``.4`` text, name) items, in order, as part files; returns the part names."""
    writer = PartWriter(out, cfg)
    try:
        for raw_size, text, name in items:
            writer.add(raw_size, gather_content(text, name))
            out.count("files")
    except BaseException as exc:
        writer.close(exc)
        raise
    writer.close()
    out.count("parts", len(writer.names))
    return writer.names


def _read_items(files: Sequence[Path], raw_dir: Path, in_dir: Path) -> Iterator[tuple[int, str, str]]:
    for base in files:
        raw = raw_dir / base.relative_to(in_dir)
        try:
            raw_size = raw.stat().st_size
        except FileNotFoundError:
            raise InputError(f"{raw} is missing: do_gather sizes parts by the raw extractor files; "
                             "pass the extractor output folder") from None
        path = Path(str(base) + ".4")
        yield raw_size, read_utf8(path), str(path)


def run_gather(in_dir: Path, out_dir: Path, cfg: GatherConfig = GatherConfig(), *,
               raw_dir: Path | None = None, upstream: Sequence[Any] = ()) -> Manifest:
    """``<in_dir>/*/wiki_??.4`` -> ``<out_dir>/part-XXXXX-of-00500`` (sizes from ``raw_dir``)."""
    in_dir, out_dir = Path(in_dir), Path(out_dir)
    raw_dir = check_input_dir(raw_dir or in_dir, "extractor output folder")
    files = list_wiki_files(in_dir, ".4", what="split text folder")
    verify_upstream(in_dir, upstream)
    check_output_dir(out_dir, in_dir)
    if cfg.block_size_mb <= 0:
        raise InputError(f"--block-size-mb must be > 0, got {cfg.block_size_mb}")
    params = {"block_size_mb": cfg.block_size_mb, "num_outputs": cfg.num_outputs, "worker_id": cfg.worker_id}
    with StageOutput(out_dir, "gather", params=params, upstream=upstream, code_version=STAGE_VERSION) as out:
        items = progress(_read_items(files, raw_dir, in_dir), total=len(files), desc="gather", unit="file")
        gather_into(out, items, cfg)
    return out.manifest
