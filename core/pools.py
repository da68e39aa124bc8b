"""The one way bertpipe makes a process pool.

Every pool (text stages, extraction, create_pretraining_data part files, the data DAG's shard calls)
comes from :func:`worker_pool`, which

* starts workers with the ``forkserver`` method (``spawn`` where there is none): a worker never
  inherits the parent's Python signal handlers. Forked from inside a Prefect flow, a worker would carry
  Prefect's SIGTERM handler, and a ``terminate()`` that it catches can hang the pool for good;
* resets signals in each worker: SIGINT is ignored (Ctrl-C reaches the whole process group; the parent
  alone turns it into KeyboardInterrupt and stops the pool, so no worker prints a traceback) and SIGTERM
  has its default action (the worker dies at once, mid-write if need be: the caller's temporary files
  are swept by the stage's debris rule, and nothing without a manifest counts as done);
* makes each worker exit when the process that created the pool dies (``kill -9`` of a run), so no
  orphan goes on writing;
* on an exception in the ``with`` block (an error, Ctrl-C, SIGTERM turned into an exception) cancels
  queued work and terminates the workers instead of waiting for them.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from itertools import islice
from typing import Any

_WATCH_S = 0.5


def default_workers() -> int:
    """One worker per CPU this process may use."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _context() -> multiprocessing.context.BaseContext:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def _watch_parent() -> None:
    parent = os.getppid()

    def loop() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(_WATCH_S)

    threading.Thread(target=loop, daemon=True, name="bertpipe-parent-watch").start()


def _init_worker(initializer: Callable[..., None] | None, initargs: tuple) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _watch_parent()
    if initializer is not None:
        initializer(*initargs)


def terminate(pool: ProcessPoolExecutor, timeout: float = 5.0) -> None:
    """Stop ``pool`` now: drop queued work, SIGTERM its workers (SIGKILL after ``timeout``), reap them."""
    procs = list(getattr(pool, "_processes", {}).values())  # the executor exposes no public handle
    pool.shutdown(wait=False, cancel_futures=True)
    for p in procs:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + timeout
    for p in procs:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(1.0)


def make_pool(workers: int, *, initializer: Callable[..., None] | None = None,
              initargs: tuple = ()) -> ProcessPoolExecutor:
    """A pool of ``workers`` processes started as described in the module docstring (close it yourself)."""
    return ProcessPoolExecutor(max_workers=max(1, workers), mp_context=_context(), initializer=_init_worker,
                               initargs=(initializer, initargs))


@contextmanager
def worker_pool(workers: int, *, initializer: Callable[..., None] | None = None,
                initargs: tuple = ()) -> Iterator[ProcessPoolExecutor]:
    """``with worker_pool(n) as pool:`` - shut down cleanly on success, terminated on any exception."""
    pool = make_pool(workers, initializer=initializer, initargs=initargs)
    try:
        yield pool
    except BaseException:
        terminate(pool)
        raise
    pool.shutdown(wait=True)


def ordered_map(fn: Callable[[Any], Any], items: Iterable[Any], workers: int, *, window: int = 0,
                initializer: Callable[..., None] | None = None, initargs: tuple = ()) -> Iterator[Any]:
    """``map(fn, items)`` on ``workers`` processes, results in order; in this process when ``workers <= 1``.

    At most ``window`` (default 2 x workers) items are in flight, so results waiting behind a slow
    earlier item cannot pile up in memory (a 20 GB dump streams through). Closing the generator early
    or an error anywhere terminates the pool.
    """
    if workers <= 1:
        if initializer is not None:
            initializer(*initargs)
        yield from map(fn, items)
        return
    todo = iter(items)
    with worker_pool(workers, initializer=initializer, initargs=initargs) as pool:
        pending = deque(pool.submit(fn, item) for item in islice(todo, window or 2 * workers))
        while pending:  # closing the generator raises GeneratorExit here: worker_pool terminates the pool
            result = pending.popleft().result()
            pending.extend(pool.submit(fn, item) for item in islice(todo, 1))
            yield result


def run_all(fn: Callable[..., Any], arg_lists: Sequence[tuple], workers: int) -> list[Any]:
    """``[fn(*args) for args in arg_lists]`` on ``workers`` processes (here when ``workers <= 1``), in order."""
    if workers <= 1 or len(arg_lists) <= 1:
        return [fn(*args) for args in arg_lists]
    with worker_pool(min(workers, len(arg_lists))) as pool:
        futures = [pool.submit(fn, *args) for args in arg_lists]
        return [f.result() for f in futures]
