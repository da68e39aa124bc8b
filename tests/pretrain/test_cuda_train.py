"""Real DeepSpeed on one NVIDIA GPU (NCCL): the tiny model trains, picks CUDA by itself, and resumes.

Marked ``gpu``: run with ``pytest -m gpu`` on a machine where torch sees a CUDA device. They skip (not
fail) elsewhere, so ``-m gpu`` on a CPU box says what it did not check.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest

from pretrain.metrics import read_metrics
from pretrain.train_config import TrainConfig

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
pytest.importorskip("deepspeed")
if not torch.cuda.is_available():
    pytest.skip("torch sees no CUDA device", allow_module_level=True)

STEPS, STOP_AT = 30, 20


def _cfg(golden: Path, out: Path, **kw) -> TrainConfig:
    base = dict(train_dir=str(golden / "4bins"), eval_file=str(golden / "eval_100.hdf5"), output_dir=str(out),
                model="tiny", max_steps=STEPS, device="cuda", deterministic=True, micro_batch=8,
                eval_interval_steps=15, checkpoint_interval=STOP_AT, tensorboard=False)
    return TrainConfig(**{**base, **kw})


def _losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r}


@pytest.fixture(scope="module")
def cuda_run(golden, tmp_path_factory) -> Path:
    from pretrain.launch import launch

    out = tmp_path_factory.mktemp("cuda") / "main"
    assert launch(_cfg(golden, out), nproc=1) == 0
    return out


def test_auto_selects_cuda():
    from pretrain.devices import select_device

    choice = select_device("auto", hpu_available=False, env={})  # conftest sets DS_ACCELERATOR=cpu
    assert (choice.kind, choice.backend, choice.torch_device(0)) == ("cuda", "nccl", "cuda:0")


def test_tiny_model_trains_on_the_gpu(cuda_run):
    summary = json.loads((cuda_run / "summary.json").read_text())
    assert summary["device"] == "cuda" and summary["steps"] == STEPS
    losses = _losses(cuda_run)
    assert sorted(losses) == list(range(1, STEPS + 1))
    assert all(math.isfinite(v) for v in losses.values())
    first = sum(losses[s] for s in range(1, 6)) / 5
    last = sum(losses[s] for s in range(STEPS - 4, STEPS + 1)) / 5
    assert last < first, (first, last)


def test_resume_on_the_gpu_repeats_the_losses(cuda_run, golden, tmp_path):
    from pretrain.launch import launch

    out = tmp_path / "resumed"
    shutil.copytree(cuda_run / "checkpoints" / str(STOP_AT), out / "checkpoints" / str(STOP_AT))
    (out / "checkpoints" / "latest").write_text(str(STOP_AT))
    assert launch(_cfg(golden, out, resume=True), nproc=1) == 0
    expected, got = _losses(cuda_run), _losses(out)
    assert sorted(got) == list(range(STOP_AT + 1, STEPS + 1))
    # --deterministic on CUDA: cuBLAS workspace config and deterministic algorithms, so the same bits
    assert [got[s] for s in range(STOP_AT + 1, STEPS + 1)] == [expected[s] for s in range(STOP_AT + 1, STEPS + 1)]
