"""Stage 4, segment: ``do_sentence_segmentation.py`` of the MLPerf reference (``.2`` -> ``.3``).

Spec §5. The file is read with universal newlines (so the ``\\r`` that clean.sh wrote for ``</doc>``
ends a line). For each line: a line of length 1 writes ``"\\n"`` (the article separator); then every
sentence nltk 3.4.5 finds in the line is written stripped, one per line — empty ones included.
A final ``"\\n"`` ends the file.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from core.manifest import Manifest, StageOutput
from core.pools import default_workers, ordered_map
from core.progress import progress
from preprocessing.text.punkt_345 import Punkt345
from preprocessing.text.textio import (
    check_output_dir,
    iter_lines,
    list_wiki_files,
    read_utf8,
    relative_name,
    universal_newlines,
    verify_upstream,
    write_bytes,
)

STAGE_VERSION = "1"

_TOKENIZER: Punkt345 | None = None


def tokenizer() -> Punkt345:
    """The process-wide English tokenizer (built once; its decision cache is shared)."""
    global _TOKENIZER
    if _TOKENIZER is None:
        _TOKENIZER = Punkt345()
    return _TOKENIZER


class SentenceSplitter(Protocol):
    def tokenize(self, text: str) -> list[str]: ...


def segment_text(text: str, tok: SentenceSplitter | None = None) -> str:
    """The ``.3`` text of a ``.2`` file's decoded text (``tok``: default the nltk 3.4.5 English Punkt)."""
    tok = tok or tokenizer()
    split = tok.tokenize
    out: list[str] = []
    append = out.append
    for line in iter_lines(universal_newlines(text)):
        if len(line) == 1:
            append("\n")
        for sent in split(line):
            append(sent.strip())
            append("\n")
    append("\n")
    return "".join(out)


def segment_file(base: Path, suffix: str = ".2") -> bytes:
    """The ``.3`` bytes of the file ``<base><suffix>``."""
    return segment_text(read_utf8(Path(str(base) + suffix))).encode("utf-8")


@dataclass(frozen=True, kw_only=True)
class SegmentConfig:
    workers: int = 0  # processes; 0 = one per CPU (output does not depend on it)


def run_segment(in_dir: Path, out_dir: Path, cfg: SegmentConfig = SegmentConfig(),
                upstream: Sequence[Manifest] = ()) -> Manifest:
    """Segment every ``<in_dir>/*/wiki_??.2`` into ``<out_dir>/*/wiki_??.3``."""
    in_dir, out_dir = Path(in_dir), Path(out_dir)
    files = list_wiki_files(in_dir, ".2", what="cleaned text folder")
    verify_upstream(in_dir, upstream)
    check_output_dir(out_dir, in_dir)
    with StageOutput(out_dir, "segment", params={}, upstream=upstream, code_version=STAGE_VERSION) as out:
        results = ordered_map(segment_file, files, cfg.workers or default_workers())
        for base, data in progress(zip(files, results, strict=True), total=len(files), desc="segment", unit="file"):
            write_bytes(out, relative_name(base, in_dir, ".3"), data)
            out.count("files")
            out.count("bytes_out", len(data))
    return out.manifest
