"""End-to-end training throughput: batches padded to their length bin vs the same rows padded to 512.

Runs `bertpipe train` twice on the same rows (the golden 4-bin sample's 128 bin): once as a bin folder
(batches sliced to 128 columns) and once as plain padded files (512 columns), and prints
training_sequences_per_second of each, their ratio and the peak RSS of a rank.

    .venv/bin/python bench/bench_train_bins.py [--steps 25] [--nproc 2] [--model tiny] [--micro-batch 8]

Measured on the shared, loaded 2-core CPU box (tiny model, 2 ranks, micro 8, 25 steps): 82.9 vs 26.7 seq/s
(3.1x) and 108.0 vs 19.8 seq/s (5.4x) in two runs; peak RSS of a rank ~0.9 GB.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def run(train_dir: Path, out: Path, args: argparse.Namespace) -> dict:
    from pretrain.launch import launch
    from pretrain.train_config import TrainConfig

    cfg = TrainConfig(train_dir=str(train_dir), output_dir=str(out), model=args.model, max_steps=args.steps,
                      micro_batch=args.micro_batch, device=args.device, tensorboard=False, checkpoint_interval=0)
    if launch(cfg, nproc=args.nproc) != 0:
        raise SystemExit(f"training on {train_dir} failed")
    return json.loads((out / "summary.json").read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bins", type=Path, default=ROOT.parent / "shared/data/golden/4bins")
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--model", default="tiny")
    p.add_argument("--micro-batch", type=int, default=8)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "plain"  # same files, but not under a bin folder: batches keep all 512 columns
        plain.mkdir()
        for f in sorted((args.bins / "128").glob("part_*.hdf5")):
            (plain / f.name).symlink_to(f.resolve())
        binned = run(args.bins / "128", Path(tmp) / "out_binned", args)
        padded = run(plain, Path(tmp) / "out_padded", args)
    b, q = binned["training_sequences_per_second"], padded["training_sequences_per_second"]
    rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"binned (128 columns): {b:.1f} seq/s   padded (512 columns): {q:.1f} seq/s   ratio {b / q:.2f}x")
    print(f"peak RSS of one rank: {rss_mb:.0f} MB; {args.nproc} ranks, model {args.model}, micro {args.micro_batch}")


if __name__ == "__main__":
    main()
