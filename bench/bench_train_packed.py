"""Packed vs binned vs padded training, counted in REAL tokens (padding excluded), on the same sequences.

CPU (default): `bertpipe train` (DeepSpeed, ZeRO-1, bf16) on N ranks, three times on the same rows (the golden
``sample.hdf5``, 12,606 real sequences): padded (one 512-column file), binned (the golden 4 bins: batches padded
to their bin's bound) and packed (those rows packed up to 3 a row by ``pretrain.packing.best_fit_packs``,
written in Habana's layout, trained with ``--packed``). Each run is its own process, the modes interleaved
for ``--rounds`` rounds; printed: real tokens/s
and real sequences/s (summary.json's ``training_real_*_per_second``, all ranks), peak RSS of one rank, and the
ratios against padded measured in the same invocation. ``--micro-batch`` counts rows, packs in the packed run.

    .venv/bin/python bench/bench_train_packed.py [--steps 12] [--rounds 2] [--nproc 2] [--micro-batch 8]

GPU (``--gpu``): one process, plain PyTorch, no DeepSpeed (as bench/gpu_bench.py): BERT-Large in bf16, fused
AdamW, static MLM/NSP shapes (``--dynamic-mlm``, ``--compile`` as gpu_bench), the same rows as padded (512 columns), binned (bin bound columns) and packed (512-token packs) batches of
about ``--batch-tokens`` columns x rows each (32 x 512 by default), already on the device; warm-up steps
excluded, timed intervals bracketed by ``torch.cuda.synchronize()``. Printed per mode: real tokens/s, and
**MFU on real tokens**: the model FLOPs of each real sequence at its own length
(``gpu_bench.flops_per_sequence(cfg, length, its masked tokens)``: no FLOPs for padding, attention within
the sequence only) per second over the device's dense bf16 peak; also the MFU of the FLOPs the step executes
(padded widths, full-row attention, all prediction slots). Runs (``--runs``, ``mode[:kernel][:ad0][:compile]``):
padded and packed with the model's attention dropout (packed "auto": aten_flash_varlen, PyTorch's flash varlen
kernel with dropout; then the block-diagonal SDPA mask), without it (``ad0``; packed: PyTorch's varlen_attn,
``torch_varlen``), then torch.compile'd (``autotune``: Inductor's GEMM autotuning; ``graphs``: CUDA graphs), the
compiled runs profiled (``:profile``: bench/gpu_profile.py, the step's kernels by kind); a failing run is reported
and the next one runs; ``--budget-s`` starts no run past that many seconds. Goal: >= 50 % real-token MFU on an
H100/H200 (NVIDIA's MLPerf BERT: ~49 %).

    bash bench/gpu_run.sh                                          # a lent GPU: CUDA tests + this bench, ~5 min
    python bench/bench_train_packed.py --gpu --lengths mlperf      # H100/H200: BERT-Large bf16
    python bench/bench_train_packed.py --gpu --dry                 # the same code on CPU: tiny model, 2 steps

``--lengths mlperf``: synthetic rows with the full MLPerf set's mean length (~254 tokens; ``mlperf_lengths``)
instead of the golden rows (mean 412). CPU: ``--model-json`` overrides the preset (e.g. 4 layers x 256 hidden,
a step bound by its math), ``--modes packed@sdpa_mask`` trains packed rows with another kernel
(``BERTPIPE_PACKED_ATTENTION``).

Rows: ``--rows`` (default ../shared/data/golden/sample.hdf5), else synthetic rows with its length proportions.
The golden sample is long (mean 412 of 512 tokens: padded rows are 80.5 % real tokens, binned 95.0 %, these
packs 98.8 %), so packing gains less here than on MLPerf's full set (mean ~254 tokens, where NVIDIA's packing
halves the rows).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
DEFAULT_ROWS = ROOT.parent / "shared" / "data" / "golden" / "sample.hdf5"
DEFAULT_BINS = ROOT.parent / "shared" / "data" / "golden" / "4bins"
MODES = ("padded", "binned", "packed")


def load_rows(path: Path) -> dict[str, np.ndarray]:
    from bench.bench_model import load_rows as rows_or_synthetic

    return rows_or_synthetic(path)


def mlperf_lengths(n: int, seed: int = 0) -> np.ndarray:
    """n sequence lengths shaped like MLPerf's full training set (mean ~254 of 512; NVIDIA's packing of the
    full set reports an expected speed-up of 1.999 at <= 3 a pack): 20 % full 512-token rows, the rest
    20 + Gamma(3, 55) tokens (mode ~130), cut at 511. Synthetic: the full set's histogram is not in this repo.
    best_fit_packs (<= 3 a pack) fills its packs to ~94 % real tokens (1.87 rows a pack), the 4 bins ~84 %,
    padded rows ~50 %."""
    rng = np.random.default_rng(seed)
    full = rng.random(n) < 0.20
    short = np.minimum(20 + rng.gamma(3.0, 55.0, n), 511).astype(np.int64)
    return np.where(full, 512, short)


def synthetic_rows(lengths: np.ndarray, seed: int = 0) -> dict[str, np.ndarray]:
    """Padded rows (512 columns, 76 prediction slots, 15 % masked) of the given lengths, random tokens."""
    rng = np.random.default_rng(seed)
    n = len(lengths)
    cols = np.arange(512)
    rows = {"input_ids": rng.integers(1000, 30522, (n, 512), dtype=np.int32),
            "input_mask": (cols[None] < lengths[:, None]).astype(np.int8),
            "segment_ids": ((cols[None] >= lengths[:, None] // 2) & (cols[None] < lengths[:, None])).astype(np.int8),
            "masked_lm_positions": np.zeros((n, 76), np.int32),
            "masked_lm_ids": rng.integers(1000, 30522, (n, 76), dtype=np.int32),
            "next_sentence_labels": rng.integers(0, 2, n, dtype=np.int8)}
    rows["input_ids"][:, 0] = 101
    rows["input_ids"] *= rows["input_mask"]
    for r, length in enumerate(lengths):
        k = min(76, max(1, round(int(length) * 0.15)))
        rows["masked_lm_positions"][r, :k] = np.sort(rng.choice(np.arange(1, length - 1), k, replace=False))
    slots = np.arange(76)[None] < np.minimum(76, np.maximum(1, np.round(lengths * 0.15)))[:, None]
    rows["masked_lm_ids"] *= slots
    return rows


def bench_rows(args: argparse.Namespace) -> dict[str, np.ndarray]:
    """--lengths mlperf: synthetic rows of the full set's lengths (--n-rows of them); golden: --rows."""
    if args.lengths == "mlperf":
        return synthetic_rows(mlperf_lengths(args.n_rows))
    return load_rows(args.rows)


