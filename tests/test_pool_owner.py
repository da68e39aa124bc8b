"""Pool workers die with the process that made the pool (issue 24.1): a ``kill -9`` of the owner leaves no worker,
forkserver or resource tracker behind, and nothing holding the owner's stdout (a Prefect process worker sees its
flow run end only once the run's stdout is closed by every process that has it).

Each case runs an owner in a subprocess whose stdout is a pipe read here: the read ends (EOF) only when every
process holding the pipe is gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

BUSY = textwrap.dedent("""
    import os

    def busy(kind):
        print("busy", os.getpid(), flush=True)
        if kind == "native":  # a regex that backtracks for ages inside C, never releasing the GIL
            import re
            re.match(r"(a+)+$", "a" * 40 + "b")
        while True:
            sum(range(10000))
""")

OWNER = textwrap.dedent("""
    import os, sys, threading, time
    sys.path[:0] = [{root!r}, {here!r}]
    from core import pools
    from bp_owner_busy import busy

    def main():
        pool = pools.make_pool(2)
        futs = [pool.submit(busy, {kind!r}) for _ in range(2)]
        time.sleep(1.5)
        assert not any(f.done() for f in futs), [f.exception() for f in futs]
        print("pids", os.getpid(), *[p.pid for p in pool._processes.values()], flush=True)
        time.sleep(600)

    if {start_forkserver!r}:
        pools.start_forkserver()
        main()
    else:  # the pool made from another thread, as a Prefect task makes it (no forkserver tie possible)
        t = threading.Thread(target=main)
        t.start()
        t.join()
""")


def _family_gone_after_kill(tmp: Path, kind: str, start_forkserver: bool) -> tuple[float, float]:
    (tmp / "bp_owner_busy.py").write_text(BUSY)
    code = OWNER.format(root=str(ROOT), here=str(tmp), kind=kind, start_forkserver=start_forkserver)
    owner = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        lines = [owner.stdout.readline().decode() for _ in range(3)]  # each worker says "busy", then the pids
        line = lines[-1]
        assert line.startswith("pids "), (lines, owner.stderr.read(2000) if owner.poll() is not None else "")
        owner.stderr.close()
        workers = [int(x) for x in line.split()[2:]]
        assert len(workers) == 2
        t0 = time.monotonic()
        owner.send_signal(signal.SIGKILL)
        owner.wait()
        rest = owner.stdout.read()  # EOF: no process holds the owner's stdout any more
        t_eof = time.monotonic() - t0
        assert rest == b""
        deadline = time.monotonic() + 10
        while any(_alive(p) for p in workers) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not any(_alive(p) for p in workers), "pool workers outlived their owner"
        return t_eof, time.monotonic() - t0
    finally:
        if owner.poll() is None:
            owner.kill()


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signals and /proc are Linux's")
def test_workers_stuck_in_native_code_die_with_an_owner_that_started_its_forkserver(tmp_path: Path) -> None:
    """No thread of a worker runs while the regex holds the GIL: only the kernel's signal can end it."""
    eof_s, gone_s = _family_gone_after_kill(tmp_path, "native", start_forkserver=True)
    assert eof_s < 5 and gone_s < 5, (eof_s, gone_s)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc is Linux's")
def test_workers_of_a_pool_made_in_a_thread_die_with_their_owner(tmp_path: Path) -> None:
    """Before the fix each worker watched its parent, the forkserver, which they kept alive: all survived."""
    eof_s, gone_s = _family_gone_after_kill(tmp_path, "python", start_forkserver=False)
    assert eof_s < 5 and gone_s < 5, (eof_s, gone_s)


def test_start_forkserver_is_a_no_op_off_the_main_thread() -> None:
    import threading

    from core import pools

    before = os.environ.get("BERTPIPE_FORKSERVER_OWNER")
    t = threading.Thread(target=pools.start_forkserver)
    t.start()
    t.join()
    assert os.environ.get("BERTPIPE_FORKSERVER_OWNER") == before
