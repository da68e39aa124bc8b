"""core/pools.py is the one way to make a process pool: forkserver/spawn workers with signals reset."""

from __future__ import annotations

import ast
import signal
from pathlib import Path

import pytest

from core import pools

ROOT = Path(__file__).resolve().parents[1]


def test_workers_start_clean_whatever_the_parent_installed() -> None:
    """A parent inside Prefect has its own SIGTERM/SIGINT handlers; the workers must not carry them: SIGINT
    is ignored (Ctrl-C is the parent's to handle) and SIGTERM kills at once."""
    previous = {s: signal.signal(s, lambda *_: None) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        with pools.worker_pool(2) as pool:
            assert pool._mp_context.get_start_method() in ("forkserver", "spawn")
            got = [pool.submit(signal.getsignal, s).result(timeout=120) for s in (signal.SIGINT, signal.SIGTERM)]
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
    assert got == [signal.SIG_IGN, signal.SIG_DFL]


def test_an_error_in_the_block_terminates_the_workers() -> None:
    with pytest.raises(RuntimeError, match="boom"), pools.worker_pool(2) as pool:
        pool.submit(abs, -1).result(timeout=120)
        procs = list(pool._processes.values())
        manager, wakeup = pool._executor_manager_thread, pool._executor_manager_thread_wakeup
        raise RuntimeError("boom")
    assert procs and not any(p.is_alive() for p in procs)
    # The executor's manager thread is done and its wake-up pipe closed: the interpreter's exit hook, which
    # writes to that pipe without a lock on Python 3.11, cannot race its closing (a stray "Bad file descriptor"
    # under a command's one-line error, seen in CI on a full disk).
    assert not manager.is_alive() and wakeup._closed


#: what makes a process pool or a raw child process of Python's own
_MAKERS = {"ProcessPoolExecutor", "Pool", "Process", "get_context", "fork", "forkpty", "set_start_method"}


def _pool_makers(source: str) -> list[int]:
    hits = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""
            if isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name) and f.value.id == "psutil":
                continue  # psutil.Process(pid) looks at a running process; it starts none
            if name in _MAKERS:
                hits.append(node.lineno)
    return hits


@pytest.mark.parametrize("source", ["from concurrent.futures import ProcessPoolExecutor\nProcessPoolExecutor(4)",
                                    "import multiprocessing\nmultiprocessing.Pool(2)",
                                    "import multiprocessing as mp\nmp.get_context('fork').Pool()",
                                    "import os\nos.fork()", "from multiprocessing import Process\nProcess(target=f)"])
def test_the_check_finds_pool_makers(source: str) -> None:
    assert _pool_makers(source)


def test_the_check_lets_psutil_look_at_processes() -> None:
    assert _pool_makers("import psutil\npsutil.Process(1).children()") == []


def test_every_pool_comes_from_core_pools() -> None:
    """No module but core/pools.py makes a process pool (or forks): they all get its start method and
    signal handling (thread pools are fine; subprocesses of other programs are not pools)."""
    offenders = []
    for folder in ("core", "preprocessing", "pretrain", "tasks", "flows", "bertpipe"):
        for path in (ROOT / folder).rglob("*.py"):
            if path == ROOT / "core" / "pools.py":
                continue
            offenders += [f"{path.relative_to(ROOT)}:{n}" for n in _pool_makers(path.read_text(encoding="utf-8"))]
    assert offenders == []


@pytest.mark.parametrize(("items", "most", "workers", "calls"), [
    (41, 16, 2, 4),      # not 16, 16 and 9: one worker would do 25 shards while the other does 16
    (41, 16, 1, 3),
    (4320, 16, 2, 270),  # the full set: already even
    (4320, 16, 16, 272),
    (3, 16, 8, 3),       # never more calls than items
    (0, 16, 2, 1),
    (10, 1, 4, 10),
])
def test_even_calls_are_a_multiple_of_the_workers(items: int, most: int, workers: int, calls: int) -> None:
    assert pools.even_calls(items, most, workers) == calls
    if items:
        assert -(-items // calls) <= most, "no call holds more than `most` items"


def _pid_of(_: int) -> int:
    import os
    return os.getpid()


def test_run_all_on_a_shared_pool_uses_the_same_workers() -> None:
    """A stage's parallel steps on one pool: the second step's calls run in the first step's processes."""
    import os
    with pools.shared_pool(2) as pool:
        assert pool is not None
        first = set(pools.run_all(_pid_of, [(i,) for i in range(6)], 2, pool))
        second = set(pools.run_all(_pid_of, [(i,) for i in range(6)], 2, pool))
    assert len(first | second) <= 2 and os.getpid() not in first | second  # a new pool would add new pids
    with pools.shared_pool(1) as none:
        assert none is None
        assert pools.run_all(_pid_of, [(1,), (2,)], 1, none) == [os.getpid()] * 2