# --- CPU: real 2-rank training runs --------------------------------------------------------------------------


def prepare_cpu_data(args: argparse.Namespace, tmp: Path) -> dict[str, Path]:
    """The three train dirs, same sequences: padded file, 4 bins, Habana packs."""
    from core.schema import BIN_BOUNDS
    from pretrain.packing import best_fit_packs, pack_rows, sequence_lengths, write_habana

    rows = bench_rows(args)
    padded = tmp / "padded"
    padded.mkdir()
    if args.lengths == "golden":
        (padded / "sample.hdf5").symlink_to(args.rows.resolve())
    else:  # the same rows as one padded file and as 4 bins (one part each)
        import h5py

        def write(path: Path, arrays: dict[str, np.ndarray]) -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            with h5py.File(path, "w") as f:
                for k, v in arrays.items():
                    f.create_dataset(k, data=v)

        write(padded / "rows.hdf5", rows)
        lengths = sequence_lengths(rows)
        for bound in BIN_BOUNDS:
            sel = np.flatnonzero((lengths > bound - 128) & (lengths <= bound))
            write(tmp / "bins" / str(bound) / "part_0_of_1.hdf5", {k: v[sel] for k, v in rows.items()})
        args.bins = tmp / "bins"
    packed = tmp / "packed"
    packed.mkdir()
    packs = best_fit_packs(sequence_lengths(rows), 512, 3)
    arrays = pack_rows(rows, packs, 512)
    for k, sl in enumerate(np.array_split(np.arange(len(packs)), 4)):
        write_habana(packed / f"mixed_strategies_part_{k}.hdf5", {f: v[sl] for f, v in arrays.items()})
    lengths = sequence_lengths(rows)
    print(f"rows: {len(lengths)} sequences, {int(lengths.sum())} real tokens (mean {lengths.mean():.0f}); "
          f"{len(packs)} packs of <= 3 ({lengths.sum() / (512 * len(packs)):.1%} real tokens; padded "
          f"{lengths.sum() / (512 * len(lengths)):.1%}, binned "
          f"{lengths.sum() / np.minimum((lengths + 127) // 128 * 128, 512).sum():.1%})", flush=True)
    return {"padded": padded, "binned": args.bins, "packed": packed}


