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
into one pass is not equivalent in general (deleting one tag can create another). Speed comes from
elsewhere: only the lines a step can touch (~2% of Wikipedia text) go through the chain, each regex
runs only when its literal prefix occurs (a C-speed ``in`` test), and plain deletions use
``str.replace`` (identical to ``s/literal//g``).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from core.manifest import Manifest, StageOutput
from core.pools import default_workers, ordered_map
from core.progress import progress
from preprocessing.text.textio import (
    check_output_dir,
    list_wiki_files,
    read_utf8,
    relative_name,
    universal_newlines,
    verify_upstream,
    write_bytes,
)

STAGE_VERSION = "1"

log = logging.getLogger(__name__)

# -- cleanup_file.py ---------------------------------------------------------------------------


def cleanup_file_text(text: str) -> str:
    """``cleanup_file.py`` on one extractor file's decoded text (before newline translation)."""
    lines = universal_newlines(text).split("\n")
    tail = lines.pop()  # a last line without "\n" ("" when the text ends with one)
    out: list[str] = []
    keep_next_line = True
    for line in lines:  # each line without its "\n": len(line) == 1 in the reference <=> line == ""
        if not keep_next_line:
            keep_next_line = True
        elif "<doc" in line:
            keep_next_line = False
            out.append("")
        elif line and "</doc>" not in line:
            out.append(line)
    result = "\n".join(out) + "\n" if out else ""
    if tail and keep_next_line:
        if "<doc" in tail:
            result += "\n"
        elif len(tail) > 1 and "</doc>" not in tail:
            result += tail
    return result


# -- clean.sh ----------------------------------------------------------------------------------

# grep -v '^<doc [^>]*>$' (matched against one line)
_GREP_DOC = re.compile(r"<doc [^>\n]*>")
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


def _apply_seds(text: str) -> str:
    for guard, step in SED_STEPS:
        if guard in text:
            text = step(text)
    return text


def _touched_lines(text: str) -> list[tuple[int, int]]:
    """(start, end) of every line that a grep or sed step can act on: all their patterns start with
    '[', '<' or 'alt='. ``text`` ends with "\\n"; ``end`` is the index of the line's "\\n"."""
    spans: set[tuple[int, int]] = set()
    for needle in ("[", "<", "alt="):
        i = text.find(needle)
        while i != -1:
            start, end = text.rfind("\n", 0, i) + 1, text.find("\n", i)
            spans.add((start, end))
            i = text.find(needle, end)
    return sorted(spans)


def _grep_drops(line: str) -> bool:
    return _GREP_DOC.fullmatch(line) is not None or _CATEGORY.search(line) is not None


def clean_sh_text(text: str) -> str:
    """``clean.sh`` on the text of a ``.1`` file (only ``\\n`` line ends, as cleanup_file writes).

    grep and sed work line by line and no step adds or removes a ``\\n``, so only the few lines a
    step can touch (~2% of Wikipedia text) are filtered and run through the seds (joined by
    ``\\n``); every other line is provably unchanged.
    """
    if text and not text.endswith("\n"):
        text += "\n"  # grep terminates the last line
    spans = [(s, e) for s, e in _touched_lines(text)]
    if not spans:
        return text
    drop = {(s, e) for s, e in spans if _grep_drops(text[s:e])}
    kept = [(s, e) for s, e in spans if (s, e) not in drop]
    new = iter(_apply_seds("\n".join(text[s:e] for s, e in kept)).split("\n")) if kept else iter(())
    pieces: list[str] = []
    pos = 0
    for s, e in spans:
        pieces.append(text[pos:s])
        if (s, e) in drop:
            pos = e + 1  # the line and its newline go
        else:
            pieces.append(next(new))
            pos = e
    pieces.append(text[pos:])
    if next(new, None) is not None:  # pragma: no cover - invariant
        raise AssertionError("a sed step changed the number of lines")
    return "".join(pieces)


def clean_text(raw: str) -> tuple[str, str]:
    """Both clean steps on one extractor file's text: returns (``.1`` text, ``.2`` text)."""
    one = cleanup_file_text(raw)
    return one, clean_sh_text(one)


NUL_WARNING = ("{path} contains a NUL character: GNU grep in the reference clean.sh treats such a file as "
               "binary and drops (some of) its lines, depending on grep's version and buffer size; "
               "bertpipe keeps them, so this file may differ from the reference's")


def warn_nul(path: object, text: str) -> bool:
    """Log (and return True) when ``text`` holds a NUL: the one input where clean.sh is not reproducible."""
    if "\x00" not in text:
        return False
    log.warning(NUL_WARNING.format(path=path))
    return True


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
    check_output_dir(out_dir, extracted_dir)
    params = {"keep_cleanup_output": cfg.keep_cleanup_output}
    with StageOutput(out_dir, "clean", params=params, upstream=upstream, code_version=STAGE_VERSION) as out:
        results = ordered_map(clean_file, files, cfg.workers or default_workers())
        for base, (one, two) in progress(zip(files, results, strict=True), total=len(files), desc="clean", unit="file"):
            name = relative_name(base, extracted_dir)
            if cfg.keep_cleanup_output:
                write_bytes(out, name + ".1", one)
            write_bytes(out, name + ".2", two)
            if b"\x00" in one:
                warn_nul(base, "\x00")
                out.count("files_with_nul")
            out.count("files")
            out.count("bytes_in", base.stat().st_size)
            out.count("bytes_out", len(two))
    return out.manifest
