"""bench/gpu_profile.py: a profiled step's kernels by kind (names as a real H200 trace had them), the device's
busy share as the union of kernel intervals, and the GPU bench's run specs that ask for a profile."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from bench.gpu_profile import kind_of, summarize

ROOT = Path(__file__).resolve().parents[1]

# kernel names taken from the 2026-11-28 H200 profile of a compiled packed BERT-Large step
NAMES = {
    "void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<Flash_bwd_kernel_traits<64, 128>>": "attention",
    "cudnn_generated_fort_native_sdpa_sm90_flash_bprop_wgmma_f16_knob_26_64x64x64_1x4x1": "attention",
    "nvjet_sm90_tst_256x128_64x4_1x2_h_bz_coopA_NNT": "gemm",
    "nvjet_sm90_tst_128x256_64x4_2x1_v_bz_coopA_splitK_NTN": "gemm",
    "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64": "gemm",
    "triton_per_fused_add_native_dropout_native_layer_norm_10": "triton",
    "triton_poi_fused_gelu_gelu_backward_19": "triton",
    "void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>": "optimizer",
    "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl>": "elementwise",
    "void at::native::(anonymous namespace)::fused_dropout_kernel_vec<c10::BFloat16, float>": "dropout",
    "void at::native::elementwise_kernel<128, 2, direct_copy_kernel_cuda>": "copy/index",
    "void at::native::reduce_kernel<512, 1, ReduceOp<float, MeanOps>>": "reduce",
    "void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::BFloat16>": "norm/softmax/loss",
    "some_new_kernel": "other",
}


@pytest.mark.parametrize("name,kind", NAMES.items())
def test_kernel_kinds(name, kind):
    assert kind_of(name) == kind


def kernel(name: str, ts: float, dur: float, cat: str = "kernel") -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur}


def test_summary_per_step_busy_share_and_top():
    events = [
        kernel("nvjet_sm90_gemm_a", 0, 40),
        kernel("triton_poi_fused_gelu_1", 30, 20),  # overlaps the GEMM by 10 µs: busy counts it once
        kernel("flash_fwd_kernel", 60, 30),
        kernel("Memcpy DtoD", 100, 10, cat="gpu_memcpy"),
        kernel("nvjet_sm90_gemm_a", 110, 40),
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 500},  # host ops are not kernels
        {"ph": "i", "cat": "kernel", "name": "marker", "ts": 5},
    ]
    s = summarize(events, steps=2, top=2)
    assert s["steps"] == 2 and s["kernels_per_step"] == 2.5
    assert s["by_kind_ms"] == {"gemm": 0.04, "attention": 0.015, "triton": 0.01, "copy/index": 0.005}
    assert list(s["by_kind_ms"]) == ["gemm", "attention", "triton", "copy/index"]  # largest first
    assert s["kernel_ms_per_step"] == 0.07
    assert s["span_ms_per_step"] == 0.075  # 0 .. 150 µs over 2 steps
    assert s["busy"] == pytest.approx(130 / 150, abs=1e-4)  # gaps 50-60 and 90-100; overlap counted once
    assert [t["name"] for t in s["top"]] == ["nvjet_sm90_gemm_a", "flash_fwd_kernel"]
    assert s["top"][0] == {"name": "nvjet_sm90_gemm_a", "kind": "gemm", "ms_per_step": 0.04, "calls_per_step": 1.0}
    json.dumps(s)  # goes into the bench's JSON as is


def test_summary_without_kernels():
    s = summarize([{"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 0, "dur": 5}], steps=3)
    assert s["kernels_per_step"] == 0 and s["by_kind_ms"] == {} and s["busy"] == 0.0


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_train_packed", ROOT / "bench" / "bench_train_packed.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_run_specs(bench):
    r = bench.parse_run("packed:compile:profile")
    assert (r["mode"], r["kernel"], r["compile"], r["profile"], r.get("compile_mode")) == (
        "packed", "auto", True, True, None)
    r = bench.parse_run("packed:aten_flash_varlen:autotune")
    assert r["compile"] and r["compile_mode"] == "max-autotune-no-cudagraphs" and not r["profile"]
    assert bench.parse_run("padded:graphs")["compile_mode"] == "reduce-overhead"
    assert bench.parse_run("packed:torch_varlen")["ad0"]  # varlen_attn has no dropout
    assert not bench.parse_run("packed:sdpa_mask")["ad0"]
    with pytest.raises(SystemExit, match="unknown option 'profil'"):
        bench.parse_run("packed:profil")
    for spec in bench.GPU_RUNS.split(","):  # the default list parses
        bench.parse_run(spec)


def test_dry_gpu_bench_writes_a_profile(tmp_path):
    """The GPU bench's code on CPU (--dry: tiny model): a :profile run writes its trace and its kernels' summary."""
    import subprocess
    import sys

    out = tmp_path / "r.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_train_packed.py"), "--gpu", "--dry", "--lengths", "mlperf",
         "--n-rows", "200", "--runs", "packed:split_varlen:profile", "--profile-steps", "2", "--json-out", str(out)],
        capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "profile of 2 steps" in proc.stdout
    (r,) = json.loads(out.read_text())["results"]
    assert r["attention"] == "varlen:split_varlen" and r["profile"]["steps"] == 2
    assert r["profile"]["kernels_per_step"] > 0 and 0 < r["profile"]["busy"] <= 1
    assert (tmp_path / "packed_split_varlen_profile.trace.json.gz").stat().st_size > 0


def test_attention_bench_layout_is_the_models():
    """bench/gpu_attention.py's cu_seqlens are those the model builds for the same packs (static and compact)."""
    import numpy as np
    import torch

    from bench.bench_train_packed import gpu_batches, mlperf_lengths, synthetic_rows
    from bench.gpu_attention import batch_layout
    from pretrain import model as M
    from pretrain.config import model_config

    static, compact, sum_sq, real = batch_layout(300, 4)
    arrays, idx = gpu_batches(synthetic_rows(mlperf_lengths(300, 0), 0), "packed", 4 * 512, 1, 0)[0]
    seen = {}

    def spy(q, k, v, cu, max_seqlen, dropout_p):
        seen.setdefault(spy.mode, cu.numpy().copy())
        return M.split_varlen(q, k, v, cu, max_seqlen, dropout_p)

    m = M.BertForPreTraining(model_config("tiny")).eval()
    t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}
    for mode, static_shapes in (("static", True), ("compact", False)):
        spy.mode, spy.static_shapes = mode, static_shapes
        m.varlen_kernel = spy
        with torch.no_grad():
            m.sequence_output(t["input_ids"], t["segment_ids"], t["input_mask"], t["positions"],
                              t["next_sentence_positions"].shape[1])
    assert np.array_equal(seen["static"], static) and np.array_equal(seen["compact"], compact)
    lengths = np.diff(compact)[arrays["input_mask"].reshape(-1)[compact[:-1]] != 0]
    assert real == int((arrays["input_mask"] != 0).sum()) == int(lengths.sum())
    assert sum_sq == int((lengths ** 2).sum()) and len(lengths) == len(idx)


def test_attention_bench_needs_cuda():
    import subprocess
    import sys

    import torch

    if torch.cuda.is_available():
        pytest.skip("a CUDA device is visible")
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu_attention.py")], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert proc.returncode == 1 and "no CUDA device visible" in proc.stderr
