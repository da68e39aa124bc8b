"""core.costs: the md5 and fsync counters the writers keep (bench/bench_scale.py prints them per step)."""

from __future__ import annotations

from pathlib import Path

from core import costs
from core.manifest import StageOutput, md5_file, md5_files


def test_md5s_and_fsyncs_are_counted(tmp_path: Path) -> None:
    files = []
    for i in range(3):
        p = tmp_path / f"f{i}"
        p.write_bytes(bytes([i]) * (3 << 20))
        files.append(p)
    before = costs.snapshot()
    md5_files(files)
    md5_file(files[0])
    spent = costs.since(before)
    assert spent["md5_bytes"] == 4 * (3 << 20)
    assert spent["md5_calls"] == 2
    assert spent["md5_cpu"] > 0
    before = costs.snapshot()
    with StageOutput(tmp_path / "s", "st") as out, out.open("a") as f:
        f.write(b"x")
    spent = costs.since(before)
    assert spent["fsyncs"] >= 2  # the file and the manifest (and their folder)
    assert spent["fsync_wait"] > 0
    assert set(spent) >= {"user", "sys", "minflt", "majflt"}


def test_a_calls_wall_splits_into_cpu_waits_for_a_core_and_blocked_time() -> None:
    """core.costs.spent: a busy loop is CPU; a sleep is neither CPU nor a wait for a core (it is 'blocked'); two
    busy processes on one core make each wait for it about as long as it runs (Linux's schedstat)."""
    import os
    import time

    c0 = costs.clock()
    t = time.process_time()
    while time.process_time() - t < 0.3:
        pass
    busy = costs.spent(c0)
    assert 0.25 <= busy["cpu"] <= busy["seconds"] + 0.05
    c0 = costs.clock()
    time.sleep(0.3)
    idle = costs.spent(c0)
    assert idle["seconds"] >= 0.3 and idle["cpu"] < 0.05 and idle["run_wait"] < 0.05
    if not os.path.exists("/proc/thread-self/schedstat") or not hasattr(os, "sched_setaffinity"):
        return
    import multiprocessing

    def spin(q) -> None:
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        c0 = costs.clock()
        t = time.process_time()
        while time.process_time() - t < 0.5:
            pass
        q.put(costs.spent(c0))

    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=spin, args=(q,)) for _ in range(2)]
    for p in procs:
        p.start()
    got = [q.get(timeout=30) for _ in procs]
    for p in procs:
        p.join()
    # two on one core: each runs 0.5 s of CPU and is ready, not running, for much of the other's
    assert max(g["run_wait"] for g in got) > 0.2, got
    for g in got:
        assert g["cpu"] + g["run_wait"] <= g["seconds"] + 0.1, g
