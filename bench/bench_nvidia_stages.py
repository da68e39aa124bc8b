"""NVIDIA's target stages on one padded part, this tree against a baseline tree, interleaved in one session.

    .venv/bin/python bench/bench_nvidia_stages.py --part /tmp/realpart/real/h5/part-00000-of-00500.hdf5 \\
        --baseline /tmp/nvbase --rounds 3

The stages, as ``bench/bench_scale.py --targets-only`` runs them: the chop into variable-length shards (this part's
share of NVIDIA's 4,320: ~5; ``nvidia_4320``), the shuffle of its shards (``nvidia_4320_shuffled``: nvidia-2048's
route), the shuffle of the same rows straight from the padded part (``nvidia_4320_padded``: nvidia-4320's stage;
a tree without it stops there) and the variable-length eval pick (10,000 rows; ``nvidia_eval``). Each run is a process of its own (``--workers`` for the stage's pool); a round
runs every stage on the baseline tree, then on this one (``--baseline``: a copy of another commit, e.g.
``mkdir /tmp/base && git archive <commit> | tar -x -C /tmp/base``, with the built C extensions copied beside their
sources). Printed per stage: CPU seconds of the stage's call (user + sys, from just before the call, as
bench_scale.py counts them; the process's with the interpreter's start and imports beside it), peak RSS, rows per CPU
second, the shares of the stage's CPU (with one worker: md5, the HDF5 writes, fsync and close, the rest: reading,
checks and moving rows), the median over the rounds and the ratio baseline / this tree; then every output file's
md5 compared between the trees (the bytes must be the same). ``--bucket-rows`` sets the shuffle's buckets (the
full set has 288 of 15 shards, ~544,000 rows; one part has one unless this is smaller). Load: ``os.getloadavg()`` is
printed. CPU figures are for ``--workers 1``: a pool's workers are the forkserver's children, whose CPU neither the
stage's process nor this one is told of (with more workers, read the round lines' wall instead).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FULL_ROWS = 156_725_653  # NVIDIA's training rows (4,320 shards)
STAGES = ("nvidia_4320", "nvidia_4320_shuffled", "nvidia_4320_padded", "nvidia_eval")

CHILD = r"""
import json, os, resource, sys, time
from pathlib import Path
root, part, out, what, workers, bucket_rows = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], \
    int(sys.argv[5]), int(sys.argv[6])
sys.path.insert(0, root)
import core  # first, as every bertpipe process (it keeps OpenBLAS to one thread before numpy starts)
import h5py
import numpy as np
with h5py.File(part, "r") as f:
    rows = int(f["next_sentence_labels"].shape[0])
shards = max(1, round(4320 * rows / 156_725_653))
spent = {"md5": 0.0, "hdf5 write": 0.0, "fsync+close": 0.0}
def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime
inside = [False]
def timed(mod, name, key):
    real = getattr(mod, name, None)
    if real is None or getattr(real, "timed", False):
        return
    def wrapper(*a, **k):
        if inside[0]:  # a timed call inside another (md5_files -> md5_file): counted once, by the outer one
            return real(*a, **k)
        inside[0] = True
        t = cpu()
        try:
            return real(*a, **k)
        finally:
            spent[key] += cpu() - t
            inside[0] = False
    wrapper.timed = True
    setattr(mod, name, wrapper)
import core.manifest as cm
import core.manifest.format as cmf
import preprocessing.hdf5_io as hio
for mod in (cm, cmf):
    timed(mod, "md5_files", "md5")
    timed(mod, "md5_file", "md5")
timed(hio, "h5_close_for_good", "fsync+close")
c0 = cpu()
if what == "nvidia_4320":
    import preprocessing.nvidia.chop as mod
    timed(mod, "md5_files", "md5")
    timed(hio, "write_vlen", "hdf5 write")
    m = mod.run_nvidia_chop([part], out / what, mod.ChopConfig(num_shards=shards, varlength=True), workers=workers)
elif what == "nvidia_4320_shuffled":
    import preprocessing.nvidia.shuffle as mod
    timed(mod, "md5_files", "md5")
    timed(mod, "write_vlen", "hdf5 write")
    timed(mod, "write_vlen_at", "hdf5 write")
    cfg = mod.ShuffleConfig(bucket_rows=bucket_rows) if bucket_rows else mod.ShuffleConfig()
    m = mod.run_nvidia_shuffle(mod.input_files(out / "nvidia_4320"), out / what, cfg, workers=workers)
elif what == "nvidia_4320_padded":  # nvidia-4320's stage since 2026-11-28: the shuffle from the padded part
    import preprocessing.nvidia.shuffle as mod
    timed(mod, "md5_files", "md5")
    timed(mod, "write_vlen_at", "hdf5 write")
    if not hasattr(mod, "run_nvidia_shuffle_padded"):
        raise SystemExit("this tree has no padded route (run_nvidia_shuffle_padded)")
    cfg = mod.PaddedShuffleConfig(num_shards=shards, **({"bucket_rows": bucket_rows} if bucket_rows else {}))
    m = mod.run_nvidia_shuffle_padded([part], out / what, cfg, workers=workers)
