"""What one pack-habana group's gather (``preprocessing.habana.pack._gather``) costs at full size, where every group
takes its places' rows from all 500 inputs' scratch files: the groups of 8 files with each file opened again every
group (the tree before 4dda8ce) against groups of ``HabanaPackConfig.group_files`` files with the files' maps kept in
the process (``packing.scratch_map``). The part-sized bench (bench_scale on 8 parts) cannot show this: its groups
read from 8 inputs.

    python bench/bench_group_gather.py [--inputs 500] [--rows-per-input 1500] [--groups 3] [--dir DIR]

The scratch is synthetic, in the scatter's format (places sorted, lengths 20..511, 1..75 predictions, segment ids
as one number a row, the big arrays saved past the page cache where the file system allows), written once into a
temporary folder under ``--dir`` and removed at the end. Prints CPU and wall seconds a group (a worker's first
group maps every file once; the next ones are what the rest cost), rows a CPU-second, peak RSS, the full set's
projection (156,725,653 rows, one worker's groups one after the other) and the ratio of the two; the two gathers'
rows are compared.
"""

from __future__ import annotations

import argparse
import hashlib
import resource
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from memory_state import peak_rss_mb, temp_folder  # noqa: E402

from preprocessing import packing  # noqa: E402
from preprocessing.habana import pack as hp  # noqa: E402

FULL_ROWS = 156_725_653
#: Rows a packed file holds on the real set (4,480 packs of 1.26 sequences: bench_scale's habana-packed-narrow run).
ROWS_PER_FILE = 5_645


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def write_scratch(sd: Path, inputs: int, rows: int) -> None:
    """Each input's rows in the scatter's format, their places a random share of ``inputs * rows``."""
    rng = np.random.default_rng(0)
    place = rng.permutation(inputs * rows)
    for k in range(inputs):
        stem = sd / f"in_{k:05d}"
        seq, pred = rng.integers(20, 512, rows), rng.integers(1, 76, rows)
        np.save(f"{stem}_keys.npy", np.sort(place[k * rows:(k + 1) * rows]))
        np.save(f"{stem}_tok.npy", np.concatenate([[0], np.cumsum(seq)]))
        np.save(f"{stem}_prd.npy", np.concatenate([[0], np.cumsum(pred)]))
        np.save(f"{stem}_nsl.npy", rng.integers(0, 2, rows).astype(np.int8))
        np.save(f"{stem}_segb.npy", (seq // 2).astype(np.int16))
        for short, n, hi in (("ids", int(seq.sum()), 30000), ("pos", int(pred.sum()), 500),
                             ("mlm", int(pred.sum()), 30000)):
            packing.save_array(Path(f"{stem}_{short}.npy"), rng.integers(0, hi, n).astype(np.int16), direct=True)


def digest(got: dict) -> str:
    h = hashlib.md5()
    for name in ("seq", "pred", "next_sentence_labels", "masked_lm_positions", "masked_lm_ids"):
        h.update(np.ascontiguousarray(got[name]).tobytes())
    for name in ("input_ids", "segment_ids"):
        v = got[name]
        h.update(np.ascontiguousarray(v.values(got["seq"]) if hasattr(v, "values") else v).tobytes())
    return h.hexdigest()


def run(sd: Path, inputs: int, size: int, groups: int, keep: bool) -> tuple[list[float], list[float], str]:
    """CPU and wall seconds of ``groups`` successive groups of ``size`` rows; the first group's rows' digest."""
    packing.forget_scratch_maps()
    cpus, walls, first = [], [], ""
    for g in range(groups):
        if not keep:
            packing.forget_scratch_maps()  # each file opened and parsed again, as every group did before
        c, t = cpu(), time.perf_counter()
        got = hp._gather(str(sd), inputs, g * size, (g + 1) * size)
        cpus.append(cpu() - c)
        walls.append(time.perf_counter() - t)
        first = first or digest(got)
        del got
    packing.forget_scratch_maps()
    return cpus, walls, first


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--inputs", type=int, default=500, help="inputs (parts) every group reads from (default 500)")
    ap.add_argument("--rows-per-input", type=int, default=1500,
                    help="rows of each input's scratch (default 1500: two groups of 64 files and some)")
    ap.add_argument("--groups", type=int, default=3, help="groups timed of each kind (default 3)")
    ap.add_argument("--files", type=int, default=hp.HabanaPackConfig().group_files,
                    help="files a group writes now (default: HabanaPackConfig's group_files)")
    ap.add_argument("--rows-per-file", type=int, default=ROWS_PER_FILE,
                    help=f"rows a packed file holds (default {ROWS_PER_FILE:,}: the real set's)")
    ap.add_argument("--dir", type=Path, default=None, help="where the scratch goes (default: the system's temp)")
    args = ap.parse_args(argv)
    total = args.inputs * args.rows_per_input
    groups = min(args.groups, total // (args.files * args.rows_per_file))
    if groups < 1:
        raise SystemExit(f"--inputs x --rows-per-input ({total:,} rows) is less than one group of {args.files} files "
                         f"({args.files * args.rows_per_file:,} rows): raise --rows-per-input")
    with temp_folder("bench-group-gather-", args.dir) as work:
        _run(args, work, total, groups)
    return 0


def _run(args: argparse.Namespace, work: Path, total: int, groups: int) -> None:
    t = time.perf_counter()
    write_scratch(work, args.inputs, args.rows_per_input)
    print(f"{args.inputs} inputs' scratch, {args.rows_per_input:,} rows each ({total:,} in all; written in "
          f"{time.perf_counter() - t:.1f} s); a file holds {args.rows_per_file:,} rows")
    figures = {}
    for label, files, keep in (("before: 8 files a group, every file opened again each group", 8, False),
                               (f"now: {args.files} files a group, the maps kept", args.files, True)):
        rows = files * args.rows_per_file
        cpus, walls, first = run(work, args.inputs, rows, groups, keep)
        n_full = -(-FULL_ROWS // rows)
        nxt = statistics.median(cpus[1:]) if len(cpus) > 1 else cpus[0]
        full = cpus[0] + (n_full - 1) * nxt
        figures[label] = (full, first)
        print(f"  {label}: {rows:,} rows a group")
        print("    CPU a group: " + ", ".join(f"{x:.3f}" for x in cpus) + " s; wall " +
              ", ".join(f"{x:.3f}" for x in walls) + f" s; {rows / nxt:,.0f} rows a CPU-second after the first")
        print(f"    the full set: {n_full:,} groups, {full:,.0f} CPU-s ({full / 3600:.2f} core-hours) in the gathers")
    (before, d0), (now, _) = figures.values()
    if digest(hp._gather(str(work), args.inputs, 0, 8 * args.rows_per_file)) != d0:  # the same rows through kept maps
        raise SystemExit("the gather through kept maps differs from the one through fresh ones (a bug)")
    packing.forget_scratch_maps()
    print(f"  now against before: {before / now:.1f}x less CPU in the full set's gathers; the same rows through "
          f"kept maps; peak RSS {peak_rss_mb():,.0f} MB")


if __name__ == "__main__":
    raise SystemExit(main())
