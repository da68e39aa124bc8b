"""Checks of a command's input and output paths, before anything is read or written.

Every ``bertpipe`` command passes its paths through :class:`PathCheck` first. It refuses, with one
:class:`~core.errors.InputError` line naming the flag, the path and what to do:

* an input that is missing, a directory where a file is expected (or the reverse), not a regular file
  (a FIFO would block the reader), or unreadable;
* an output that is the same file as an input, by any spelling: ``..``, ``./``, an absolute path, a
  symlink or a hard link (compared by ``os.path.realpath`` and by ``(st_dev, st_ino)``);
* an output folder whose planned files would replace an input inside it, or that *is* an input folder;
* an output folder (or its nearest existing parent) that is a file, or is not writable;
* an output folder that already holds another data set (a different stage's ``_manifest.json``, or a
  vocab), unless the command's ``--overwrite`` was given.

Mode bits are honoured even when running as root: a file or folder without any write bit is treated
as read-only, one without any read bit as unreadable (root would otherwise write over a file that the
user protected with ``chmod a-w``).

An existing output that is not an input may be replaced, as the reference scripts do.
"""

from __future__ import annotations

import json
import os
import stat
from collections.abc import Iterable
from pathlib import Path

from core.errors import InputError

MANIFEST_NAME = "_manifest.json"


