"""File helpers shared by the text stages (clean, segment, split_eval, gather).

The reference scripts address files as ``sorted(glob('<dir>/*/wiki_??'))`` plus a suffix; so do
we: :func:`list_wiki_files` returns the base paths (without suffix) in that exact order.
"""

from __future__ import annotations

import glob
import logging
import os
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from core.errors import InputError

log = logging.getLogger(__name__)


def universal_newlines(text: str) -> str:
    """What Python's text mode (``newline=None``) makes of ``\\r\\n`` and a lone ``\\r``: ``\\n``."""
    if "\r" not in text:
        return text
    return text.replace("\r\n", "\n").replace("\r", "\n")


def iter_lines(text: str) -> list[str]:
    """The lines of ``text`` as a text-mode file yields them: split after each ``\\n``, kept."""
    lines = text.split("\n")
    last = lines.pop()
    out = [line + "\n" for line in lines]
    if last:
        out.append(last)
    return out


def read_utf8(path: Path) -> str:
    """A file's text, strictly UTF-8 (as the reference reads it); a clear error otherwise."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        raise InputError(f"{path} does not exist") from None
    except IsADirectoryError:
        raise InputError(f"{path} is a directory, expected a text file") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InputError(f"{path} is not valid UTF-8 (byte offset {exc.start}); expected text written "
                         "by WikiExtractor or an earlier bertpipe text stage") from None


def check_input_dir(path: Path, what: str) -> Path:
    """``path`` as an existing directory, or an InputError naming it."""
    path = Path(path)
    if not path.exists():
        raise InputError(f"{what} {path} does not exist")
    if not path.is_dir():
        raise InputError(f"{what} {path} is not a directory")
    return path


def check_output_dir(path: Path, input_dir: Path | None = None) -> Path:
    """Create ``path`` (and parents) or raise an InputError that names it.

    With ``input_dir``, also refuse to write into the input folder (it may be read-only or shared).
    """
    path = Path(path)
    if input_dir is not None and path.resolve() == Path(input_dir).resolve():
        raise InputError(f"--out {path} is the input folder; choose another output folder "
                         "(stages never write into their input)")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        raise InputError(f"cannot create output folder {path}: a part of that path is a file; "
                         "choose another --out") from None
    except PermissionError:
        raise InputError(f"cannot create output folder {path}: permission denied; choose another --out") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise InputError(f"output folder {path} is not writable; choose another --out")
    return path


def list_wiki_files(root: Path, suffix: str = "", what: str = "input folder") -> list[Path]:
    """``sorted(glob('<root>/*/wiki_??'))`` whose ``<base><suffix>`` exists, as base paths.

    Raises InputError when ``root`` is missing or holds no such file.
    """
    root = check_input_dir(root, what)
    pattern = os.path.join(glob.escape(str(root)), "*", "wiki_??" + glob.escape(suffix))
    found = sorted(glob.glob(pattern))
    if not found:
        raise InputError(f"{what} {root} holds no */wiki_??{suffix} files (expected the WikiExtractor "
                         f"layout {root}/AA/wiki_00{suffix}, ...)")
    for p in found:  # glob also lists directories and broken links of that name: refuse them by name
        if not os.path.isfile(p):
            why = "a symbolic link to nothing" if os.path.islink(p) and not os.path.exists(p) else "not a file"
            raise InputError(f"{p} is {why}; {what} {root} must hold only text files named */wiki_??{suffix}")
    return [Path(p[: len(p) - len(suffix)] if suffix else p) for p in found]


def relative_name(base: Path, root: Path, suffix: str = "") -> str:
    """``AA/wiki_00<suffix>`` for a base path under ``root`` ('/'-separated)."""
    return Path(base).relative_to(root).as_posix() + suffix


def total_bytes(paths: Iterable[Path]) -> int:
    return sum(Path(p).stat().st_size for p in paths)


def write_bytes(out: Any, name: str, data: bytes) -> None:
    """Write ``data`` as ``name`` through a StageOutput (temp name, md5, rename)."""
    with out.open(name) as f:
        f.write(data)


def verify_upstream(root: Path, upstream: Sequence[Any]) -> None:
    """Check every file listed in the upstream manifests that lives under ``root`` (size and md5)."""
    from core.manifest import verify_file

    for m in upstream:
        for f in m.files:
            verify_file(Path(root) / f.name, f.md5, f.bytes, what=f"listed in the {m.stage} manifest")
