"""pack-habana's plan (the main process's step between reading the lengths and scattering the rows) on a synthetic
set: a real part's lengths and recipe, ``--scale`` times (x844 ~ the full set's 156.7 M sequences), for its peak RSS.

    .venv/bin/python bench/bench_habana_plan.py --part /tmp/realpart/real/h5/part-00000-of-00500.hdf5 --scale 100 \\
        [--cache /tmp/habana_recipe.pkl] [--scratch DIR]

The lengths are held as read_inputs holds them (uint16 lengths, uint8 predictions); the recipe is the part's (its
NNLS solved once and cached in ``--cache``) with the mixture and padding scaled, and its per-sequence figures
(histogram, theoretical speed-up, padding tokens) computed on the scaled lengths; then assign_packs (the packs
written to ``--scratch``) and row_places. Printed: the RSS before and after each step and the peak (getrusage), the
bytes a sequence above the RSS before, and the CPU seconds. The peak is reset after the part is read (Linux).
"""

from __future__ import annotations

import argparse
import pickle
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def rss_mb() -> float:
    """The process's peak RSS (VmHWM, since the last reset_peak), MB."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def reset_peak() -> None:
    """Linux: the peak RSS starts again from the current RSS (the part's reading is not the plan's)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--part", type=Path, required=True, help="a padded HDF5 part (tfrecord-to-hdf5's)")
    ap.add_argument("--scale", type=int, default=50)
    ap.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "bench_habana_plan_recipe.pkl")
    ap.add_argument("--scratch", type=Path, default=None, help="where the packs are written (default: a temp dir)")
    args = ap.parse_args()
    import preprocessing.habana.pack as mod

    cfg = mod.HabanaPackConfig(max_predictions_per_sequence=76)
    seq1, pred1 = mod.read_lengths(args.part, cfg)
    if args.cache.exists():
        recipe = pickle.loads(args.cache.read_bytes())
    else:
        recipe = mod.packing_recipe(seq1, cfg.max_sequence_length, cfg.max_sequences_per_pack)
        args.cache.write_bytes(pickle.dumps(recipe))
    a = mod.strategy_matrix(recipe.strategies, cfg.max_sequence_length)
    reset_peak()
    base = rss_mb()
    seq, pred = np.tile(seq1, args.scale), np.tile(pred1, args.scale)  # as read_inputs holds them
    del seq1, pred1
    rec = replace(recipe, mixture=recipe.mixture * args.scale, padding=recipe.padding * args.scale)
    t = time.process_time()
    hist = np.zeros(cfg.max_sequence_length + 1, np.int64)
    for i in range(0, len(seq), mod._PIECE):
        hist += np.bincount(seq[i:i + mod._PIECE], minlength=cfg.max_sequence_length + 1)
    mod._recipe_stats(a, rec.mixture, rec.padding, seq, cfg.max_sequence_length)
    t_rec, r_rec = time.process_time() - t, rss_mb()
    sd = Path(tempfile.mkdtemp(dir=args.scratch))
    try:
        t = time.process_time()
        slots = mod.assign_packs(seq, rec, cfg, out=sd / "slots.npy")
        r_asg = rss_mb()
        mod.row_places(slots, len(seq), mod.pack_files(len(slots), cfg))
        t_plan, peak = time.process_time() - t, rss_mb()
    finally:
        shutil.rmtree(sd, ignore_errors=True)
    n = len(seq)
    del pred
    print(f"x{args.scale}: {n:,} sequences, {len(slots):,} packs; RSS before {base:.0f} MB, after the recipe's "
          f"figures {r_rec:.0f} MB ({t_rec:.1f} CPU-s), after assign_packs {r_asg:.0f} MB, peak {peak:.0f} MB "
          f"({(peak - base) * 2**20 / n:.1f} bytes a sequence above the RSS before; plan {t_plan:.1f} CPU-s)")


if __name__ == "__main__":
    main()
