"""Deletion and path guards (a room of core.manifest): what a work dir says never leads a write or a deletion outside
it. A stage folder resolving outside the work dir is refused (:func:`check_inside`); before a redo, links and
special files planted in a stage folder are unlinked, never followed (:func:`clear_links`, :func:`begin_redo`);
debris of killed writers is swept (:func:`remove_debris`); ``--keep training`` drops files only behind a manifest
that verifies, and records it (:func:`drop_files`, :func:`dropped_info`).
"""

from __future__ import annotations

import json
import logging
import os
import stat
import time
from pathlib import Path
from typing import Any

from core.errors import InputError, ManifestError
from core.manifest.format import (
    _TMP_NAME,
    DROPPED_NAME,
    MANIFEST_NAME,
    RESERVED_NAMES,
    STAT_NAME,
    Manifest,
    load_manifest,
    name_problem,
    output_problem,
    outside,
    read_plain,
)
from core.manifest.writes import atomic_write_text, gate

log = logging.getLogger(__name__)


def check_inside(path: str | os.PathLike, root: str | os.PathLike) -> None:
    """Refuse ``path`` if it (through symlinks) resolves outside ``root`` (e.g. a symlinked output
    folder that would make a stage write outside the work dir)."""
    real, real_root = Path(path).resolve(), Path(root).resolve()
    if not real.is_relative_to(real_root):
        raise InputError(f"refusing to write to {path}: it resolves to {real}, outside the work dir {root} "
                         "(a symlink?). Remove the link or choose another --work-dir")

def remove_debris(directory: Path) -> None:
    """Delete temporary files left by killed writers (``.<name>.tmp-<pid>``) under ``directory``.

    Symbolic links to folders are not followed (a link of that name is unlinked itself, never its target)."""
    for dirpath, _dirs, files in os.walk(directory):  # os.walk does not descend into linked folders
        for n in files:
            if _TMP_NAME.match(n):
                p = os.path.join(dirpath, n)
                try:
                    if stat.S_ISREG(os.lstat(p).st_mode) or os.path.islink(p):
                        os.unlink(p)
                except FileNotFoundError:
                    pass

def clear_links(directory: str | os.PathLike) -> list[str]:
    """Before a stage (or shard) folder is written: unlink every symbolic link, and every entry that is neither a
    plain file nor a folder (a FIFO, a socket, a device), anywhere under ``directory``, never following one.

    bertpipe writes only plain files and folders in a stage folder, so such an entry was planted (or left by
    another tool), and a stage that opened, listed, replaced or removed a file through it would reach outside the
    work dir. Called before the first byte of a redo, so that every later write resolves inside the folder; the
    folder itself must already be known to resolve inside the work dir (:func:`check_inside`). Returns the
    removed entries, relative to ``directory``."""
    top = Path(directory)
    removed: list[str] = []
    try:
        if not stat.S_ISDIR(os.lstat(top).st_mode):
            return removed
    except OSError:
        return removed
    for dirpath, dirnames, filenames in os.walk(top):  # never descends into a linked folder
        base = Path(dirpath)
        for n in list(dirnames) + filenames:
            p = base / n
            try:
                mode = os.lstat(p).st_mode
            except FileNotFoundError:
                continue
            if stat.S_ISDIR(mode) or stat.S_ISREG(mode):
                continue
            p.unlink(missing_ok=True)  # the entry itself (a link is never followed)
            removed.append(p.relative_to(top).as_posix())
            if n in dirnames:
                dirnames.remove(n)
    if removed:
        log.warning("%s: removed %d entr%s bertpipe never writes in a stage folder (%s%s): a link there could "
                    "make this stage write outside the work dir", top, len(removed), "y" if len(removed) == 1
                    else "ies", ", ".join(removed[:3]), ", ..." if len(removed) > 3 else "")
    return removed

def remove_entry(directory: str | os.PathLike, name: str) -> bool:
    """Remove what sits at ``directory/name`` - a file, a symbolic link (unlinked itself, never followed) or a
    folder (with what it holds; links inside are unlinked, not followed) - only when every folder on the way
    is a real folder inside ``directory``; True when something was removed."""
    import shutil

    if name_problem(name) and name not in RESERVED_NAMES:
        return False
    p = Path(directory)
    parts = name.split("/")
    for part in parts[:-1]:
        p = p / part
        try:
            if not stat.S_ISDIR(os.lstat(p).st_mode):
                return False
        except OSError:
            return False
    p = p / parts[-1]
    try:
        st = os.lstat(p)
    except OSError:
        return False
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(p)  # fd-based on Linux: never follows a link inside
    else:
        p.unlink()
    return True

