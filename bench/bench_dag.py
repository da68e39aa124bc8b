"""Wall time of the data DAG on the built-in sample: first run, cached re-run, and Prefect's own start-up.

  .venv/bin/python bench/bench_dag.py [--repeat 2] [--workers 0] [--text-dir DIR --vocab FILE]

Each figure is one ``bertpipe run`` subprocess, end to end: interpreter start-up, imports, Prefect's
temporary local server (no PREFECT_API_URL; a fresh PREFECT_HOME per benchmark), the DAG, shutdown.

1. baseline: an empty Prefect flow in the same conditions (what any flow costs here);
2. first run of the sample (download -> extract -> text -> vocab -> TFRecords -> HDF5 -> bins + eval);
3. cached re-run (target <= 10 s, Prefect start-up included): every stage found done, nothing runs;
4. the cached re-run against an already running Prefect server (``prefect server start`` on 127.0.0.1,
   PREFECT_API_URL set: how a deployment or a user with a server runs it), server stopped by pid after;
5. ``bertpipe status`` and ``bertpipe verify`` on the finished work dir (no Prefect).

Printed: seconds (best of --repeat for 1 and 3), peak RSS of the process tree's largest member, and
the ratio of the cached re-run to the empty-flow baseline (1.0 = no cost beyond Prefect itself).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
EMPTY_FLOW = "from prefect import flow\n@flow\ndef empty():\n    return 1\nempty()\n"


def timed(cmd: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(seconds, peak RSS MB of the largest child so far) of one subprocess; raises on failure."""
    t0 = time.perf_counter()
    r = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    dt = time.perf_counter() - t0
    if r.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({r.returncode}):\n{r.stdout[-2000:]}\n{r.stderr[-3000:]}")
    return dt, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def cached_with_server(run: list[str], env: dict[str, str], repeat: int) -> float:
    """Best cached re-run time against a running local Prefect server."""
    import signal
    import socket
    import urllib.request

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    api = f"http://127.0.0.1:{port}/api"
    srv = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                           env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        for _ in range(240):
            try:
                with urllib.request.urlopen(api + "/health", timeout=2):
                    break
            except OSError:
                time.sleep(0.5)
        return min(timed(run, {**env, "PREFECT_API_URL": api})[0] for _ in range(repeat))
    finally:
        os.killpg(srv.pid, signal.SIGTERM)
        srv.wait(timeout=30)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--workers", type=int, default=0)
    ap.add_argument("--text-dir", help="benchmark MLPerf text instead of the sample")
    ap.add_argument("--vocab")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-dag-"))
    env = {**os.environ, "PREFECT_HOME": str(tmp / "home"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
           "BERTPIPE_PROGRESS": "0"}
    env.pop("PREFECT_API_URL", None)
    work = tmp / "work"
    run = [str(BIN / "bertpipe"), "run", "--work-dir", str(work), "--workers", str(a.workers), "-q"]
    if a.text_dir:
        run += ["--text-dir", a.text_dir, "--vocab", a.vocab, "--n-output-shards", "8"]
    try:
        timed([sys.executable, "-c", EMPTY_FLOW], env)  # untimed: creates the fresh PREFECT_HOME's database
        base = min(timed([sys.executable, "-c", EMPTY_FLOW], env)[0] for _ in range(a.repeat))
        first, rss = timed(run, env)
        cached = min(timed(run, env)[0] for _ in range(a.repeat))
        served = cached_with_server(run, env, a.repeat)
        status = timed([str(BIN / "bertpipe"), "status", "--work-dir", str(work)], env)[0]
        verify, rss = timed([str(BIN / "bertpipe"), "verify", "--work-dir", str(work)], env)
        size = sum(p.stat().st_size for p in work.rglob("*") if p.is_file()) / 1e6
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(f"data DAG on {'the sample' if not a.text_dir else a.text_dir} (workers={a.workers or os.cpu_count()}, "
          f"{size:.0f} MB of outputs)")
    print(f"  empty Prefect flow (baseline)  {base:7.2f} s")
    print(f"  first run                      {first:7.2f} s")
    print(f"  cached re-run (target <= 10 s) {cached:7.2f} s   = {cached / base:.2f}x the empty flow")
    print(f"  cached re-run, running server  {served:7.2f} s")
    print(f"  bertpipe status                {status:7.2f} s")
    print(f"  bertpipe verify (all md5s)     {verify:7.2f} s")
    print(f"  peak RSS (largest process)     {rss:7.0f} MB")


if __name__ == "__main__":
    main()
