"""The packers (pack-nvidia, pack-habana) on one real part, step by step, against a baseline tree in the same session.

    .venv/bin/python bench/bench_packers.py --part /tmp/realpart/real/h5/part-00000-of-00500.hdf5 \\
        --work /tmp/pk_work --base /tmp/pk_base --runs 2 [--which nvidia habana habana-raw habana-narrow] [--gzip-share]

``--base``: a copy of an earlier tree (``git archive <commit> | tar -x -C DIR`` and its built ``*.so``), run with the
same interpreter; without it only this tree runs. Each run is a child process (one core, ``workers=1``) that packs the
part as bench/bench_scale.py's step 5 does (pack-nvidia: this part's share of 4,320 shards, ~5, in one shard group;
pack-habana: max_predictions_per_sequence 76, the DAG's ``packed/`` folder) and reports its CPU seconds (user + sys,
from getrusage) with the packing recipe left out: the recipe (strategies and NNLS, from the lengths' histogram only,
counted once at full size) is computed once per histogram (both trees share that code) and then loaded from a cache, and its CPU is
what the cache load costs. Each step's CPU (inclusive: nested steps overlap) and the peak RSS are printed, the runs
of both trees interleaved; every output file's md5 is compared between the trees (byte-identical outputs).

``--gzip-share``: Habana's files are gzip level 4 (zlib's deflate through h5py's filter); the CPU of deflating the
written files' chunks again with Python's zlib at level 4 is printed (the share of pack-habana's CPU bound to zlib),
and whether those bytes equal the stored chunks.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
FULL_ROWS = 156_725_653  # sequences of the full set (bench_scale's figure)

CHILD = r'''
import hashlib, json, os, pickle, resource, sys, time
from pathlib import Path
part, out, which, cache = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
profile = len(sys.argv) > 5 and sys.argv[5] == "profile"
nparts = int(sys.argv[6]) if len(sys.argv) > 6 else 1
# --parts N: the part under N names (hard links beside it, made by the parent): the stage's calls as at full size,
# N scatters and its own groups of shards, in this one process
parts = [part] + [part.with_name(f"{part.stem}.link{i}{part.suffix}") for i in range(1, nparts)]

def cpu():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime

steps = {}

def timed(owner, name, label=None):
    real = getattr(owner, name, None)
    if real is None:
        return
    label = label or name
    def wrapper(*a, **k):
        t = cpu()
        try:
            return real(*a, **k)
        finally:
            s = steps.setdefault(label, [0.0, 0])
            s[0] += cpu() - t
            s[1] += 1
    setattr(owner, name, wrapper)

recipe_cpu = [0.0]
def cached_recipe(mod):
    real = mod.packing_recipe
    def recipe(*a, **k):
        import numpy as np
        t = cpu()
        h = hashlib.md5(repr([np.asarray(x).tobytes() if hasattr(x, "__len__") else x for x in a]).encode()
                        + repr(sorted((kk, v) for kk, v in k.items() if kk != "say")).encode()).hexdigest()
        p = cache / f"recipe_{which}_{h}.pkl"
        if p.exists():
            r = pickle.loads(p.read_bytes())
        else:
            r = real(*a, **k)
            p.write_bytes(pickle.dumps(r))
        recipe_cpu[0] += cpu() - t
        return r
    mod.packing_recipe = recipe

import core.manifest
import h5py  # noqa: F401 (imported before the clock starts, as the CLI has it)
import numpy as np  # noqa: F401
import scipy.optimize  # noqa: F401
c0 = cpu()
if which == "nvidia":
    import preprocessing.nvidia.pack as mod
    from preprocessing.nvidia.pack import PackNvidiaConfig, run_pack_nvidia
    cached_recipe(mod)
    for n in ("count_lengths", "plan_packing", "scatter_input", "write_shard_group", "write_packed_shard",
              "shard_list_json", "md5_files", "_gather", "finish_pack"):
        timed(mod, n)
    import preprocessing.hdf5_io as hio
    with h5py.File(part, "r") as f:
        rows = int(f["next_sentence_labels"].shape[0])
    shards = max(1, round(4320 * rows * nparts / 156_725_653))
    if nparts == 1:  # one part: one call for its ~5 shards, as bench_scale has it (at full size ~29 a call)
        mod.group_bounds = lambda n_seq, shards_num, workers: [(0, shards_num)]
    c0, r0 = cpu(), resource.getrusage(resource.RUSAGE_SELF)
    if profile:
        import cProfile, pstats
        pr = cProfile.Profile()
        pr.enable()
    m = run_pack_nvidia(parts, out, PackNvidiaConfig(shards_num=shards))
    if profile:
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(25)
else:
    import preprocessing.habana.pack as mod
    from preprocessing.habana.pack import HabanaPackConfig, run_pack_habana
    cached_recipe(mod)
    for n in ("read_inputs", "assign_packs", "scatter_input", "write_group", "build_packs", "write_packed_file",
              "_gather", "write_files"):
        timed(mod, n)
    timed(core.manifest, "md5_files")
    kw = {}
    if which in ("habana-raw", "habana-narrow"):
        kw["compression"] = "none"
    if which == "habana-narrow":
        kw["dtypes"] = "narrow"
    cfg = HabanaPackConfig(max_predictions_per_sequence=76, **kw)
    with h5py.File(part, "r") as f:
        rows = int(f["next_sentence_labels"].shape[0])
    c0, r0 = cpu(), resource.getrusage(resource.RUSAGE_SELF)
    if profile:
        import cProfile, pstats
        pr = cProfile.Profile()
        pr.enable()
    m = run_pack_habana(parts, out, cfg, data_dir="packed")
    if profile:
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(25)
c1 = cpu()
r = resource.getrusage(resource.RUSAGE_SELF)
print("RESULT " + json.dumps({"cpu": c1 - c0, "recipe_cpu": recipe_cpu[0], "rows": rows * nparts,
                              "sys": r.ru_stime - r0.ru_stime, "minflt": r.ru_minflt - r0.ru_minflt,
                              "rss_mb": r.ru_maxrss / 1024, "steps": steps,
                              "bytes": sum(f.bytes for f in m.files)}))
'''


def md5_tree(d: Path) -> dict[str, str]:
    out = {}
    for p in sorted(d.rglob("*")):
        if p.is_file() and p.name != "_manifest.json" and ".manifest" not in p.name:
            out[str(p.relative_to(d))] = hashlib.md5(p.read_bytes()).hexdigest()
    return out


def run_child(tree: Path, part: Path, out: Path, which: str, cache: Path, profile: bool = False, parts: int = 1,
              fill: Any = None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), DS_ACCELERATOR="cpu", PREFECT_SERVER_ANALYTICS_ENABLED="false")
    for i in range(1, parts):  # the part under more names (hard links): the child packs them all
        link = part.with_name(f"{part.stem}.link{i}{part.suffix}")
        if not link.exists():
            os.link(part, link)
    cmd = [sys.executable, "-c", CHILD, str(part), str(out), which, str(cache), "profile" if profile else "-",
           str(parts)]
    # a fresh folder each run: renaming a new file over the last run's (ext4's auto_da_alloc) allocates and starts
    # writing its blocks inside rename(2), ~0.3 s a part that a run into an empty folder never pays
    shutil.rmtree(out, ignore_errors=True)
    if fill is not None:
        fill.top_up()
    p = subprocess.run(cmd, env=env, cwd=str(tree), capture_output=True, text=True)
    if p.returncode:
        raise SystemExit(f"{tree} {which} failed:\n{p.stderr[-4000:]}")
    if profile:
        print(p.stdout)
    line = next(ln for ln in p.stdout.splitlines() if ln.startswith("RESULT "))
    return json.loads(line[7:])


def gzip_share(folder: Path) -> None:
    """Deflate every stored chunk of Habana's files again at level 4 with Python's zlib: CPU, and equal bytes?"""
    import zlib

    import h5py
    import numpy as np

    t_cpu, raw, comp, same, chunks = 0.0, 0, 0, 0, 0
    for p in sorted(folder.glob("*.hdf5")):
        with h5py.File(p, "r") as f:
            for ds in f.values():
                arr = ds[()]
                cs = ds.chunks
                for idx in np.ndindex(*[-(-s // c) for s, c in zip(ds.shape, cs, strict=True)]):
                    off = tuple(i * c for i, c in zip(idx, cs, strict=True))
                    block = np.zeros(cs, dtype=ds.dtype)
                    sl = tuple(slice(o, min(o + c, s)) for o, c, s in zip(off, cs, ds.shape, strict=True))
                    block[tuple(slice(0, x.stop - x.start) for x in sl)] = arr[sl]
                    data = block.tobytes()
                    t = time.process_time()
                    z = zlib.compress(data, 4)
                    t_cpu += time.process_time() - t
                    stored = ds.id.read_direct_chunk(off)[1]
                    same += z == stored
                    chunks += 1
                    raw += len(data)
                    comp += len(z)
    print(f"gzip share: {chunks} chunks, {raw / 1e6:,.0f} MB -> {comp / 1e6:,.0f} MB, zlib level 4 {t_cpu:.2f} CPU-s "
          f"({raw / 1e6 / max(t_cpu, 1e-9):,.0f} MB/CPU-s); Python's zlib gives the stored bytes for {same}/{chunks}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", type=Path, required=True)
    ap.add_argument("--work", type=Path, required=True)
    ap.add_argument("--base", type=Path, help="the baseline tree (run with this interpreter)")
    ap.add_argument("--which", nargs="+", default=["nvidia", "habana"],
                    choices=["nvidia", "habana", "habana-raw", "habana-narrow"])
    ap.add_argument("--runs", type=int, default=1)
    ap.add_argument("--profile", action="store_true", help="cProfile this tree's packer runs")
    ap.add_argument("--gzip-share", action="store_true")
    ap.add_argument("--parts", type=int, default=1, help="pack the part under this many names (hard links beside "
                    "it), in one process: the stage's calls as at full size (N scatters, its own shard groups), "
                    "the buffers' first touches spread over N parts")
    ap.add_argument("--memory", choices=("free", "full"), default="free",
                    help="'full': the free memory filled with clean page cache before each run (down to "
                    "--leave-mb), as a full-size run's state after its first parts (bench/memory_state.py)")
    ap.add_argument("--leave-mb", type=int, default=1024)
    args = ap.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        fill = None
        if args.memory == "full":
            sys.path.insert(0, str(Path(__file__).resolve().parent))
            from memory_state import FullPageCache

            fill = stack.enter_context(FullPageCache(args.work / "memory-fill", leave_mb=args.leave_mb,
                                                     disk_spare_mb=20480))
        try:
            run_all(args, fill)
        finally:
            for i in range(1, args.parts):
                args.part.with_name(f"{args.part.stem}.link{i}{args.part.suffix}").unlink(missing_ok=True)


def run_all(args: argparse.Namespace, fill: Any) -> None:
    trees = [("new", ROOT)] + ([("base", args.base)] if args.base else [])
    print(f"# {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC, load {os.getloadavg()[0]:.2f}, "
          f"{args.part} ({args.part.stat().st_size / 1e6:,.0f} MB)")
    for which in args.which:
        figs: dict[str, list[dict]] = {}
        for r in range(args.runs):
            for label, tree in (trees if r % 2 == 0 else trees[::-1]):
                if which == "habana-raw" and label == "base" and \
                        "configure_raw" not in (tree / "preprocessing" / "habana" / "pack.py").read_text():
                    continue  # a base from before pack-habana --compression none
                if which == "habana-narrow" and label == "base" and \
                        "configure_narrow" not in (tree / "preprocessing" / "habana" / "pack.py").read_text():
                    continue  # a base from before pack-habana --dtypes narrow
                cache = args.work / "cache"  # the recipe code is the same in both trees: one cache
                cache.mkdir(exist_ok=True)
                if r == 0 and not any(cache.glob(f"recipe_{which}_*")):  # fill the recipe cache first
                    run_child(tree, args.part, args.work / f"{label}_{which}", which, cache, parts=args.parts)
                load = os.getloadavg()[0]
                f = run_child(tree, args.part, args.work / f"{label}_{which}", which, cache,
                              profile=args.profile and label == "new", parts=args.parts, fill=fill)
                f["load"] = load
                figs.setdefault(label, []).append(f)
                steps = ", ".join(f"{k} {v[0]:.2f}" for k, v in f["steps"].items())
                print(f"{which:<11} {label:<5} run {r}: {f['cpu'] - f['recipe_cpu']:6.2f} CPU-s besides the recipe "
                      f"(x{FULL_ROWS / f['rows']:.0f} = {(f['cpu'] - f['recipe_cpu']) * FULL_ROWS / f['rows'] / 3600:.3f}"
                      f" core-h; system {f.get('sys', 0):.2f} s, {f.get('minflt', 0) / 1e3:,.0f} k minor faults), peak RSS "
                      f"{f['rss_mb']:.0f} MB, load {load:.2f}, {f['bytes'] / 1e6:,.0f} MB out; "
                      f"steps: {steps}", flush=True)
        if "base" in figs:
            new = min(x["cpu"] - x["recipe_cpu"] for x in figs["new"])
            base = min(x["cpu"] - x["recipe_cpu"] for x in figs["base"])
            a, b = md5_tree(args.work / f"new_{which}"), md5_tree(args.work / f"base_{which}")
            print(f"{which}: best new {new:.2f} / best base {base:.2f} CPU-s = {new / base:.2f}x; outputs "
                  f"{'IDENTICAL' if a == b else 'DIFFER'} ({len(a)} files)")
        if which == "habana" and args.gzip_share:
            gzip_share(args.work / f"new_{which}" / "packed")


if __name__ == "__main__":
    main()
