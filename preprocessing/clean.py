"""Stage 3, clean: ``cleanup_file.py`` then ``clean.sh`` of the MLPerf reference, in Python.

Spec: ../shared/spec/reference-pipeline.md §3 (cleanup_file.py, ``wiki_nn`` -> ``wiki_nn.1``) and §4
(clean.sh, ``.1`` -> ``.2``). Both are reproduced byte for byte, quirks included:

* cleanup_file reads with universal newlines (a lone ``\\r`` or ``\\r\\n`` ends a line), drops every
  ``<doc ...>`` line (writing ``"\\n"`` in its place) and the line after it (the title), every line
  containing ``</doc>`` and every line of length 1 (the blank lines, or a one-character last line);
* clean.sh is two ``grep -v`` and ~70 GNU ``sed`` substitutions applied in a fixed order. ``sed``
  works line by line, so on the whole text every negated bracket expression also excludes ``\\n``;
  ``grep`` appends a missing final newline. ``s/<\\/doc>/\\r/g`` writes a carriage return, which the
  next stage (universal newlines again) reads as a line break.

The substitutions are applied one after another, exactly in the reference order: merging two of them
into one pass is not equivalent in general (deleting one tag can create another), so instead each
regex runs only when its literal prefix occurs in the text (a C-speed ``in`` test), and plain
deletions use ``str.replace`` (identical to ``s/literal//g``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from preprocessing.manifest import Manifest, StageOutput
from preprocessing.progress import progress
from preprocessing.textio import (
    check_output_dir,
    default_workers,
    iter_lines,
    list_wiki_files,
    ordered_map,
    read_utf8,
    relative_name,
    universal_newlines,
    verify_upstream,
    write_bytes,
)

STAGE_VERSION = "1"

# -- cleanup_file.py ---------------------------------------------------------------------------


def cleanup_file_text(text: str) -> str:
    """``cleanup_file.py`` on one extractor file's decoded text (before newline translation)."""
    out: list[str] = []
    keep_next_line = True
    for line in iter_lines(universal_newlines(text)):
        if not keep_next_line:
            keep_next_line = True
            continue
        if "<doc" in line:
            keep_next_line = False
            out.append("\n")
            continue
        if "</doc>" in line or len(line) == 1:
            continue
        out.append(line)
    return "".join(out)


# -- clean.sh ----------------------------------------------------------------------------------

# grep -v '^<doc [^>]*>$'
_GREP_DOC = re.compile(r"^<doc [^>\n]*>\n", re.M)
# grep -vE '\[\[Category:[^][]*\]\]'
_CATEGORY = re.compile(r"\[\[Category:[^\]\[\n]*\]\]")

_NOT_BAR = r"[^\]|\[\n]*"  # sed [^]|[]* on one line
_NOT_SQ = r"[^\]\[\n]*"  # sed [^][]* on one line

Step = tuple[str, Callable[[str], str]]


def _regex(guard: str, pattern: str, repl: str = "") -> Step:
    rx = re.compile(pattern)
    return guard, (lambda t: rx.sub(repl, t))


def _literal(old: str, new: str = "") -> Step:
    return old, (lambda t: t.replace(old, new))


