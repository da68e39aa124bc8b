"""End-to-end training throughput of the batch mixes (pretrain/batch_mix.py) against rows padded to 512.

Runs `bertpipe train` on the same 4-bin data (the golden sample by default) with each micro-batch

* padded: the bins' files as one plain folder, every batch padded to 512 columns (the baseline);
* one-bin: from one length bin, padded to its bound (bertpipe's fastest);
* random: rows of any length (NVIDIA's / MLCommons' / Habana's sampling), one forward per bin;
* split: --split-batch-cnt 6 3 2 5 (Samsung's), one forward per bin;

and prints training_sequences_per_second, real tokens/s, the ratio to the padded run and the peak RSS of a
rank. The micro-batch is 16 (Samsung's 6+3+2+5) for every run.

    .venv/bin/python bench/bench_train_bins.py [--steps 25] [--nproc 2] [--model tiny] [--mixes one-bin,random]

Figures: docs/benchmarks.md ("Batch mixes").
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

MIXES = ("padded", "one-bin", "random", "split")


def run(train_dir: Path, out: Path, args: argparse.Namespace, mix: str) -> dict:
    from pretrain.launch import launch
    from pretrain.train_config import TrainConfig

    extra = {"split_batch_cnt": "6 3 2 5"} if mix == "split" else {"batch_mix": "one-bin" if mix == "padded" else mix,
                                                                  "micro_batch": 16}
    cfg = TrainConfig(train_dir=str(train_dir), output_dir=str(out), model=args.model, max_steps=args.steps,
                      device=args.device, tensorboard=False, checkpoint_interval=0, **extra)
    if launch(cfg, nproc=args.nproc) != 0:
        raise SystemExit(f"training on {train_dir} ({mix}) failed")
    return json.loads((out / "summary.json").read_text())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bins", type=Path, default=ROOT.parent / "shared/data/golden/4bins")
    p.add_argument("--steps", type=int, default=25)
    p.add_argument("--nproc", type=int, default=2)
    p.add_argument("--model", default="tiny")
    p.add_argument("--device", default="cpu")
    p.add_argument("--mixes", default=",".join(MIXES), help=f"comma-separated, of {', '.join(MIXES)}")
    args = p.parse_args()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "plain"  # the same files, not under bin folders: every batch keeps all 512 columns
        plain.mkdir()
        for b in ("128", "256", "384", "512"):
            for f in sorted((args.bins / b).glob("part_*.hdf5")):
                (plain / f"{b}_{f.name}").symlink_to(f.resolve())
        for mix in args.mixes.split(","):
            data = plain if mix == "padded" else args.bins
            s = run(data, Path(tmp) / f"out_{mix}", args, mix)
            results[mix] = (s["training_sequences_per_second"], s["training_real_tokens_per_second"])
            print(f"{mix}: {results[mix][0]:.1f} seq/s, {results[mix][1]:.0f} real tokens/s", flush=True)
    base = results.get("padded", (None, None))[0]
    for mix, (seq, tok) in results.items():
        ratio = f"   {seq / base:.2f}x padded" if base else ""
        print(f"{mix:8s} {seq:8.1f} seq/s {tok:10.0f} real tokens/s{ratio}")
    rss_mb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"peak RSS of one rank: {rss_mb:.0f} MB; {args.nproc} ranks, model {args.model}, micro-batch 16, "
          f"{args.steps} steps")


if __name__ == "__main__":
    main()
