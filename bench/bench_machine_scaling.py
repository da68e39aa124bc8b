"""What 2 processes get from this machine against 1, per kind of work: the ceiling of a 2-worker stage's speed-up.

  .venv/bin/python bench/bench_machine_scaling.py               # each kind, 1 process then 2, 3 pairs
  .venv/bin/python bench/bench_machine_scaling.py --mb 1024 --pairs 5

A stage's 2-worker speed-up can only be what the machine gives its kind of work. Each kind runs for about the same
time in 1 process, then in 2 processes side by side (each doing the same amount: the ideal is 2x the throughput),
and prints the ratio of throughputs (2 processes' rows over 1's, both by wall):

- ``compute``: a loop in registers (hashing a 64 KiB buffer with md5 again and again: L1/L2 resident);
- ``stream``: copying a ``--mb`` array into another (the memory bus, sequential);
- ``gather``: ``np.take`` of 8-byte rows at random indices from a ``--mb`` array (cache and TLB misses: the
  shuffle's gather reads its scratch this way);
- ``gather (mapped file)``: the same from a file of ``--mb`` in the page cache, mapped read-only (page-cache pages
  through 4 KiB page-table entries, as a stage reads its scratch);
- ``page cache write``: writing ``--mb`` to a new file (the kernel's copies into the page cache), then removing it.

A kind that scales under 2x here bounds every stage made of it: such a figure says the limit is the machine's
(its memory system, or the host's placement of the two vCPUs), not the stage's code. Timings depend on the
machine and its load: the load average is printed at the start and the end.
"""

from __future__ import annotations

import argparse
import hashlib
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def _compute(mb: int, scratch: str, reps: int) -> int:
    buf = os.urandom(1 << 16)
    for _ in range(reps):
        hashlib.md5(buf).digest()
    return reps


def _stream(mb: int, scratch: str, reps: int) -> int:
    a = np.ones(mb << 17, dtype=np.int64)  # mb MiB
    b = np.empty_like(a)
    for _ in range(reps):
        np.copyto(b, a)
    return reps


def _gather(mb: int, scratch: str, reps: int) -> int:
    a = np.arange(mb << 17, dtype=np.int64)
    idx = np.random.default_rng(os.getpid()).integers(0, len(a), 1 << 22)
    out = np.empty(len(idx), dtype=np.int64)
    for _ in range(reps):
        np.take(a, idx, out=out)
    return reps


def _gather_mapped(mb: int, scratch: str, reps: int) -> int:
    a = np.memmap(Path(scratch) / "data.bin", dtype=np.int64, mode="r")
    idx = np.random.default_rng(os.getpid()).integers(0, len(a), 1 << 22)
    out = np.empty(len(idx), dtype=np.int64)
    for _ in range(reps):
        np.take(a, idx, out=out)
    return reps


def _write(mb: int, scratch: str, reps: int) -> int:
    block = os.urandom(1 << 20)
    for r in range(reps):
        p = Path(scratch) / f"w-{os.getpid()}-{r}"
        fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        for _ in range(mb):
            os.write(fd, block)
        os.close(fd)
        p.unlink()
    return reps


KINDS = {"compute": (_compute, 20_000), "stream": (_stream, 0), "gather": (_gather, 0),
         "gather (mapped file)": (_gather_mapped, 0), "page cache write": (_write, 0)}


def _timed(fn, mb: int, scratch: str, reps: int, start, q: mp.Queue) -> None:
    fn(mb, scratch, 1)  # warm: arrays allocated and touched, the file's pages mapped
    start.wait()  # every process warm: they start together
    t = time.perf_counter()
    fn(mb, scratch, reps)
    q.put(time.perf_counter() - t)


def run(kind: str, n: int, mb: int, scratch: str, reps: int) -> float:
    """Wall of ``n`` processes doing ``reps`` each, side by side (each warmed up first, started together)."""
    fn = KINDS[kind][0]
    ctx = mp.get_context("fork")
    start, q = ctx.Barrier(n), ctx.Queue()
    ps = [ctx.Process(target=_timed, args=(fn, mb, scratch, reps, start, q)) for _ in range(n)]
    for p in ps:
        p.start()
    secs = [q.get() for _ in ps]
    for p in ps:
        p.join()
    return max(secs)


def calibrate(kind: str, mb: int, scratch: str, target_s: float) -> int:
    reps = KINDS[kind][1] or 1
    while True:
        dt = run(kind, 1, mb, scratch, reps)
        if dt >= target_s / 4:
            return max(1, round(reps * target_s / dt))
        reps *= 4


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mb", type=int, default=512, help="MiB of each array or file (default 512: past the caches)")
    ap.add_argument("--pairs", type=int, default=3, help="1-then-2 pairs per kind (default 3)")
    ap.add_argument("--seconds", type=float, default=2.0, help="about how long 1 process runs (default 2)")
    ap.add_argument("--kinds", default=",".join(KINDS), help="comma-separated kinds (default all)")
    args = ap.parse_args(argv)
    print(f"machine: {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at the start; --mb {args.mb}")
    with tempfile.TemporaryDirectory(prefix="machine-scaling-") as scratch:
        data = Path(scratch) / "data.bin"
        with open(data, "wb") as f:
            for _ in range(args.mb):
                f.write(os.urandom(1 << 20))
        for kind in args.kinds.split(","):
            if kind not in KINDS:
                raise SystemExit(f"--kinds: unknown kind {kind!r}; choose from {', '.join(KINDS)}")
            reps = calibrate(kind, args.mb, scratch, args.seconds)
            ratios = []
            for _ in range(args.pairs):
                one = run(kind, 1, args.mb, scratch, reps)
                two = run(kind, 2, args.mb, scratch, reps)
                ratios.append(2 * one / two)  # twice the work in `two` seconds, against the work in `one`
            print(f"{kind:<22} 2 processes: {statistics.median(ratios):.2f}x the throughput of 1 (median of "
                  f"{args.pairs}: {', '.join(f'{r:.2f}' for r in ratios)}; {reps} reps, 1 process ~{one:.1f} s)")
    print(f"load average {os.getloadavg()[0]:.2f} at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