def begin_redo(directory: str | os.PathLike, manifest_name: str = MANIFEST_NAME) -> None:
    """Before a stage (or shard) directory is written again: the old manifest and drop record go, with the
    debris of killed writers, and whatever its old manifest listed that is no plain file - a symbolic link or a
    folder put where an output belongs, or a link where one of its folders belongs - is removed (links
    unlinked, never followed), so the new outputs are written inside the stage folder."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    try:
        old = load_manifest(d, manifest_name)
    except ManifestError:
        old = None
    for f in old.files if old is not None else ():
        p, why = output_problem(d, f.name)
        if why and why != "missing":
            remove_entry(d, p.relative_to(d).as_posix())
    if "/" in manifest_name:  # kept beside the stage folder (a standalone split-4bins): the caller's own name
        (d / manifest_name).unlink(missing_ok=True)
    else:
        remove_entry(d, manifest_name)
    remove_entry(d, DROPPED_NAME)
    remove_debris(d)

# -- dropping a stage's files (the disk budget) ----------------------------------------------------------
#: format of :data:`DROPPED_NAME`; a record of another format (an older bertpipe's) is not trusted
DROPPED_FORMAT = 2

def _drop_files_list(m: Manifest) -> list[list[Any]]:
    return [[f.name, f.bytes, f.md5] for f in sorted(m.files, key=lambda e: e.name)]

def dropped_info(directory: str | os.PathLike, manifest: Manifest | None = None) -> dict[str, Any] | None:
    """What :func:`drop_files` recorded for a stage directory, or None when its files are (meant to be) there.

    A record counts only when it names the very files its manifest lists (names, sizes, md5s) and that
    manifest's digest: a planted, damaged or older-format ``_dropped.json`` is ignored, and the files are
    checked as usual. ``manifest``: the directory's manifest, when the caller has it loaded already.
    """
    directory = Path(directory)
    try:
        m = manifest if manifest is not None else load_manifest(directory)
        text = read_plain(directory / DROPPED_NAME)
        info = json.loads(text) if text is not None else None
    except (ManifestError, ValueError, RecursionError):
        return None
    if m is None or not isinstance(info, dict) or info.get("format") != DROPPED_FORMAT:
        return None
    if info.get("manifest") != m.digest or info.get("files") != _drop_files_list(m):
        return None
    return info

def drop_files(directory: str | os.PathLike, why: str, root: str | os.PathLike | None = None) -> int:
    """Delete the files a stage directory's manifest lists, keep the manifest, record it; returns bytes freed.

    The record (:data:`DROPPED_NAME`, written first) names each file with its size and md5 and the manifest's
    digest. Only plain files and links (unlinked, never followed) are removed, and only inside the stage
    folder: a stage folder resolving outside ``root`` (the work dir), or an entry reached through a link or a
    non-folder, makes it refuse (ManifestError) before anything is deleted.
    """
    directory = Path(directory)
    if root is not None and (real := outside(directory, root)):
        raise ManifestError(f"refusing to delete the files of {directory}: it resolves to {real}, outside the work "
                            f"dir {root} (a symbolic link?); nothing was deleted. Remove the link")
    m = load_manifest(directory)
    if m is None or dropped_info(directory, m) is not None:
        return 0
    gate(f"the drop of {directory}")
    for f in m.files:
        p, problem = output_problem(directory, f.name)
        if problem and problem != "missing" and p != directory / f.name:  # a link or a file on the way there
            raise ManifestError(f"refusing to delete {directory / f.name}: {p} is {problem}; nothing was deleted")
    info = {"format": DROPPED_FORMAT, "manifest": m.digest, "files": _drop_files_list(m),
            "bytes": sum(f.bytes for f in m.files), "why": why, "when": time.strftime("%Y-%m-%dT%H:%M:%S")}
    remove_entry(directory, DROPPED_NAME)  # an old record of another form (or a folder of that name)
    atomic_write_text(directory / DROPPED_NAME, json.dumps(info, sort_keys=True) + "\n")  # first: a kill leaves
    for f in m.files:  # a marked dir with some files still there, which reads as dropped (rebuilt when needed)
        p = directory / f.name
        try:
            if not stat.S_ISDIR(os.lstat(p).st_mode):  # a plain file, or a link (the link itself goes)
                p.unlink()
        except FileNotFoundError:
            pass
    remove_entry(directory, STAT_NAME)
    return info["bytes"]
