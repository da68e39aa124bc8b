"""Training-step throughput of our BertForPreTraining against transformers' BertForPreTraining on this CPU.

A step is forward + backward + AdamW step + zero_grad, on identical weights (ours copied into transformers via
pretrain.hf_export) and identical rows. Modes:
  seq128   rows of the 1-128 bin, both models padded to 128
  seq512   rows of the 385-512 bin, both models padded to 512
  binned   batches drawn one length bin at a time, in the data's bin proportions: ours padded to the bin
           bound (128/256/384/512), transformers padded to 512 -- the realistic comparison (target >= 1.3x)
Each mode runs in a subprocess holding both models, whose steps are interleaved so that load from other
processes hits both alike; the ratio is the median over --repeats runs, seq/s the best run. Peak RSS is
measured per model in a separate subprocess running that model alone (2 steps).

Default model: 4 layers, hidden 256, 4 heads, intermediate 1024, vocab 30522 (BERT-Large's vocab and head,
a small encoder that steps in seconds on 2 cores). Rows come from ../shared/data/golden/sample.hdf5 when
present (seq 512, 76 predictions; 12% / 10% / 5% / 73% of the rows in the 128/256/384/512 bins), else are
synthetic with the same proportions.

Measured on the project's shared 2-core CPU (load ~5, 1 thread, --repeats 3 --steps 3; ratio = median):
    seq128  batch 8: ours 12.6 seq/s (RSS  788 MB) | transformers 4.57 seq/s (RSS 1100 MB) | 2.84x
    seq512  batch 4: ours 2.20 seq/s (RSS 1020 MB) | transformers 0.86 seq/s (RSS 1700 MB) | 2.35x
    binned  batch 8: ours 3.29 seq/s (RSS 1531 MB) | transformers 1.31 seq/s (RSS 2834 MB) | 2.52x
The gain is mostly the MLM head on ~15% of the tokens instead of all (at hidden 256 the 30k decoder over
every token costs more than the encoder), plus padding only to the bin bound.

    .venv/bin/python bench/bench_model.py                       # all modes, ~9 min on the shared 2 cores
    .venv/bin/python bench/bench_model.py --modes binned --repeats 1 --steps 3
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from core.schema import BIN_BOUNDS  # noqa: E402  (after the path set-up)

DEFAULT_HDF5 = ROOT.parent / "shared" / "data" / "golden" / "sample.hdf5"


def load_rows(path: Path, n_synthetic: int = 2000) -> dict[str, np.ndarray]:
    """HDF5 rows in the padded (N, 512) form, or synthetic rows with the golden sample's bin proportions."""
    if path.is_file():
        import h5py

        with h5py.File(path, "r") as f:
            return {k: f[k][:] for k in f}
    rng = np.random.default_rng(0)
    lengths = np.concatenate([rng.integers(lo + 1, hi + 1, int(n_synthetic * p)) for lo, hi, p in
                              ((0, 128, .12), (128, 256, .10), (256, 384, .05), (384, 512, .73))])
    n = len(lengths)
    rows = {"input_ids": np.zeros((n, 512), np.int32), "input_mask": np.zeros((n, 512), np.int8),
            "segment_ids": np.zeros((n, 512), np.int8), "masked_lm_positions": np.zeros((n, 76), np.int32),
            "masked_lm_ids": np.zeros((n, 76), np.int32), "next_sentence_labels": rng.integers(0, 2, n, np.int8)}
    for r, length in enumerate(lengths):
        rows["input_ids"][r, :length] = rng.integers(1000, 30522, length)
        rows["input_mask"][r, :length] = 1
        k = min(76, max(1, round(length * 0.15)))
        rows["masked_lm_positions"][r, :k] = np.sort(rng.choice(np.arange(1, length - 1), k, replace=False))
        rows["masked_lm_ids"][r, :k] = rng.integers(1000, 30522, k)
    return rows


def make_batches(rows: dict[str, np.ndarray], mode: str, batch_size: int, n: int) -> list[tuple[int, np.ndarray]]:
    """(bin bound, row indices) for n batches; the same list for both models (fixed seed)."""
    rng = np.random.default_rng(1234)
    lengths = rows["input_mask"].sum(axis=1, dtype=np.int64)
    by_bin = {b: np.flatnonzero((lengths > b - 128) & (lengths <= b)) for b in BIN_BOUNDS}
    if mode == "binned":
        sizes = np.array([len(by_bin[b]) for b in BIN_BOUNDS], dtype=float)
        bounds = rng.choice(BIN_BOUNDS, size=n, p=sizes / sizes.sum())
    else:
        bounds = np.full(n, 128 if mode == "seq128" else 512)
    return [(int(b), rng.choice(by_bin[int(b)], batch_size, replace=False)) for b in bounds]


def to_tensors(rows: dict[str, np.ndarray], idx: np.ndarray, seq: int) -> dict:
    import torch

    t = {k: torch.from_numpy(rows[k][np.sort(idx)]) for k in rows}
    for k in ("input_ids", "input_mask", "segment_ids"):
        t[k] = t[k][:, :seq].long().contiguous()
    return t


def hf_inputs(t: dict) -> dict:
    """transformers' inputs: labels [B, S] with -100 except at the valid masked positions."""
    import torch

    pos, ids = t["masked_lm_positions"].long(), t["masked_lm_ids"].long()
    valid = (pos != 0).int().cumprod(1).bool()
    labels = torch.full_like(t["input_ids"], -100)
    labels.scatter_(1, torch.where(valid, pos, 0), torch.where(valid, ids, -100))
    labels[:, 0] = -100
    return {"input_ids": t["input_ids"], "attention_mask": t["input_mask"], "token_type_ids": t["segment_ids"],
            "labels": labels, "next_sentence_label": t["next_sentence_labels"].long()}