# The sed commands of clean.sh, in order (spec §4). Each step: (literal that must occur, function).
SED_STEPS: tuple[Step, ...] = (
    _regex("[[", rf"\[\[({_NOT_BAR})\]\]", r"\1"),  # 1  [[x]] -> x
    _regex("[[", rf"\[\[({_NOT_BAR})\]\]", r"\1"),  # 2  (twice)
    _regex("[[", rf"\[\[{_NOT_BAR}\|({_NOT_BAR})\]\]", r"\1"),  # 3  [[a|b]] -> b
    _regex("[[", rf"\[\[{_NOT_BAR}\|({_NOT_BAR})\]\]", r"\1"),  # 4  (twice)
    _regex("ile:", rf"\[\[:*[Ff]ile:{_NOT_SQ}\]\]"),  # 5
    _regex("edia:", rf"\[\[[Mm]edia:{_NOT_SQ}\]\]"),  # 6
    _regex("mage:", rf"\[\[[Ii]mage:{_NOT_SQ}\]\]"),  # 7
    _regex("[", rf"\[({_NOT_BAR})\]", r"\1"),  # 8  [x] -> x (any bracket-free text)
    _regex("[[", rf"\[\[({_NOT_SQ})\]\]"),  # 9
    _literal("alt="),  # 10
    _literal("</doc>", "\r"),  # 11
    _regex("<chem", r"<chem([^<\n]*)</chem>", r"\1"),  # 12
    _regex("<ins", r"<ins([^<\n]*)</ins>", r"\1"),  # 13
    _regex("<, ref ", r"<, ref [^<\n]*</ref>"),  # 14  (sed `\,` is a literal comma)
    _regex("<includeonly", r"<includeonly[^<\n]*</includeonly>"),  # 15
    _regex("<graph", r"<graph[^<\n]*</graph>"),  # 16
    _regex("<section", r"<section[^\\\n]*/>"),  # 17  [^\\] = anything but a backslash
    _regex("<meta", r"<meta[^\\\n]*/>"),  # 18
    _regex("<hr", r"<hr[^\\\n]*/>"),  # 19
    _regex("<gallery", r"<gallery[^>\n]*>"),  # 20
    _regex("<ref", r"<ref[^<\n]*</ref>"),  # 21
    _regex("<ref", r"<ref[^>\n]*>"),  # 22
    _regex("<http", r"<http[^>\n]*>"),  # 23
    _regex("<Ref", r"<Ref[^>\n]*>"),  # 24
    _regex("<mapframe ", r"<mapframe [^\\/\n]*/>"),  # 25  GNU sed: [^\/] excludes '\' and '/'
    _regex("<mapframe", r"<mapframe[^>\n]*>"),  # 26
    _literal("</mapframe>"),
    _literal("<poem>"),
    _literal("</poem>"),
    _literal("<math>"),
    _literal("</math>"),
    _literal("<ref>"),
    _literal("</ref>"),
    _regex("<div", r"<div[^>\n]*>"),
    _regex("</div", r"</div[^>\n]*>"),
    _literal("</div style>"),
    _literal("</div>"),
    *(_literal(tag) for tag in (
        "<sup>", "</sup>", "<br>", "</br>", "<BR>", "</BR>", "<Br>", "</Br>", "<del>", "</del>",
        "<nowiki>", "</nowiki>", "<NOWIKI>", "</NOWIKI>", "<onlyinclude>", "</onlyinclude>",
        "<includeonly>", "</includeonly>", "<small>", "</small>", "<chem>", "</chem>",
        "<noinclude>", "</noinclude>", "<gallery>", "</gallery>", "<graph>{", "<graph>", "}</graph>",
        "</graph>", "</references>",
    )),
    _regex("<poem ", r"<poem [^>\n]*>"),
)


def _drop_category_lines(text: str) -> str:
    if "[[Category:" not in text:
        return text
    return "".join(line for line in iter_lines(text) if not _CATEGORY.search(line))


def clean_sh_text(text: str) -> str:
    """``clean.sh`` on the text of a ``.1`` file (only ``\\n`` line ends, as cleanup_file writes)."""
    if text and not text.endswith("\n"):
        text += "\n"  # grep terminates the last line
    if "<doc " in text:
        text = _GREP_DOC.sub("", text)
    text = _drop_category_lines(text)
    for guard, step in SED_STEPS:
        if guard in text:
            text = step(text)
    return text


# -- files -------------------------------------------------------------------------------------


def clean_text(raw: str) -> tuple[str, str]:
    """Both clean steps on one extractor file's text: returns (``.1`` text, ``.2`` text)."""
    one = cleanup_file_text(raw)
    return one, clean_sh_text(one)


def clean_file(src: Path) -> tuple[bytes, bytes]:
    """Clean one extractor file: returns the ``.1`` and ``.2`` bytes."""
    one, two = clean_text(read_utf8(src))
    return one.encode("utf-8"), two.encode("utf-8")


@dataclass(frozen=True, kw_only=True)
class CleanConfig:
    keep_cleanup_output: bool = False  # also write the ``.1`` files (cleanup_file.py's output)
    workers: int = 0  # processes; 0 = one per CPU (output does not depend on it)


def run_clean(extracted_dir: Path, out_dir: Path, cfg: CleanConfig = CleanConfig(),
              upstream: Sequence[Manifest] = ()) -> Manifest:
    """Clean every ``<extracted_dir>/*/wiki_??`` into ``<out_dir>/*/wiki_??.2`` (and ``.1``)."""
    extracted_dir, out_dir = Path(extracted_dir), Path(out_dir)
    files = list_wiki_files(extracted_dir, what="extractor output folder")
    verify_upstream(extracted_dir, upstream)
    check_output_dir(out_dir)
    params = {"keep_cleanup_output": cfg.keep_cleanup_output}
    with StageOutput(out_dir, "clean", params=params, upstream=upstream, code_version=STAGE_VERSION) as out:
        results = ordered_map(clean_file, files, cfg.workers or default_workers())
        for base, (one, two) in progress(zip(files, results, strict=True), total=len(files), desc="clean", unit="file"):
            name = relative_name(base, extracted_dir)
            if cfg.keep_cleanup_output:
                write_bytes(out, name + ".1", one)
            write_bytes(out, name + ".2", two)
            out.count("files")
            out.count("bytes_in", base.stat().st_size)
            out.count("bytes_out", len(two))
    return out.manifest
