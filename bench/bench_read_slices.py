"""What ``preprocessing.packing.read_slices`` takes for one full-size pack-nvidia group's reads: ~1 MB of token ids
from each of 500 parts' scratch files, past the page cache. One read at a time against READ_THREADS at once,
interleaved rounds, the same bytes.

    python bench/bench_read_slices.py [--parts 500] [--mb-each 0.85] [--rounds 3] [--dir DIR]

Prints MB/s, seconds a round (the first round of each also touches its buffer's pages for the first time, as a
worker's first group does), peak RSS and the ratio of the medians; every slice's md5 is compared. The files are written once (``save_array``,
``direct=True``; 4 slices' worth each) into a temporary folder under ``--dir`` (default: the system's temp) and
removed at the end.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memory_state import peak_rss_mb, temp_folder  # noqa: E402

from preprocessing import pack_fast, packing  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--parts", type=int, default=500, help="scratch files, one slice read from each (default 500)")
    ap.add_argument("--mb-each", type=float, default=0.85, help="MB read from each (default 0.85: a full-size "
                    "group's ~0.5 M rows of ~400 int16 tokens over 500 parts)")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of each (default 3)")
    ap.add_argument("--dir", type=Path, default=None, help="where the files go (default: the system's temp)")
    args = ap.parse_args(argv)
    with temp_folder("bench-read-slices-", args.dir) as work:
        _run(args, work)
    return 0


def _run(args: argparse.Namespace, work: Path) -> None:
    n = int(args.mb_each * 1e6) // 2  # int16 values a slice
    rng = np.random.default_rng(0)
    slices = []
    for k in range(args.parts):
        p = work / f"in_{k:05d}_ids.npy"
        packing.save_array(p, rng.integers(0, 30000, 4 * n).astype(np.int16), direct=True)
        a = int(rng.integers(0, 3 * n))
        slices.append((p, a, a + n))
    total = args.parts * n * 2 / 1e6
    print(f"{args.parts} scratch files, one slice of {n * 2 / 1e6:.2f} MB from each ({total:,.0f} MB a round), "
          f"past the page cache where the file system allows")
    times: dict[int, list[float]] = {1: [], packing.READ_THREADS: []}
    spaces = {threads: pack_fast.Space() for threads in times}  # kept from round to round, as a worker's are
    first = None
    for _ in range(args.rounds):
        for threads in times:
            packing.READ_THREADS = threads
            t = time.perf_counter()
            got = packing.read_slices(slices, spaces[threads], "x")
            times[threads].append(time.perf_counter() - t)
            digest = [hashlib.md5(g).hexdigest() for g in got]
            first = first or digest
            if digest != first:
                raise SystemExit("the reads differ between thread counts (a bug)")
    one, many = (statistics.median(v) for v in times.values())
    for threads, v in times.items():
        print(f"  {threads} at once: " + ", ".join(f"{x:.3f}" for x in v) + f" s a round; median "
              f"{statistics.median(v):.3f} s, {total / statistics.median(v):,.0f} MB/s")
    print(f"  {max(times)} at once against 1: {one / many:.2f}x (medians); the same values read; peak RSS "
          f"{peak_rss_mb():,.0f} MB")


if __name__ == "__main__":
    raise SystemExit(main())