else:
    import preprocessing.nvidia.eval_pick as mod
    import core.manifest.output as cmo
    timed(cmo, "md5_file", "md5")
    timed(hio, "write_vlen", "hdf5 write")
    m = mod.run_pick_eval_varlength(part, out / what, mod.PickVarlenConfig(num_examples_to_pick=10000))
c1 = cpu()
ch = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps({"cpu": c1 - c0, "rows": rows, "spent": spent, "bytes": sum(f.bytes for f in m.files),
                  "rss": max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, ch.ru_maxrss) / 1024}))
"""


def run(tree: Path, part: Path, out: Path, what: str, workers: int, bucket_rows: int) -> dict:
    before = os.times()
    t0 = time.perf_counter()
    env = dict(os.environ, DS_ACCELERATOR="cpu", PYTHONPATH=str(tree))
    res = subprocess.run([sys.executable, "-c", CHILD, str(tree), str(part), str(out), what, str(workers),
                          str(bucket_rows)], capture_output=True, text=True, env=env, cwd=tree)
    after = os.times()
    wall = time.perf_counter() - t0
    if res.returncode:
        raise SystemExit(f"{what} on {tree} failed:\n{res.stderr[-3000:]}")
    fig = json.loads(res.stdout.strip().splitlines()[-1])
    fig["wall"] = wall
    fig["total"] = (after.children_user - before.children_user) + (after.children_system - before.children_system)
    return fig


def digests(d: Path) -> dict[str, str]:
    return {str(p.relative_to(d)): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(d.rglob("*.hdf5"))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", type=Path, required=True, help="a padded part (part-00000-of-00500.hdf5)")
    ap.add_argument("--baseline", type=Path, help="another tree of bertpipe to compare with (run first each round)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--workers", type=int, default=1)
    ap.add_argument("--bucket-rows", type=int, default=0, help="the shuffle's bucket size (0: its default)")
    ap.add_argument("--stages", nargs="*", default=list(STAGES), choices=STAGES)
    ap.add_argument("--tmp", type=Path, default=None, help="where the outputs go (default: a temporary folder)")
    args = ap.parse_args()
    trees = {"baseline": args.baseline, "this": ROOT} if args.baseline else {"this": ROOT}
    figs: dict[tuple[str, str], list[dict]] = {}
    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        for r in range(args.rounds):
            for label, tree in trees.items():
                out = Path(tmp) / label
                for what in args.stages:
                    if what == "nvidia_4320_shuffled" and not (out / "nvidia_4320").is_dir():
                        run(tree, args.part, out, "nvidia_4320", args.workers, args.bucket_rows)
                    f = run(tree, args.part, out, what, args.workers, args.bucket_rows)
                    figs.setdefault((label, what), []).append(f)
                    print(f"round {r + 1} {label:<8} {what:<22} cpu {f['cpu']:5.2f} s (process {f['total']:5.2f}, wall "
                          f"{f['wall']:5.2f})"
                          f" peak RSS {f['rss']:6.0f} MB  load {os.getloadavg()[0]:.2f}", flush=True)
        print(f"\n## medians over {args.rounds} round(s), {args.workers} worker(s); load now "
              f"{', '.join(f'{x:.2f}' for x in os.getloadavg())}")
        for what in args.stages:
            for label in trees:
                fs = figs[(label, what)]
                cpu = statistics.median(f["cpu"] for f in fs)  # the stage's call, as bench_scale.py counts it
                total = statistics.median(f["total"] for f in fs)
                rows = fs[0]["rows"]
                scale = 1 if what == "nvidia_eval" else FULL_ROWS / rows
                shares = {k: statistics.median(f["spent"][k] for f in fs) for k in fs[0]["spent"]}
                rest = max(0.0, cpu - sum(shares.values()))
                share_txt = ", ".join(f"{k} {v:.2f}" for k, v in shares.items()) + f", read+checks+moves {rest:.2f}"
                print(f"{what:<22} {label:<8} {cpu:6.2f} CPU-s (process {total:5.2f})  {rows / cpu / 1e3:7.1f} k rows/CPU-s  "
                      "peak RSS "
                      f"{max(f['rss'] for f in fs):6.0f} MB  full size (x{scale:.0f} by rows) "
                      f"{cpu * scale / 3600:.3f} core-h  [{share_txt}]")
            if "baseline" in trees:
                b = statistics.median(f["cpu"] for f in figs[("baseline", what)])
                t = statistics.median(f["cpu"] for f in figs[("this", what)])
                print(f"{what:<22} baseline / this: {b / t:.2f}x")
        this = Path(tmp) / "this"
        if (this / "nvidia_4320_padded").is_dir() and (this / "nvidia_4320_shuffled").is_dir():
            same = digests(this / "nvidia_4320_padded") == digests(this / "nvidia_4320_shuffled")
            print(f"\nthe padded route's shards and the chop's shards shuffled: {'the same bytes' if same else 'DIFFERENT'}")
            if not same:
                raise SystemExit(1)
        if "baseline" in trees:
            same = digests(Path(tmp) / "baseline") == digests(Path(tmp) / "this")
            print(f"\nevery output file's md5: {'the same in both trees' if same else 'DIFFERENT'}")
            if not same:
                raise SystemExit(1)


if __name__ == "__main__":
    main()
