"""Safe unpacking of tar archives (e.g. a published ``results_text.tar.gz`` of MLPerf text).

A hostile archive can name members ``../../etc/x`` or ``/abs/path``, or smuggle links that point out of
the destination; :func:`safe_extract_tar` refuses every such member before writing anything.
"""

from __future__ import annotations

import os
import tarfile
from pathlib import Path, PurePosixPath

from core.errors import InputError


def _check_member(archive: Path, m: tarfile.TarInfo) -> None:
    name = PurePosixPath(m.name)
    if name.is_absolute() or m.name.startswith(("/", "\\")) or ".." in name.parts:
        raise InputError(f"{archive}: member {m.name!r} has an absolute or '..' path that would escape the "
                         "destination; refusing to unpack this archive (it is malformed or hostile)")
    if m.issym() or m.islnk():
        raise InputError(f"{archive}: member {m.name!r} is a link ({m.linkname!r}); bertpipe unpacks regular "
                         "files and folders only")
    if not (m.isfile() or m.isdir()):
        raise InputError(f"{archive}: member {m.name!r} is a device, fifo or other special file; refusing it")


def safe_extract_tar(archive: str | os.PathLike, dest: str | os.PathLike) -> list[str]:
    """Extract regular files and folders of ``archive`` into ``dest``; refuse the archive if any
    member is absolute, contains ``..``, is a link or a special file. Returns the member names."""
    archive, dest = Path(archive), Path(dest)
    try:
        tf = tarfile.open(archive)  # noqa: SIM115 - closed below
    except (tarfile.TarError, OSError) as exc:
        raise InputError(f"{archive} is not a readable tar archive ({exc})") from None
    with tf:
        members = tf.getmembers()
        for m in members:  # check everything before writing anything
            _check_member(archive, m)
        dest.mkdir(parents=True, exist_ok=True)
        root = dest.resolve()
        for m in members:
            target = (dest / m.name).resolve()
            if not target.is_relative_to(root):
                raise InputError(f"{archive}: member {m.name!r} resolves outside {dest}; refusing it")
            tf.extract(m, dest, filter="data")
    return [m.name for m in members]
