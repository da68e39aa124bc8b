"""GPU training throughput and MFU of our BERT (default BERT-Large, bf16) at seq 128 and 512.

Plain PyTorch on one CUDA device (no DeepSpeed): forward + backward + fused AdamW step on synthetic batches
shaped like MLPerf's (seq 128 with 20 prediction slots, seq 512 with 76). Warm-up steps (and torch.compile's
compilation) are excluded; every timed interval is bracketed by torch.cuda.synchronize().

    python bench/gpu_bench.py                                   # BERT-Large, bf16, seq 128 and 512, H100 peak
    python bench/gpu_bench.py --compile                         # torch.compile the model first
    python bench/gpu_bench.py --peak-tflops 1979 --seq 512 --batch-size 64   # e.g. another device's peak
    python bench/gpu_bench.py --model tiny --device cpu --steps 2 --warmup 1  # smoke test without a GPU

MFU = achieved model FLOP/s / peak dense bf16 FLOP/s (--peak-tflops; by default looked up from the device
name: H100 SXM / H200 989, H100 PCIe 756, A100 312, ...; 989 when unknown).
Model FLOPs per trained sequence (2 FLOPs per multiply-add; backward = 2 x forward, so training = 3 x):
    forward = L * (S * (8 H^2 + 4 H I) + 4 S^2 H)      QKV 6H^2 + attention output 2H^2 + FFN 4HI per token,
                                                       QK^T and PV 2 S^2 H each per layer
            + P * (2 H^2 + 2 H V)                      MLM transform + tied decoder on the P predicted slots
            + 2 H^2 + 4 H                              pooler + NSP
with L layers, H hidden, I intermediate, S padded sequence length (rows here are full length, so padded =
real tokens), V the padded vocab (30528), P the prediction slots the head runs on (all 20/76 here: the model
is built with static_mlm=True unless --dynamic-mlm). Embedding lookups, LayerNorm, softmax, GELU, dropout and
the optimizer are not counted (the usual convention: they are memory-bound and small in FLOPs).
BERT-Large: 240.6 GFLOP per trained sequence at seq 128 (P 20), 1019.8 at seq 512 (P 76); so 45 % MFU on an
H100 (989) means ~1850 seq/s at 128 and ~436 seq/s at 512. The formula is checked against torch's
FlopCounterMode in tests/pretrain/test_model.py.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

# dense bf16 peak TFLOP/s by device name (vendor datasheets, without sparsity); --peak-tflops overrides
PEAK_BF16_TFLOPS = (("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("H200", 989.0), ("H800", 989.0),
                    ("GH200", 989.0), ("B200", 2250.0), ("A100", 312.0), ("A10G", 70.0), ("L40S", 362.0), ("L4", 121.0))
DEFAULT_BATCH = {128: 128, 256: 64, 384: 48, 512: 32}  # per-device micro-batches that fit BERT-Large on 80 GB
PREDICTIONS = {128: 20, 256: 40, 384: 58, 512: 76}  # MLPerf max_predictions_per_seq (phase 1: 20, phase 2: 76)


def flops_per_sequence(cfg, seq: int, slots: int) -> float:
    """Training FLOPs of one sequence (3 x forward), per the formula in the module docstring."""
    h, i, n, v = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers, cfg.padded_vocab_size
    forward = n * (seq * (8 * h * h + 4 * h * i) + 4 * seq * seq * h) + slots * (2 * h * h + 2 * h * v)
    forward += 2 * h * h + 4 * h
    return 3.0 * forward


def make_batches(cfg, batch: int, seq: int, n: int, device, seed: int = 0) -> list[dict]:
    """n different full-length batches, already on the device (so no host->device copy is timed)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    p = PREDICTIONS.get(seq, max(1, round(seq * 0.15)))
    out = []
    for _ in range(n):
        pos = torch.stack([torch.randperm(seq - 2, generator=g)[:p].sort().values + 1 for _ in range(batch)])
        seg = torch.zeros(batch, seq, dtype=torch.long)
        seg[:, seq // 2:] = 1
        b = {"input_ids": torch.randint(1000, cfg.vocab_size, (batch, seq), generator=g),
             "segment_ids": seg, "input_mask": torch.ones(batch, seq, dtype=torch.long),
             "masked_lm_positions": pos, "masked_lm_ids": torch.randint(1000, cfg.vocab_size, (batch, p), generator=g),
             "next_sentence_labels": torch.randint(0, 2, (batch,), generator=g)}
        out.append({k: v.to(device, non_blocking=True) for k, v in b.items()})
    return out


def bench_one(args: argparse.Namespace, seq: int) -> dict:
    import torch

    from pretrain.config import model_config
    from pretrain.model import BertForPreTraining

    device = torch.device(args.device)
    cfg = model_config(args.model)
    torch.manual_seed(0)
    model = BertForPreTraining(cfg, static_mlm=not args.dynamic_mlm).to(device)
    if args.precision == "bf16":
        model = model.to(torch.bfloat16)  # as DeepSpeed bf16: bf16 weights and activations
    model.train()
    fused = device.type == "cuda"
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=fused)
    step_model = torch.compile(model) if args.compile else model
    batch = args.batch_size or DEFAULT_BATCH.get(seq, 32)
    batches = make_batches(cfg, batch, seq, 4, device)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.precision == "autocast")
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)

    def step(i: int) -> torch.Tensor:
        with autocast:
            loss = step_model(**batches[i % len(batches)]).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    for i in range(args.warmup):
        step(i)
    sync()
    start = time.perf_counter()
    for i in range(args.steps):
        loss = step(i)
    sync()
    elapsed = time.perf_counter() - start
    if not torch.isfinite(loss):
        raise RuntimeError(f"non-finite loss {loss.detach().item()} at seq {seq}")
    seq_per_s = batch * args.steps / elapsed
    flops = flops_per_sequence(cfg, seq, batches[0]["masked_lm_positions"].shape[1])
    achieved = seq_per_s * flops
    mem = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan")
    return {"seq": seq, "batch": batch, "steps": args.steps, "step_ms": 1e3 * elapsed / args.steps,
            "seq_per_s": seq_per_s, "tflops": achieved / 1e12, "mfu": achieved / (args.peak_tflops * 1e12),
            "gflop_per_seq": flops / 1e9, "peak_mem_gib": mem, "loss": loss.detach().item()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="large", help="preset: tiny, large, 1.5b, 5b")
    p.add_argument("--seq", default="128,512", help="comma-separated sequence lengths")
    p.add_argument("--batch-size", type=int, default=0, help="per step; 0 = 128 at seq 128, 32 at seq 512")
    p.add_argument("--steps", type=int, default=20, help="timed steps")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first (compilation, allocator, cuBLAS)")
    p.add_argument("--precision", choices=("bf16", "autocast", "fp32"), default="bf16",
                   help="bf16: bf16 weights (DeepSpeed bf16); autocast: fp32 weights + bf16 autocast")
    p.add_argument("--compile", action="store_true", help="torch.compile the model")
    p.add_argument("--dynamic-mlm", action="store_true", help="MLM head on valid slots only (one host sync)")
    p.add_argument("--peak-tflops", type=float, default=0.0,
                   help="device peak dense bf16 TFLOP/s; 0 = from the device name (H100 SXM 989), else 989")
    p.add_argument("--device", default="cuda")
    p.add_argument("--json-out", help="also write the results here")
    args = p.parse_args()

    import torch

    if args.device.startswith("cuda"):
        if not torch.cuda.is_available():
            sys.exit("no CUDA device visible (use --device cpu for a smoke test)")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
        name = torch.cuda.get_device_name()
    else:
        name = args.device
    if not args.peak_tflops:
        args.peak_tflops = next((v for k, v in PEAK_BF16_TFLOPS if k in name), 989.0)
    print(f"device {name}, torch {torch.__version__}, model {args.model}, precision {args.precision}, "
          f"compile {args.compile}, MLM head {'dynamic' if args.dynamic_mlm else 'static'}, "
          f"peak {args.peak_tflops:g} TFLOP/s", flush=True)
    results = []
    for seq in (int(s) for s in args.seq.split(",")):
        try:
            r = bench_one(args, seq)
        except torch.cuda.OutOfMemoryError:
            print(f"seq {seq}: out of GPU memory; retry with a smaller --batch-size", flush=True)
            torch.cuda.empty_cache()
            continue
        results.append(r)
        print(f"seq {r['seq']:4d} batch {r['batch']:4d}: {r['seq_per_s']:9.1f} seq/s  {r['step_ms']:8.1f} ms/step  "
              f"{r['tflops']:7.1f} TFLOP/s  MFU {100 * r['mfu']:5.1f}%  peak mem {r['peak_mem_gib']:.1f} GiB  "
              f"loss {r['loss']:.3f}", flush=True)
        if args.device.startswith("cuda"):
            torch.cuda.empty_cache()
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"device": name, "args": vars(args), "results": results},
                                                  indent=2) + "\n")


if __name__ == "__main__":
    main()
