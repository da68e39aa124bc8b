"""What this process spent on the chores every stage shares: md5s (CPU) and fsyncs (waits for the disk).

The stages' writers add to these counters as they go (core.manifest: md5_file, md5_files, the fsyncs); nothing
else reads them but :func:`snapshot`, which bench/bench_scale.py prints as each step's breakdown next to the
process's own CPU time and page faults. Counting costs a clock read per md5 call or fsync.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

_COUNTERS: dict[str, float] = {"md5_cpu": 0.0, "md5_bytes": 0, "md5_calls": 0, "fsync_wait": 0.0, "fsyncs": 0}


@contextmanager
def md5_work(nbytes: int) -> Iterator[None]:
    """Around an md5 of ``nbytes``: its CPU seconds (this thread's: the C core hashes in the calling thread)."""
    t = time.thread_time()
    try:
        yield
    finally:
        _COUNTERS["md5_cpu"] += time.thread_time() - t
        _COUNTERS["md5_bytes"] += nbytes
        _COUNTERS["md5_calls"] += 1


@contextmanager
def fsync_wait() -> Iterator[None]:
    """Around an fsync: the seconds spent waiting for the disk (wall)."""
    t = time.perf_counter()
    try:
        yield
    finally:
        _COUNTERS["fsync_wait"] += time.perf_counter() - t
        _COUNTERS["fsyncs"] += 1


def snapshot() -> dict[str, Any]:
    """The counters so far, with this process's user and system CPU seconds and its page faults."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return {**_COUNTERS, "user": r.ru_utime, "sys": r.ru_stime, "minflt": r.ru_minflt, "majflt": r.ru_majflt}


def since(before: dict[str, Any]) -> dict[str, Any]:
    """What was spent since ``before`` (a :func:`snapshot`)."""
    now = snapshot()
    return {k: now[k] - before[k] for k in now}