def build_models(args: argparse.Namespace, which: list[str]) -> dict:
    """{"ours": model, "hf": model} with identical weights (ours copied into transformers)."""
    import torch

    from pretrain.config import model_config
    from pretrain.model import BertForPreTraining

    torch.manual_seed(0)
    cfg = model_config("large", num_hidden_layers=args.layers, hidden_size=args.hidden,
                       num_attention_heads=args.heads, intermediate_size=args.intermediate)
    ours = BertForPreTraining(cfg)
    models = {}
    if "hf" in which:
        import transformers

        from pretrain.hf_export import hf_config, to_hf_state_dict

        hf = transformers.BertForPreTraining(hf_config(cfg))  # transformers 5 defaults to SDPA attention
        hf.load_state_dict(to_hf_state_dict(ours.state_dict(), cfg))
        models["hf"] = hf
    if "ours" in which:
        models["ours"] = ours
    return models


def worker(args: argparse.Namespace) -> dict:
    """Time training steps of the models in args.worker ("ours", "hf" or "both", steps interleaved)."""
    import torch

    torch.set_num_threads(args.threads)
    which = ["ours", "hf"] if args.worker == "both" else [args.worker]
    models = build_models(args, which)
    opts = {k: torch.optim.AdamW(m.train().parameters(), lr=1e-4, weight_decay=0.01, foreach=True)
            for k, m in models.items()}
    rows = load_rows(Path(args.hdf5))
    bs = args.batch_size_512 if args.mode == "seq512" else args.batch_size
    hf_seq = 128 if args.mode == "seq128" else 512
    inputs = []
    for bound, idx in make_batches(rows, args.mode, bs, args.warmup + args.steps):
        inputs.append({"ours": to_tensors(rows, idx, bound), "hf": hf_inputs(to_tensors(rows, idx, hf_seq))})
    elapsed = dict.fromkeys(models, 0.0)
    for i, batch in enumerate(inputs):
        for name, model in models.items():  # interleaved: load from other processes hits both alike
            t0 = time.perf_counter()
            model(**batch[name]).loss.backward()
            opts[name].step()
            opts[name].zero_grad(set_to_none=True)
            if i >= args.warmup:
                elapsed[name] += time.perf_counter() - t0
    res = {"mode": args.mode, "batch_size": bs, "steps": args.steps,
           "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
           "attention": models["hf"].config._attn_implementation if "hf" in models else "sdpa"}
    for name, t in elapsed.items():
        res[name] = {"seq_per_s": bs * args.steps / t, "step_s": t / args.steps,
                     "params": sum(p.numel() for p in models[name].parameters())}
    return res


def run_worker(args: argparse.Namespace, which: str, mode: str, steps: int, warmup: int) -> dict:
    cmd = [sys.executable, __file__, "--worker", which, "--mode", mode, "--steps", str(steps),
           "--warmup", str(warmup)]
    for k in ("layers", "hidden", "heads", "intermediate", "batch_size", "batch_size_512", "threads", "hdf5"):
        cmd += [f"--{k.replace('_', '-')}", str(getattr(args, k))]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode:
        sys.exit(f"worker {which}/{mode} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default="seq128,seq512,binned")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=1024)
    p.add_argument("--batch-size", type=int, default=8, help="rows per step (seq128 and binned)")
    p.add_argument("--batch-size-512", type=int, default=4, help="rows per step in seq512 mode")
    p.add_argument("--steps", type=int, default=4, help="timed steps per run")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--repeats", type=int, default=2, help="runs per (model, mode); the best is kept")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads per process; 1 avoids OpenMP barrier stalls on a shared, loaded machine")
    p.add_argument("--hdf5", default=str(DEFAULT_HDF5))
    p.add_argument("--json-out", help="also write the results here")
    p.add_argument("--worker", choices=("ours", "hf", "both"), help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    print(f"model: {args.layers} layers, hidden {args.hidden}, {args.heads} heads, intermediate {args.intermediate}, "
          f"vocab 30522; fp32, {args.threads} threads, AdamW; data: "
          f"{args.hdf5 if Path(args.hdf5).is_file() else 'synthetic'}")
    results = []
    for mode in args.modes.split(","):
        timing = [run_worker(args, "both", mode, args.steps, args.warmup) for _ in range(args.repeats)]
        best = {k: max((t[k] for t in timing), key=lambda r: r["seq_per_s"]) for k in ("ours", "hf")}
        ratios = [t["ours"]["seq_per_s"] / t["hf"]["seq_per_s"] for t in timing]
        rss = {k: run_worker(args, k, mode, 1, 1)["peak_rss_mb"] for k in ("ours", "hf")}  # alone, 2 steps
        results.append({"mode": mode, "batch_size": timing[0]["batch_size"], "best": best, "ratios": ratios,
                        "peak_rss_mb": rss})
        print(f"{mode:7s} batch {timing[0]['batch_size']}: ours {best['ours']['seq_per_s']:6.2f} seq/s "
              f"(peak RSS {rss['ours']:.0f} MB) | transformers {best['hf']['seq_per_s']:6.2f} seq/s "
              f"(peak RSS {rss['hf']:.0f} MB, {timing[0]['attention']}) | ratio "
              f"{sorted(ratios)[len(ratios) // 2]:.2f}x (per run: {', '.join(f'{r:.2f}' for r in ratios)})",
              flush=True)
    print(f"bench peak RSS (this process): {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