def one_cpu_run(args: argparse.Namespace) -> dict:
    """Child process: one training run; prints its summary and the peak RSS of its ranks."""
    from pretrain.launch import launch
    from pretrain.train_config import TrainConfig

    model_json = None
    if args.model_json:  # preset fields overridden (e.g. 4 layers x 256 hidden: a step bound by its math)
        model_json = args.one_out.parent / f"{args.one_out.name}_model.json"
        model_json.write_text(args.model_json)
    cfg = TrainConfig(train_dir=str(args.one_dir), packed=args.one == "packed", output_dir=str(args.one_out),
                      model=args.model, max_steps=args.steps, micro_batch=args.micro_batch, device="cpu",
                      tensorboard=False, checkpoint_interval=0,
                      model_config=str(model_json) if model_json else None)
    if launch(cfg, nproc=args.nproc) != 0:
        raise SystemExit(f"training on {args.one_dir} failed: see {args.one_out}/launcher.log")
    summary = json.loads((args.one_out / "summary.json").read_text())
    summary["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # the largest rank
    return summary


def cpu_bench(args: argparse.Namespace) -> list[dict]:
    """--rounds rounds of one run per mode, modes interleaved (load from other processes hits all alike)."""
    runs: list[dict] = []
    with tempfile.TemporaryDirectory() as tmp:
        dirs = prepare_cpu_data(args, Path(tmp))
        for rnd in range(args.rounds):
            for mode in args.modes:
                out = Path(tmp) / f"out_{mode}_{rnd}"
                kind, _, kernel = mode.partition("@")  # packed@sdpa_mask: the packed rows with another kernel
                cmd = [sys.executable, __file__, "--one", kind, "--one-dir", str(dirs[kind]), "--one-out", str(out),
                       "--steps", str(args.steps), "--nproc", str(args.nproc), "--model", args.model,
                       *(["--model-json", args.model_json] if args.model_json else []),
                       "--micro-batch", str(args.micro_batch if kind == "packed" else
                                            args.padded_micro_batch or args.micro_batch)]
                env = {**os.environ, **({"BERTPIPE_PACKED_ATTENTION": kernel} if kernel else {})}
                load = Path("/proc/loadavg").read_text().split()[0] if Path("/proc/loadavg").exists() else "?"
                proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
                if proc.returncode:
                    sys.exit(f"{mode} run failed:\n{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
                s = json.loads(proc.stdout.strip().splitlines()[-1])
                r = {"mode": mode, "round": rnd, "tokens_per_s": s["training_real_tokens_per_second"],
                     "sequences_per_s": s["training_real_sequences_per_second"],
                     "rows_per_s": s.get("training_rows_per_second", s["training_sequences_per_second"]), "peak_rss_mb": s["peak_rss_mb"],
                     "train_time_s": s["raw_train_time"], "layout": s["data_layout"],
                     "attention": s.get("packed_attention", ""), "loader_wait_s": s.get("loader_wait_per_step"),
                     "load_before": load}
                runs.append(r)
                print(f"round {rnd + 1} {mode:7s}: {r['tokens_per_s']:9.0f} real tokens/s  {r['sequences_per_s']:7.1f} "
                      f"real seq/s  ({r['rows_per_s']:6.1f} rows/s, {args.steps} steps in {r['train_time_s']:.1f} s)  "
                      f"peak RSS of a rank {r['peak_rss_mb']:.0f} MB  attention {r['attention'] or '-'}  "
                      f"loadavg before {load}", flush=True)
    print(f"{args.nproc} ranks, model {args.model}, micro-batch {args.micro_batch} rows (packs when packed); best of "
          f"{args.rounds} round(s); ratio = median over rounds of (mode / padded of the same round)")
    for mode in args.modes:
        mine = [r for r in runs if r["mode"] == mode]
        best = max(mine, key=lambda r: r["tokens_per_s"])
        ratios = sorted(r["tokens_per_s"] / p["tokens_per_s"] for r in mine for p in runs
                        if p["mode"] == "padded" and p["round"] == r["round"])
        vs_binned = sorted(r["tokens_per_s"] / p["tokens_per_s"] for r in mine for p in runs
                           if p["mode"] == "binned" and p["round"] == r["round"])
        ratio = f"  vs padded {ratios[len(ratios) // 2]:.2f}x ({', '.join(f'{x:.2f}' for x in ratios)})" \
            if ratios and mode != "padded" else ""
        if vs_binned and mode.startswith("packed"):
            ratio += f"; vs binned {vs_binned[len(vs_binned) // 2]:.2f}x ({', '.join(f'{x:.2f}' for x in vs_binned)})"
        print(f"{mode:7s}: {best['tokens_per_s']:9.0f} real tokens/s  {best['sequences_per_s']:7.1f} real seq/s  "
              f"peak RSS of a rank {max(r['peak_rss_mb'] for r in mine):.0f} MB{ratio}", flush=True)
    return runs


# --- GPU: BERT-Large bf16, one device --------------------------------------------------------------------------


def gpu_batches(rows: dict[str, np.ndarray], mode: str, batch_tokens: int, n: int, seed: int = 0):
    """n batches of ``mode`` as (numpy arrays, the rows they hold); about batch_tokens columns x rows each."""
    from core.schema import BIN_BOUNDS
    from pretrain.packing import best_fit_packs, pack_rows, sequence_lengths

    rng = np.random.default_rng(seed)
    lengths = sequence_lengths(rows)
    out = []
    if mode == "packed":
        order = rng.permutation(len(lengths))
        packs = [[int(order[i]) for i in p] for p in best_fit_packs(lengths[order], 512, 3)]
        rng.shuffle(packs)
        per = max(1, batch_tokens // 512)
        for b in range(n):
            chosen = [packs[(b * per + i) % len(packs)] for i in range(per)]
            flat = [r for p in chosen for r in p]
            local = {k: v[flat] for k, v in rows.items()}
            at = np.cumsum([0] + [len(p) for p in chosen])
            out.append((pack_rows(local, [list(range(at[i], at[i + 1])) for i in range(len(chosen))], 512), flat))
        return out
    by_bin = {b: np.flatnonzero((lengths > b - 128) & (lengths <= b)) for b in BIN_BOUNDS}
    sizes = np.array([len(by_bin[b]) for b in BIN_BOUNDS], dtype=float)
    for _ in range(n):
        bound = int(rng.choice(BIN_BOUNDS, p=sizes / sizes.sum())) if mode == "binned" else 512
        pool = by_bin[bound] if mode == "binned" else np.arange(len(lengths))
        per = max(1, batch_tokens // bound)
        idx = rng.choice(pool, per, replace=len(pool) < per)
        arrays = {k: v[idx] for k, v in rows.items()}
        for k in ("input_ids", "input_mask", "segment_ids"):
            arrays[k] = arrays[k][:, :bound]
        out.append((arrays, [int(i) for i in idx]))
    return out


#: run-spec options that compile with another torch.compile mode (Inductor's GEMM autotuning; CUDA graphs)
COMPILE_MODES = {"autotune": "max-autotune-no-cudagraphs", "graphs": "reduce-overhead"}


def parse_run(spec: str) -> dict:
    """A GPU run: ``mode[:kernel][:ad0][:compile|:autotune|:graphs][:profile]``, e.g.
    ``packed:torch_varlen:ad0:compile`` (ad0: attention dropout 0 for this run; torch_varlen and flex_varlen have
    none, so they imply it; autotune / graphs: torch.compile with mode max-autotune-no-cudagraphs /
    reduce-overhead; profile: after the timed steps, ``--profile-steps`` more under torch.profiler, their kernels
    by kind in the result and the trace beside ``--json-out``)."""
    from pretrain.model import PACKED_KERNELS

    mode, *opts = spec.split(":")
    if mode not in MODES:
        raise SystemExit(f"--runs: unknown mode {mode!r} in {spec!r}; choose from {', '.join(MODES)}")
    run = {"spec": spec, "mode": mode, "kernel": "auto", "compile": False, "ad0": False, "profile": False}
    for o in opts:
        if o == "compile":
            run["compile"] = True
        elif o in COMPILE_MODES:  # compile with that mode
            run["compile"], run["compile_mode"] = True, COMPILE_MODES[o]
        elif o == "profile":
            run["profile"] = True
        elif o == "ad0":
            run["ad0"] = True
        elif o in PACKED_KERNELS or o == "auto":
            run["kernel"] = o
        else:
            raise SystemExit(f"--runs: unknown option {o!r} in {spec!r}")
    run["ad0"] = run["ad0"] or run["kernel"] in ("torch_varlen", "flex_varlen")
    return run


#: in order of importance (--budget-s may cut the tail): eager with the model's attention dropout (0.1; packed
#: rows: "auto" = aten_flash_varlen, then the block-diagonal SDPA mask), eager without it (packed: torch_varlen),
#: then compiled and profiled (these parts took ~4 minutes together on an H200, with bench/gpu_run.sh's tests; add
#: packed:torch_varlen:compile for the compiled run without dropout)
GPU_RUNS = ("padded,packed,packed:sdpa_mask,padded:ad0,packed:torch_varlen,packed:compile:profile,"
            "padded:compile:profile")


def gpu_bench(args: argparse.Namespace) -> list[dict]:
    import torch

    from bench.gpu_bench import PEAK_BF16_TFLOPS
    from pretrain.packing import sequence_lengths, valid_slots

    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            sys.exit("no CUDA device visible (use --dry for the CPU run of this code)")
        torch.backends.cuda.matmul.allow_tf32 = True
        name = torch.cuda.get_device_name()
    else:
        name = args.device
    peak = args.peak_tflops or next((v for k, v in PEAK_BF16_TFLOPS if k in name), 989.0)
    rows = bench_rows(args)
    lengths = sequence_lengths(rows)
    n_pred = valid_slots(rows["masked_lm_positions"]).sum(axis=1)
    print(f"device {name}, torch {torch.__version__}, model {args.model}, bf16, peak {peak:g} TFLOP/s, "
          f"{len(lengths)} rows (mean {lengths.mean():.0f} tokens) from "
          f"{'synthetic MLPerf-full-set lengths' if args.lengths == 'mlperf' else args.rows}", flush=True)
    results = []
    started = time.perf_counter()
    for spec in args.runs:
        run = parse_run(spec)
        if args.budget_s and time.perf_counter() - started > args.budget_s:
            print(f"{spec}: skipped (past --budget-s {args.budget_s:g} s)", flush=True)
            continue
        try:
            r = gpu_run(args, run, rows, lengths, n_pred, peak, device)
        except Exception as exc:  # one failing run (a compile error, OOM) must not lose the others
            print(f"{spec}: FAILED {type(exc).__name__}: {str(exc)[:800]}", flush=True)
            r = {"spec": spec, "error": f"{type(exc).__name__}: {str(exc)[:2000]}"}
        results.append(r)
        if args.json_out:  # after every run: a timeout keeps what finished
            args.json_out.write_text(json.dumps({"device": name, "torch": torch.__version__, "peak_tflops": peak,
                                                 "args": {k: str(v) for k, v in vars(args).items()},
                                                 "results": results}, indent=2) + "\n")
        if device.type == "cuda":
            torch.cuda.empty_cache()
    ok = [r for r in results if "error" not in r]
    for r in ok:
        base = next((b for b in ok if b["mode"] == "padded" and b["compile"] == r["compile"] and b["ad0"] == r["ad0"]),
                    None)
        if base and r is not base:
            print(f"{r['spec']}: {r['tokens_per_s'] / base['tokens_per_s']:.2f}x the real tokens/s of {base['spec']}")
    return results


def _profile(args, run: dict, step_model, opt, batches: list, device) -> dict:  # noqa: ANN001
    """``--profile-steps`` more training steps under torch.profiler (bench/gpu_profile.py): kernels by kind."""
    from bench.gpu_profile import print_summary, profile_steps

    done = [0]

    def one_step() -> None:
        step_model(**batches[done[0] % len(batches)]).loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        done[0] += 1

    name = re.sub(r"[^A-Za-z0-9_.-]+", "_", run["spec"])
    summary = profile_steps(one_step, args.profile_steps, args.profile_dir, name, cuda=device.type == "cuda")
    print_summary(run["spec"], summary)
    return summary


def gpu_run(args, run: dict, rows, lengths, n_pred, peak: float, device) -> dict:  # noqa: ANN001
    import torch
    import torch._dynamo

    from bench.gpu_bench import flops_per_sequence
    from pretrain.config import model_config
    from pretrain.model import BertForPreTraining

    mode = run["mode"]
    cfg = model_config(args.model, **({"attention_probs_dropout_prob": 0.0} if run["ad0"] else {}))
    torch.manual_seed(0)
    torch._dynamo.reset()
    model = BertForPreTraining(cfg, static_mlm=not args.dynamic_mlm).to(device).to(torch.bfloat16)
    model.varlen_kernel = run["kernel"]
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01, fused=device.type == "cuda")
    step_model = torch.compile(model, mode=run.get("compile_mode")) if run["compile"] else model
    batches = gpu_batches(rows, mode, args.batch_tokens, args.warmup + args.steps)
    on_device = [{k: torch.from_numpy(v).to(device, non_blocking=True) for k, v in b.items()} for b, _ in batches]
    useful = [sum(flops_per_sequence(cfg, int(lengths[r]), int(n_pred[r])) for r in idx) for _, idx in batches]
    executed = [len(b["input_ids"]) * flops_per_sequence(cfg, b["input_ids"].shape[1],
                                                         b["masked_lm_positions"].shape[1]) for b, _ in batches]
    tokens = [int(lengths[idx].sum()) for _, idx in batches]
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    t_start = time.perf_counter()
    for i, batch in enumerate(on_device):
        if i == args.warmup:
            sync()
            warm_s = time.perf_counter() - t_start
            t0 = time.perf_counter()
        loss = step_model(**batch).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    sync()
    elapsed = time.perf_counter() - t0
    profiled = _profile(args, run, step_model, opt, on_device[args.warmup:], device) if run["profile"] else None
    timed = slice(args.warmup, None)
    seqs = sum(len(idx) for _, idx in batches[timed])
    r = {**run, "rows_per_batch": len(batches[0][0]["input_ids"]), "steps": args.steps,
         "step_ms": 1e3 * elapsed / args.steps, "warmup_s": warm_s,
         "tokens_per_s": sum(tokens[timed]) / elapsed, "sequences_per_s": seqs / elapsed,
         "mfu_real": sum(useful[timed]) / elapsed / (peak * 1e12),
         "mfu_executed": sum(executed[timed]) / elapsed / (peak * 1e12),
         "attention": model.packed_attention or "sdpa-key-padding-mask",
         "attention_dropout": cfg.attention_probs_dropout_prob,
         "peak_mem_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else float("nan"),
         "loss": float(loss.detach()), **({"profile": profiled} if profiled else {})}
    print(f"{run['spec']:32s}: {r['sequences_per_s']:8.1f} real seq/s  {r['tokens_per_s']:10.0f} real tokens/s  "
          f"MFU on real tokens {100 * r['mfu_real']:5.1f} %  (executed {100 * r['mfu_executed']:5.1f} %)  "
          f"{r['step_ms']:.1f} ms/step ({r['rows_per_batch']} rows)  attention {r['attention']} "
          f"(dropout {r['attention_dropout']:g})  warm-up {warm_s:.0f} s  peak mem {r['peak_mem_gib']:.1f} GiB  "
          f"loss {r['loss']:.3f}", flush=True)
    del model, step_model, opt, on_device
    return r


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated: padded, binned, packed")
    p.add_argument("--rows", type=Path, default=DEFAULT_ROWS, help="padded HDF5 rows (default: the golden sample)")
    p.add_argument("--bins", type=Path, default=DEFAULT_BINS, help="the same rows as 4 bins (CPU bench)")
    p.add_argument("--steps", type=int, default=0, help="timed steps (default: CPU 12, GPU 20, --dry 2)")
    p.add_argument("--nproc", type=int, default=2, help="CPU ranks")
    p.add_argument("--rounds", type=int, default=2, help="CPU: runs per mode, modes interleaved")
    p.add_argument("--model", default="", help="preset (default: CPU tiny, GPU large, --dry tiny)")
    p.add_argument("--micro-batch", type=int, default=8, help="CPU: rows (packs) per rank and step")
    p.add_argument("--gpu", action="store_true", help="the one-device BERT-Large bf16 bench (real-token MFU)")
    p.add_argument("--dry", action="store_true", help="with --gpu: run its code on CPU, tiny model, 2 steps")
    p.add_argument("--device", default="", help="GPU bench device (default cuda; --dry: cpu)")
    p.add_argument("--batch-tokens", type=int, default=0, help="GPU: columns x rows per batch (default 32 x 512)")
    p.add_argument("--warmup", type=int, default=-1, help="GPU: untimed steps first (default 5, --dry 1)")
    p.add_argument("--dynamic-mlm", action="store_true",
                   help="GPU: MLM/NSP heads on the valid slots only (a host sync); default: all slots (static shapes)")
    p.add_argument("--compile", action="store_true", help="GPU: torch.compile the model")
    p.add_argument("--peak-tflops", type=float, default=0.0, help="GPU: dense bf16 peak (default from the name)")
    p.add_argument("--json-out", type=Path, help="also write the results here")
    p.add_argument("--model-json", default="",
                   help='CPU: JSON overrides of the preset, e.g. \'{"hidden_size": 256, "num_hidden_layers": 4, '
                        '"num_attention_heads": 4, "intermediate_size": 1024}\' (bench_model.py\'s model)')
    p.add_argument("--lengths", choices=("golden", "mlperf"), default="golden",
                   help="golden: the rows of --rows; mlperf: synthetic rows of the full set's lengths (mean ~254)")
    p.add_argument("--n-rows", type=int, default=4000, help="--lengths mlperf: how many rows")
    p.add_argument("--padded-micro-batch", type=int, default=0,
                   help="CPU: rows per rank and step of the padded and binned runs (default --micro-batch)")
    p.add_argument("--runs", default=GPU_RUNS,
                   help="GPU: comma-separated mode[:kernel][:ad0][:compile] (ad0: attention dropout 0)")
    p.add_argument("--budget-s", type=float, default=0.0, help="GPU: start no run after this many seconds")
    p.add_argument("--profile-steps", type=int, default=3, help="GPU: steps profiled in a run with :profile")
    p.add_argument("--profile-dir", type=Path,
                   help="GPU: where :profile runs write their traces (default: beside --json-out, else the cwd)")
    p.add_argument("--one", help=argparse.SUPPRESS)
    p.add_argument("--one-dir", type=Path, help=argparse.SUPPRESS)
    p.add_argument("--one-out", type=Path, help=argparse.SUPPRESS)
    args = p.parse_args()
    args.modes = [m for m in args.modes.split(",") if m]
    args.runs = [r + (":compile" if args.compile and ":compile" not in r else "") for r in args.runs.split(",") if r]
    if bad := [m for m in args.modes if m.partition("@")[0] not in MODES]:
        p.error(f"--modes: unknown {', '.join(bad)}; choose from {', '.join(MODES)}")
    if args.one:
        args.model = args.model or "tiny"
        print(json.dumps(one_cpu_run(args)))
        return
    if args.gpu:
        args.model = args.model or ("tiny" if args.dry else "large")
        args.device = args.device or ("cpu" if args.dry else "cuda")
        args.steps = args.steps or (2 if args.dry else 20)
        args.warmup = args.warmup if args.warmup >= 0 else (1 if args.dry else 5)
        args.batch_tokens = args.batch_tokens or (4 * 512 if args.dry else 32 * 512)
        args.profile_dir = args.profile_dir or (args.json_out.parent if args.json_out else Path.cwd())
        results = gpu_bench(args)
    else:
        args.model = args.model or "tiny"
        args.steps = args.steps or 12
        results = cpu_bench(args)
    print(f"bench peak RSS (this process): {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    if args.json_out:
        args.json_out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()},
                                             "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
