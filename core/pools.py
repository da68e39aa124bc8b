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
* makes each worker exit when the process that created the pool (its *owner*) dies, ``kill -9`` and the OOM
  killer included, so no orphan goes on writing or holds the run's stdout: each worker watches the owner's pid
  and start time (not its parent: a forkserver child's parent is the forkserver, which every worker keeps
  alive), and has ``PR_SET_PDEATHSIG`` towards the forkserver; :func:`start_forkserver`, called from a main
  thread (the deployments' flows do), starts a forkserver that has it towards the owner (core/deathsig.py), so
  the kernel ends the whole tree even when a worker is stuck in native code;
* on an exception in the ``with`` block (an error, Ctrl-C, SIGTERM turned into an exception) cancels
  queued work and terminates the workers instead of waiting for them.

A daemonic process may not start processes (Python refuses: "daemonic processes are not allowed to have
children"); a Dask worker under its nanny is one. There :func:`ordered_map` and :func:`run_all` run their work in
the calling process, one item after the other (the output never depends on the number of workers), and say so once
(:func:`can_fork`); ``dask worker --no-nanny``, or ``DASK_DISTRIBUTED__WORKER__DAEMON=False`` in the workers'
environment, gives the stages their pools back.
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

from core.procs import process_alive, start_time

_WATCH_S = 0.5


def default_workers() -> int:
    """One worker per CPU this process may use."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def even_calls(n_items: int, most: int, workers: int) -> int:
    """How many calls to cut ``n_items`` even pieces of work into, each of at most ``most`` items: the fewest
    that hold them, rounded up to a multiple of ``workers`` (no more than one call an item), so that every worker
    gets as many calls as the others and the calls are as large as each other. Where the calls are few (a small
    set, or many workers), 3 calls of 16 items on 2 workers leave one worker two of them (1.5x the other's
    work); 4 of 12 each do not."""
    if n_items <= 0:
        return 1
    w = max(1, workers)
    calls = -(-n_items // max(1, most))
    return max(1, min(n_items, -(-calls // w) * w))


_SAID_INLINE = False


def can_fork(workers: int = 2) -> bool:
    """Whether this process may start a pool of ``workers`` processes: not in a daemonic process (a Dask worker
    under its nanny); the first refusal is logged once (INFO) with what to change."""
    global _SAID_INLINE
    if workers <= 1 or not multiprocessing.current_process().daemon:
        return True
    if not _SAID_INLINE:
        _SAID_INLINE = True
        import logging

        logging.getLogger("core.pools").info(
            "%s: a daemonic process (a Dask worker under its nanny) cannot start worker processes: the work of %d "
            "workers runs in this process, same output (start the workers with `dask worker --no-nanny` or "
            "DASK_DISTRIBUTED__WORKER__DAEMON=False to let a call use processes)", multiprocessing.current_process().name,
            workers)
    return False


def _context() -> multiprocessing.context.BaseContext:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def _watch_owner(owner: tuple[int, str | None]) -> None:
    from core.deathsig import set_parent_death_signal

    set_parent_death_signal()  # the kernel's signal when our parent (the forkserver) dies
    pid, start = owner

    def loop() -> None:
        while process_alive(pid, start):
            time.sleep(_WATCH_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=loop, daemon=True, name="bertpipe-owner-watch").start()


def _init_worker(initializer: Callable[..., None] | None, initargs: tuple,
                 owner: tuple[int, str | None] | None = None) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _watch_owner(owner or (os.getppid(), None))
    if initializer is not None:
        initializer(*initargs)


def start_forkserver() -> None:
    """Start this process's forkserver now, tied to it by ``PR_SET_PDEATHSIG`` (core/deathsig.py, Linux): the
    kernel sends the parent-death signal when the *thread* that started a process ends, so only a main thread
    may do this (elsewhere nothing happens: the forkserver starts on first use, and the workers' own watch
    covers them). Idempotent."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return
    if threading.current_thread() is not threading.main_thread():
        return
    from multiprocessing import forkserver

    from core.deathsig import OWNER_ENV

    preload = list(getattr(forkserver._forkserver, "_preload_modules", None) or ["__main__"])
    if "core.deathsig" not in preload:
        forkserver.set_forkserver_preload([*preload, "core.deathsig"])
    os.environ[OWNER_ENV] = str(os.getpid())  # core.deathsig acts only in a forkserver started here, now
    try:
        forkserver.ensure_running()
    finally:
        os.environ.pop(OWNER_ENV, None)


def terminate(pool: ProcessPoolExecutor, timeout: float = 5.0) -> None:
    """Stop ``pool`` now: drop queued work, SIGTERM its workers (SIGKILL after ``timeout``), reap them."""
    procs = list((getattr(pool, "_processes", None) or {}).values())  # the executor exposes no public handle
    manager = getattr(pool, "_executor_manager_thread", None)  # shutdown() drops the executor's reference
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
    # Wait for the executor's manager thread to see its workers gone and close its wake-up pipe. Left running,
    # it can close that pipe while the interpreter's exit hook writes to it (3.11's hook takes no lock), and
    # the exit prints "Exception ignored ... Bad file descriptor" under the command's one-line error.
    if manager is not None:
        manager.join(max(1.0, deadline - time.monotonic()))


def make_pool(workers: int, *, initializer: Callable[..., None] | None = None,
              initargs: tuple = ()) -> ProcessPoolExecutor:
    """A pool of ``workers`` processes started as described in the module docstring (close it yourself)."""
    owner = (os.getpid(), start_time(os.getpid()))
    return ProcessPoolExecutor(max_workers=max(1, workers), mp_context=_context(), initializer=_init_worker,
                               initargs=(initializer, initargs, owner))


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
    if workers <= 1 or not can_fork(workers):
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


def run_all(fn: Callable[..., Any], arg_lists: Sequence[tuple], workers: int,
            pool: ProcessPoolExecutor | None = None) -> list[Any]:
    """``[fn(*args) for args in arg_lists]`` on ``workers`` processes (here when ``workers <= 1``), in order.
    ``pool``: run them on this pool (from :func:`shared_pool`) instead of a new one: a stage of several parallel
    steps starts its workers once (each start is a fork and the workers' imports: ~0.3-0.5 s)."""
    if workers <= 1 or len(arg_lists) <= 1 or not can_fork(workers):
        return [fn(*args) for args in arg_lists]
    if pool is not None:
        return [f.result() for f in [pool.submit(fn, *args) for args in arg_lists]]
    with worker_pool(min(workers, len(arg_lists))) as pool:
        futures = [pool.submit(fn, *args) for args in arg_lists]
        return [f.result() for f in futures]


@contextmanager
def shared_pool(workers: int) -> Iterator[ProcessPoolExecutor | None]:
    """``with shared_pool(w) as pool:`` one :func:`worker_pool` for the several :func:`run_all` steps of a stage
    (``run_all(..., pool=pool)``); None where the steps run here (one worker, or a process that may not fork)."""
    if workers <= 1 or not can_fork(workers):
        yield None
        return
    with worker_pool(workers) as pool:
        yield pool
