"""Stage 4, segment: ``do_sentence_segmentation.py`` of the MLPerf reference (``.2`` -> ``.3``).

Spec §5. The file is read with universal newlines (so the ``\\r`` that clean.sh wrote for ``</doc>``
ends a line). For each line: a line of length 1 writes ``"\\n"`` (the article separator); then every
sentence nltk 3.4.5 finds in the line is written stripped, one per line — empty ones included.
A final ``"\\n"`` ends the file.
"""

from __future__ import annotations

from pathlib import Path

from preprocessing.clean import iter_lines, read_utf8, universal_newlines
from preprocessing.punkt_345 import Punkt345

STAGE_VERSION = "1"

_TOKENIZER: Punkt345 | None = None


def tokenizer() -> Punkt345:
    """The process-wide English tokenizer (built once; its decision cache is shared)."""
    global _TOKENIZER
    if _TOKENIZER is None:
        _TOKENIZER = Punkt345()
    return _TOKENIZER


def segment_text(text: str, tok: Punkt345 | None = None) -> str:
    """The ``.3`` text of a ``.2`` file's decoded text."""
    tok = tok or tokenizer()
    out: list[str] = []
    append = out.append
    for line in iter_lines(universal_newlines(text)):
        if len(line) == 1:
            append("\n")
        for sent in tok.tokenize(line):
            append(sent.strip())
            append("\n")
    append("\n")
    return "".join(out)


def segment_file(src: Path, dst: Path) -> tuple[int, int]:
    """Segment one ``.2`` file into ``dst``; returns (input bytes, output bytes)."""
    text = read_utf8(src)
    data = segment_text(text).encode("utf-8")
    dst.write_bytes(data)
    return len(text.encode("utf-8")), len(data)
