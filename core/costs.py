"""What this process spent on the chores every stage shares: md5s (CPU) and fsyncs (waits for the disk); and
where a call's wall time went (:func:`clock`, :func:`spent`).

The stages' writers add to these counters as they go (core.manifest: md5_file, md5_files, the fsyncs); nothing
else reads them but :func:`snapshot`, which bench/bench_scale.py prints as each step's breakdown next to the
process's own CPU time and page faults. Counting costs a clock read per md5 call or fsync.

A DAG call's seconds (the wall its manifest records) are its CPU time, the time its thread was ready but waited for
a core (other work on the machine: Linux's schedstat), and the rest, blocked: the disk (fsyncs, writes held back
while the page cache is full of dirty pages, reads) or a lock. tasks.calls records the first two beside the
seconds; ``bertpipe run``'s last_run.json sums them per stage.
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


def _run_wait() -> float:
    """Seconds this thread has spent ready to run but waiting for a core (the second field of Linux's
    /proc/thread-self/schedstat, in ns); 0.0 where the kernel does not say."""
    try:
        with open("/proc/thread-self/schedstat", "rb") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def clock() -> tuple[float, float, float]:
    """Now, for :func:`spent`: wall, this process's CPU (every thread), this thread's wait for a core."""
    return time.perf_counter(), time.process_time(), _run_wait()


def spent(c0: tuple[float, float, float]) -> dict[str, float]:
    """Since ``c0`` (a :func:`clock`): ``seconds`` (wall), ``cpu`` (this process's user + system seconds) and
    ``run_wait`` (seconds the calling thread waited for a core); what is left of the wall, ``seconds - cpu -
    run_wait``, was spent blocked (the disk, a lock; or, where the call's CPU is on other threads, overlapped)."""
    w, c, r = clock()
    return {"seconds": w - c0[0], "cpu": c - c0[1], "run_wait": max(0.0, r - c0[2])}