def _stat(path: Path, flag: str = "") -> os.stat_result | None:
    try:
        return os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:  # ELOOP (a symlink loop), EACCES on a parent, ENAMETOOLONG ...
        raise InputError(f"{_flag(flag)}{path}: {exc.strerror}; check the path") from None


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    """Whether ``a`` and ``b`` name one file: same real path, or the same inode (a hard link)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        sa, sb = os.stat(a), os.stat(b)
    except OSError:
        return False
    return (sa.st_dev, sa.st_ino) == (sb.st_dev, sb.st_ino)


def _readable(st: os.stat_result, path: Path) -> bool:
    return bool(st.st_mode & 0o444) and os.access(path, os.R_OK)


def _writable_dir(st: os.stat_result, path: Path) -> bool:
    if not st.st_mode & 0o222 or not os.access(path, os.W_OK | os.X_OK):
        return False
    try:
        return not os.statvfs(path).f_flag & os.ST_RDONLY
    except (OSError, AttributeError):
        return True


def _flag(flag: str) -> str:
    return f"{flag} " if flag else ""


def _path(flag: str, path: str | os.PathLike) -> Path:
    if not str(path).strip():
        raise InputError(f"{flag or 'a path'} is empty; give a path")
    return Path(path)


def check_suffix(flag: str, suffix: str) -> str:
    """A file-name suffix (``--output_suffix``): no path separator, so it cannot leave its folder."""
    if "/" in suffix or os.sep in suffix or (os.altsep and os.altsep in suffix) or "\0" in suffix:
        raise InputError(f"{flag} {suffix!r} contains a path separator: it must be a file-name suffix such as "
                         "'.tfrecord' (outputs stay in --output_dir)")
    return suffix


class PathCheck:
    """Collects a command's inputs, then checks each output against all of them.

    Declare the inputs first (:meth:`input_file`, :meth:`input_dir`, :meth:`input_files`), then the
    outputs (:meth:`output_file`, :meth:`output_dir`). Every method returns the path as a ``Path``.
    """

    def __init__(self, overwrite: bool = False) -> None:
        self.overwrite = overwrite
        self.inputs: list[tuple[str, Path]] = []  # (flag, path): files and folders read
        self.input_dirs: list[tuple[str, Path]] = []

    # -- inputs --------------------------------------------------------------------------------
    def input_file(self, flag: str, path: str | os.PathLike, what: str = "file") -> Path:
        p = _path(flag, path)
        st = _stat(p, flag)
        if st is None:
            hint = " (a path under a file?)" if _under_file(p) else ""
            raise InputError(f"{_flag(flag)}{p}: no such {what} ({p.name} does not exist{hint}); check the path")
        if stat.S_ISDIR(st.st_mode):
            raise InputError(f"{_flag(flag)}{p} is a directory, not a file ({what}); name the file inside it")
        if not stat.S_ISREG(st.st_mode):
            raise InputError(f"{_flag(flag)}{p} is not a regular file (a FIFO, socket or device); give a {what} "
                             "on disk")
        if not _readable(st, p):
            raise InputError(f"{_flag(flag)}{p} is not readable (mode {stat.filemode(st.st_mode)}); "
                             "fix its permissions (chmod u+r)")
        self.inputs.append((flag, p))
        return p

    def input_files(self, flag: str, paths: Iterable[str | os.PathLike], what: str = "file") -> list[Path]:
        return [self.input_file(flag, p, what) for p in paths]

    def input_dir(self, flag: str, path: str | os.PathLike, what: str = "folder") -> Path:
        p = _path(flag, path)
        st = _stat(p, flag)
        if st is None:
            raise InputError(f"{_flag(flag)}{p}: no such {what} ({p.name} does not exist); check the path")
        if not stat.S_ISDIR(st.st_mode):
            raise InputError(f"{_flag(flag)}{p} is a file, but a {what} is expected; give its folder")
        if not st.st_mode & 0o444 or not os.access(p, os.R_OK | os.X_OK):
            raise InputError(f"{_flag(flag)}{p} is not readable (mode {stat.filemode(st.st_mode)}); fix its "
                             "permissions (chmod u+rx)")
        self.inputs.append((flag, p))
        self.input_dirs.append((flag, p))
        return p

    def input_dir_files(self, flag: str, path: str | os.PathLike, names: Iterable[str]) -> None:
        """Record files inside an input folder that the command reads (so no output may replace them)."""
        for n in names:
            self.inputs.append((flag, Path(path) / n))

    # -- outputs -------------------------------------------------------------------------------
    def _not_an_input(self, flag: str, p: Path) -> None:
        for in_flag, q in self.inputs:
            if same_file(p, q):
                raise InputError(f"{_flag(flag)}{p} is the input {_flag(in_flag)}{q} (the same file): writing it "
                                 f"would destroy the input; choose another output path")

    def _parent_writable(self, flag: str, p: Path, what: str) -> None:
        """The nearest existing folder at or above ``p`` must be a writable folder."""
        q = p
        while True:
            st = _stat(q, flag)
            if st is not None:
                break
            if q.parent == q:
                return
            q = q.parent
        if not stat.S_ISDIR(st.st_mode):
            raise InputError(f"{_flag(flag)}{p}: {q} is a file, not a folder; choose a path in a folder for the {what}")
        if not _writable_dir(st, q):
            raise InputError(f"{_flag(flag)}{p}: folder {q} is read-only (mode {stat.filemode(st.st_mode)}); "
                             f"choose a writable place for the {what} or fix its permissions")

    def output_file(self, flag: str, path: str | os.PathLike, what: str = "output file") -> Path:
        p = _path(flag, path)
        if str(path).endswith(("/", os.sep)):
            raise InputError(f"{_flag(flag)}{path} ends in '/', but an {what} is expected; give a file name")
        st = _stat(p, flag)
        if st is not None:
            if stat.S_ISDIR(st.st_mode):
                raise InputError(f"{_flag(flag)}{p} is a directory, but an {what} is expected; give a file name "
                                 "(e.g. inside it)")
            if not stat.S_ISREG(st.st_mode):
                raise InputError(f"{_flag(flag)}{p} is not a regular file (a FIFO, socket or device); give a "
                                 "file path")
            self._not_an_input(flag, p)
            if not st.st_mode & 0o222:
                raise InputError(f"{_flag(flag)}{p} is read-only (mode {stat.filemode(st.st_mode)}); delete it or "
                                 "choose another output path")
        self._parent_writable(flag, p.parent, what)
        return p

    def output_dir(self, flag: str, path: str | os.PathLike, names: Iterable[str] = (), *,
                   stage: str | None = None, guarded: Iterable[str] = ()) -> Path:
        """An output folder, ``names`` the files the command will write into it.

        ``stage``: the stage whose manifest the folder gets; a folder holding another stage's
        manifest is another data set, replaced only with ``--overwrite``. ``guarded``: names (such as
        ``vocab.txt``) whose existing copy is only replaced with ``--overwrite`` unless this stage's
        manifest records it.
        """
        p = _path(flag, path)
        st = _stat(p, flag)
        if st is not None and not stat.S_ISDIR(st.st_mode):
            raise InputError(f"{_flag(flag)}{p} is a file, but an output folder is expected; give a folder")
        for in_flag, q in self.input_dirs:
            if same_file(p, q):
                raise InputError(f"{_flag(flag)}{p} is the input folder {_flag(in_flag)}{q}: its outputs would mix "
                                 "with (or replace) the inputs; choose another output folder")
        for n in names:
            self._not_an_input(flag, p / n)
        if stage is not None:
            self._manifest_stage(p / MANIFEST_NAME, flag, stage)
        if st is None:
            self._parent_writable(flag, p, "output folder")
            return p
        if not _writable_dir(st, p):
            raise InputError(f"{_flag(flag)}{p} is read-only (mode {stat.filemode(st.st_mode)}); choose a writable "
                             "output folder or fix its permissions")
        if not self.overwrite:
            ours = stage is not None and self._manifest_of(p / MANIFEST_NAME) == stage
            for n in guarded:
                if (p / n).exists() and not ours:
                    raise InputError(f"{_flag(flag)}{p} already holds {n} (not written by a previous `{stage}` "
                                     "run here); add --overwrite to replace it, or choose another folder")
        return p

    @staticmethod
    def _manifest_of(m: Path) -> str | None:
        try:
            d = json.loads(m.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return d.get("stage") if isinstance(d, dict) and isinstance(d.get("stage"), str) else None

    def _manifest_stage(self, m: Path, flag: str, stage: str) -> None:
        other = self._manifest_of(m)
        if other is not None and other != stage and not self.overwrite:
            raise InputError(f"{_flag(flag)}{m.parent} already holds another data set (a `{other}` stage "
                             f"output, {m.name}); add --overwrite to replace it, or choose another folder")


def _under_file(p: Path) -> bool:
    return any(q.is_file() for q in p.parents)


def path_arg(text: str) -> Path:
    """An argparse ``type=`` for a path: an empty string is refused (``Path("")`` would mean the current folder)."""
    import argparse

    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return Path(text)


def is_dir(flag: str, path: str | os.PathLike) -> bool:
    """``Path.is_dir`` that names ``flag`` in one line where the path cannot even be looked at (a name too long,
    a symlink loop) instead of raising OSError."""
    st = _stat(_path(flag, path), flag)
    return st is not None and stat.S_ISDIR(st.st_mode)
