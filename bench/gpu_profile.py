"""Where a GPU training step's time goes: torch.profiler's kernels grouped by kind, per step.

``profile_steps(step, n, out_dir)`` runs ``step()`` n times under ``torch.profiler`` (CUDA activity), writes
the Chrome trace (``<out_dir>/<name>.trace.json.gz``) and returns :func:`summarize` of its kernels: milliseconds
a step per kind (GEMMs, attention, fused Triton kernels, eager elementwise and reductions, the optimizer,
copies), the share of the step the device was busy (the union of kernel intervals over the span from the first
kernel's start to the last one's end), and the largest kernels. ``bench/bench_train_packed.py --gpu`` runs it for
a run spec with ``:profile``. The kinds are matched by kernel name (cuBLAS ``nvjet``/``sm90_xmma``/``cutlass``,
flash ``flash_fwd``/``flash_bwd``, Inductor's ``triton_``, ATen's ``elementwise``/``reduce`` templates ...), so a
kernel of a kind nobody named lands in "other".
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

#: (kind, pattern on the kernel's name), first match wins
KINDS = (
    ("attention", r"flash|fmha|attention|attn"),
    ("gemm", r"gemm|nvjet|xmma|cutlass|cublas|matmul|splitK|sm\d\d_"),
    ("optimizer", r"multi_tensor|adam|lamb|foreach"),
    ("triton", r"^triton_"),
    ("dropout", r"dropout|bernoulli|philox|fused_dropout"),
    ("norm/softmax/loss", r"layer_norm|LayerNorm|softmax|cross_entropy|nll_loss|log_softmax"),
    ("reduce", r"reduce_kernel|reduce|Reduce"),
    ("copy/index", r"copy|Memcpy|Memset|memcpy|memset|cat|index|gather|scatter|CatArray"),
    ("elementwise", r"elementwise|vectorized|unrolled"),
)


def kind_of(name: str) -> str:
    for kind, pattern in KINDS:
        if re.search(pattern, name):
            return kind
    return "other"


def _busy_us(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def summarize(events: list[dict], steps: int, top: int = 15) -> dict:
    """Kernel events of a Chrome trace (``cat`` kernel / gpu_memcpy / gpu_memset, ``ts`` and ``dur`` in µs) ->
    per-step milliseconds by kind, busy share, kernel count and the ``top`` kernels by time."""
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if not kernels:
        return {"steps": steps, "kernels_per_step": 0, "by_kind_ms": {}, "busy": 0.0, "span_ms": 0.0, "top": []}
    by_kind: dict[str, float] = {}
    by_name: dict[str, list[float]] = {}
    for e in kernels:
        name, dur = str(e.get("name", "?")), float(e.get("dur", 0.0))
        kind = kind_of(name) if e["cat"] == "kernel" else "copy/index"
        by_kind[kind] = by_kind.get(kind, 0.0) + dur
        by_name.setdefault(name, [0.0, 0])
        by_name[name][0] += dur
        by_name[name][1] += 1
    start = min(float(e["ts"]) for e in kernels)
    end = max(float(e["ts"]) + float(e.get("dur", 0.0)) for e in kernels)
    busy = _busy_us([(float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0.0))) for e in kernels])
    ranked = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:top]
    return {"steps": steps, "kernels_per_step": len(kernels) / steps,
            "by_kind_ms": {k: round(v / 1e3 / steps, 3) for k, v in sorted(by_kind.items(), key=lambda kv: -kv[1])},
            "kernel_ms_per_step": round(sum(by_kind.values()) / 1e3 / steps, 3),
            "span_ms_per_step": round((end - start) / 1e3 / steps, 3), "busy": round(busy / (end - start), 4),
            "top": [{"name": n[:120], "kind": kind_of(n), "ms_per_step": round(t / 1e3 / steps, 3),
                     "calls_per_step": c / steps} for n, (t, c) in ranked]}


def profile_steps(step, steps: int, out_dir: Path, name: str, cuda: bool = True) -> dict:  # noqa: ANN001
    """Run ``step()`` ``steps`` times under torch.profiler; write the trace; return :func:`summarize`'s dict."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CUDA] if cuda else [ProfilerActivity.CPU]
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        sync()
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = out_dir / f"{name}.trace.json"
    prof.export_chrome_trace(str(raw))
    trace = json.loads(raw.read_text())
    with gzip.open(out_dir / f"{name}.trace.json.gz", "wt") as f:
        json.dump(trace, f)
    raw.unlink()
    events = trace.get("traceEvents", [])
    if not cuda:  # CPU (the --dry run): the ops stand in for kernels
        events = [{**e, "cat": "kernel"} for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    return summarize(events, steps)


def print_summary(label: str, s: dict) -> None:
    kinds = ", ".join(f"{k} {v:.1f}" for k, v in s["by_kind_ms"].items())
    print(f"{label}: profile of {s['steps']} steps: {s.get('kernel_ms_per_step', 0):.1f} ms of kernels a step "
          f"over a {s['span_ms_per_step']:.1f} ms span (device busy {100 * s['busy']:.1f} %), "
          f"{s['kernels_per_step']:.0f} kernels a step; ms a step by kind: {kinds}", flush=True)
    for t in s["top"]:
        print(f"    {t['ms_per_step']:8.2f} ms  {t['calls_per_step']:6.1f}x  {t['kind']:18s} {t['name']}", flush=True)
