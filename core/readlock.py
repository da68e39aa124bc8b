"""Readers of a data work dir: a training holds a shared ``flock`` on ``<work>/.bertpipe.readers`` while it reads
the data set; the refresh's pruning (flows/refresh_flow.py) removes a version only while it holds the same lock
exclusively, so a version a running training reads is never removed, and a training never starts on a version
being removed.

The kernel drops a lock when its holder dies (``kill -9`` included): a killed training never pins a version.
Standard library only; Linux and macOS (``fcntl``).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO

from core.errors import InputError

READERS_NAME = ".bertpipe.readers"
RUN_SUMMARY = "last_run.json"  # what makes a folder a data work dir (written by the data flow)


def data_work_dir(path: str | os.PathLike, levels: int = 8) -> Path | None:
    """The data work dir that ``path`` (a work dir, ``datasets/latest``, its 4-bin folder, an eval file) lies in,
    links resolved: the nearest folder at or above it holding ``last_run.json``; None when there is none."""
    try:
        p = Path(path).resolve()
        for q in [p, *p.parents][:levels]:
            if (q / RUN_SUMMARY).is_file():
                return q
    except (OSError, RuntimeError, ValueError):  # a link loop, a NUL byte: no data set to hold
        return None
    return None


def _open(work: Path) -> IO[str]:
    return open(work / READERS_NAME, "a+", encoding="utf-8")  # noqa: SIM115 - the caller closes it


@contextmanager
def reading(path: str | os.PathLike | None, what: str = "train_dir") -> Iterator[Path | None]:
    """Hold a shared lock on the data work dir of ``path`` for the block (nothing when it lies in none). Refused
    in one line naming ``what`` when that version is being removed."""
    work = data_work_dir(path) if path else None
    if work is None:
        yield None
        return
    try:
        f = _open(work)
    except OSError:  # a read-only data set: nobody can prune it either
        yield work
        return
    try:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InputError(f"{what} {path}: the data set {work} is being removed (a refresh prunes old versions); "
                             "use datasets/latest or a version that is kept") from None
        yield work
    finally:
        f.close()


@contextmanager
def removing(work: str | os.PathLike) -> Iterator[bool]:
    """Hold ``work``'s readers lock exclusively for the block: True when no training reads it (remove it now),
    False when one does (keep it)."""
    try:
        f = _open(Path(work))
    except OSError:
        yield False
        return
    try:
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        f.close()
