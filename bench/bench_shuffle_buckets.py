"""What the shuffle's scatter (``preprocessing.nvidia.shuffle.scatter``, the padded route of ``nvidia-4320`` and
``nvidia-2048``) costs at the full set's bucket count, against the bucket count of the part-sized runs.

At full size the scatter sends every chunk of 65,536 rows to ~300 buckets (156.7 M rows in buckets of
``ShuffleConfig.bucket_rows``), so each record it appends is ~0.3 MB. On 8 parts, ``bench_scale`` has 3 buckets and
records of ~28 MB, so it cannot show a cost that grows with the number of records. This bench runs the same
parts' scatter both ways, with the scratch past the page cache as at full size:

    python bench/bench_scale.py --targets-only --keep-work /tmp/bp    # makes the real part's padded HDF5
    python bench/bench_shuffle_buckets.py --part /tmp/bp/real/h5/part-00000-of-00500.hdf5 [--copies 8] [--repeat 3]

The part is hard-linked under ``--copies`` names in a temporary folder under ``--dir``. The bench prints CPU and
wall seconds of the scatter calls, rows a CPU-second, the scratch's files and bytes, peak RSS, and the ratio of the
full-size layout to the part-sized one (medians). The full set's extra CPU is projected from that difference.
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memory_state import peak_rss_mb, temp_folder  # noqa: E402

import core  # noqa: E402,F401  (first, as in every bertpipe process: its settings)
from preprocessing.nvidia import shuffle as sh  # noqa: E402
from preprocessing.nvidia.chop import ChopConfig, count_rows  # noqa: E402

FULL_ROWS = 156_725_653
#: The full set's buckets: its rows in buckets of ShuffleConfig.bucket_rows.
FULL_BUCKETS = -(-FULL_ROWS // sh.ShuffleConfig().bucket_rows)


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def scatter_once(counts: list[tuple[str, int]], work: Path, cfg: sh.PaddedShuffleConfig) -> dict[str, float]:
    """Every scatter call of one worker for ``counts``' parts, its scratch past the page cache; then removed."""
    sd = work / "scratch"
    shutil.rmtree(sd, ignore_errors=True)
    sd.mkdir(parents=True)
    plan = sh.padded_plan(counts, sd, cfg, 1)
    (sd / sh.DIRECT_MARK).touch()  # as at full size: the scratch is larger than memory
    c, t = cpu(), time.perf_counter()
    for task, ids in sh.scatter_tasks(plan, 1):
        sh.scatter(plan, task, ids)
    got = {"cpu": cpu() - c, "wall": time.perf_counter() - t, "buckets": len(plan.bucket_shards) - 1}
    files = list(sd.glob("b*.t*"))
    got.update(files=len(files), mb=sum(f.stat().st_size for f in files) / 2**20)
    shutil.rmtree(sd)
    return got


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", type=Path, required=True, help="a padded part (part-*-of-00500.hdf5)")
    ap.add_argument("--copies", type=int, default=8, help="the part under this many names (default 8)")
    ap.add_argument("--repeat", type=int, default=3, help="runs of each layout, interleaved (default 3)")
    ap.add_argument("--dir", type=Path, default=None, help="where the scratch goes (default: the system's temp)")
    args = ap.parse_args(argv)
    with temp_folder("bench-shuffle-buckets-", args.dir) as work:
        parts = []
        for i in range(args.copies):
            p = work / f"part-{i:05d}-of-00500.hdf5"
            try:
                os.link(args.part, p)
            except OSError:  # another file system: a link by name
                p.symlink_to(args.part.resolve())
            parts.append(p)
        counts = [(str(p), count_rows(str(p), ChopConfig(num_shards=1, varlength=True))) for p in parts]
        rows = sum(n for _, n in counts)
        small = sh.PaddedShuffleConfig(num_shards=max(1, round(4320 * rows / FULL_ROWS)))  # bench_scale's share
        full = sh.PaddedShuffleConfig(num_shards=max(FULL_BUCKETS, min(4320, rows // 16)),
                                      bucket_rows=max(1, -(-rows // FULL_BUCKETS)))
        print(f"{args.copies} parts, {rows:,} rows; scatter past the page cache, one worker, {args.repeat} runs "
              "of each layout, interleaved")
        runs: dict[str, list[dict[str, float]]] = {"part-sized": [], "full-size": []}
        for _ in range(args.repeat):
            for label, cfg in (("part-sized", small), ("full-size", full)):
                runs[label].append(scatter_once(counts, work, cfg))
        med = {}
        for label, got in runs.items():
            cpus = [g["cpu"] for g in got]
            med[label] = statistics.median(cpus)
            g = got[0]
            print(f"  {label}: {int(g['buckets'])} buckets, {int(g['files'])} scratch files, {g['mb']:,.0f} MB; "
                  f"CPU " + ", ".join(f"{x:.2f}" for x in cpus) + " s, wall " +
                  ", ".join(f"{x['wall']:.2f}" for x in got) + f" s; {rows / med[label]:,.0f} rows a CPU-second")
        extra = (med["full-size"] - med["part-sized"]) * FULL_ROWS / rows
        print(f"  full-size against part-sized: {med['full-size'] / med['part-sized']:.2f}x the scatter's CPU "
              f"(medians); at full size {extra:,.0f} CPU-s ({extra / 3600:+.3f} core-hours) that the part-sized "
              f"runs do not show; peak RSS {peak_rss_mb():,.0f} MB")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
