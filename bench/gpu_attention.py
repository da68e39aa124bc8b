"""Packed attention alone on a GPU: each varlen kernel's forward + backward on one training batch of packs.

BERT-Large's attention shape (16 heads of 64, bf16) on 64 packs of 512 columns built from rows of the full MLPerf
set's lengths (as ``bench_train_packed.py --gpu --lengths mlperf``), cu_seqlens as the model builds them (each
sequence and each pack's padding a run; the static layout pads with zero-length runs). Per kernel and attention
dropout: milliseconds for forward + backward (CUDA events, median of ``--iters``), the TFLOP/s of the real
attention FLOPs (4 x sum(len^2) x hidden forward, x 3.5 with flash's recomputing backward), and without dropout
the largest relative difference of its output and input gradients from ``aten_flash_varlen``'s. A full-row
baseline runs SDPA over the 64 rows of 512 (what padded rows cost). A kernel that fails is reported, not fatal.

    python bench/gpu_attention.py [--iters 20] [--json-out out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def batch_layout(n_rows: int, packs: int, seed: int = 0):  # noqa: ANN201
    """(static cu_seqlens, compact cu_seqlens, sum of real len^2, real tokens) of one batch of packs."""
    import numpy as np

    from bench.bench_train_packed import gpu_batches, mlperf_lengths, synthetic_rows

    rows = synthetic_rows(mlperf_lengths(n_rows, seed), seed)
    arrays, idx = gpu_batches(rows, "packed", packs * 512, 1, seed)[0]
    ids = arrays["input_mask"].reshape(-1)
    start = np.ones_like(ids, dtype=bool)
    start[1:] = ids[1:] != ids[:-1]
    start[::512] = True
    starts = np.flatnonzero(start)
    compact = np.append(starts, ids.size)
    slots = packs * (arrays["next_sentence_positions"].shape[1] + 1)
    static = np.full(slots + 1, ids.size)
    static[:len(starts)] = starts
    lens = np.diff(compact)[ids[compact[:-1]] != 0]
    return static, compact, int((lens.astype(np.int64) ** 2).sum()), int(lens.sum())


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iters", type=int, default=20, help="timed calls per kernel (median)")
    p.add_argument("--packs", type=int, default=64, help="packs of 512 columns in the batch")
    p.add_argument("--kernels", default="aten_flash_varlen,torch_varlen,nested_varlen",
                   help="comma-separated names of pretrain.model.PACKED_KERNELS")
    p.add_argument("--json-out", type=Path, help="also write the results here")
    args = p.parse_args()

    import torch
    import torch.nn.functional as F

    from pretrain import model as M

    if not torch.cuda.is_available():
        sys.exit("no CUDA device visible: this bench times CUDA kernels")
    dev = torch.device("cuda")
    heads, hd = 16, 64
    static, compact, sum_sq, real = batch_layout(4000, args.packs)
    t = int(compact[-1])
    fwd_flops = 4.0 * sum_sq * heads * hd
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}; "
          f"{args.packs} packs: {t} tokens, {real} real, {len(compact) - 1} runs; real attention "
          f"{fwd_flops / 1e12:.3f} TFLOP forward", flush=True)
    g = torch.Generator(device=dev).manual_seed(0)
    q, k, v = (torch.randn(t, heads, hd, device=dev, dtype=torch.bfloat16, generator=g) for _ in range(3))
    grad = torch.randn(t, heads, hd, device=dev, dtype=torch.bfloat16, generator=g)
    layouts = {"static": torch.tensor(static, dtype=torch.int32, device=dev),
               "compact": torch.tensor(compact, dtype=torch.int32, device=dev)}

    def run(fn, cu, dropout):  # noqa: ANN001, ANN202
        a, b, c = (x.detach().requires_grad_() for x in (q, k, v))
        out = fn(a, b, c, cu, 512, dropout)
        out.backward(grad)
        return out.detach(), a.grad, b.grad, c.grad

    def timed(fn) -> float:  # noqa: ANN001
        for _ in range(3):
            fn()
        times = []
        for _ in range(args.iters):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e))
        return sorted(times)[len(times) // 2]

    results = []
    ref = run(M.aten_flash_varlen, layouts["static"], 0.0)
    for name in args.kernels.split(","):
        fn = M.PACKED_KERNELS[name]
        for layout, cu in layouts.items():
            for dropout in (0.1, 0.0):
                r = {"kernel": name, "layout": layout, "dropout": dropout}
                try:
                    if dropout == 0.0:
                        got = run(fn, cu, 0.0)
                        r["max_rel_diff"] = max(float((a.float() - b.float()).abs().max() / b.float().abs().max())
                                                for a, b in zip(got, ref, strict=True))
                    ms = timed(lambda fn=fn, cu=cu, dropout=dropout: run(fn, cu, dropout))
                    r.update(ms=ms, tflops=3.5 * fwd_flops / (ms * 1e-3) / 1e12)
                    print(f"{name:18s} {layout:8s} dropout {dropout:3g}: {ms:7.2f} ms fwd+bwd  "
                          f"{r['tflops']:6.1f} TFLOP/s real" + (f"  max rel diff {r['max_rel_diff']:.2e}"
                                                               if "max_rel_diff" in r else ""), flush=True)
                except Exception as exc:  # report, go on
                    r["error"] = f"{type(exc).__name__}: {str(exc)[:400]}"
                    print(f"{name:18s} {layout:8s} dropout {dropout:3g}: FAILED {r['error']}", flush=True)
                results.append(r)
    full = [x.detach().view(args.packs, 512, heads, hd).transpose(1, 2) for x in (q, k, v)]
    for dropout in (0.1, 0.0):
        def full_row(dropout=dropout) -> None:
            a, b, c = (x.detach().requires_grad_() for x in full)
            F.scaled_dot_product_attention(a, b, c, dropout_p=dropout).backward(grad.view_as(a))
        ms = timed(full_row)
        results.append({"kernel": "full-row SDPA (padded rows)", "dropout": dropout, "ms": ms})
        print(f"full-row SDPA, {args.packs} rows of 512, dropout {dropout:g}: {ms:7.2f} ms fwd+bwd", flush=True)
    if args.json_out:
        args.json_out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                                             "tokens": t, "real": real, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
