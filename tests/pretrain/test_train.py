"""Real DeepSpeed runs: 2 CPU ranks (DS_ACCELERATOR=cpu, gloo, ZeRO-1, bf16) of the tiny model.

One deterministic 30-step run over all four length bins is shared by the tests of this module; it saves a
checkpoint at step 20, and the resume test continues a copy of that checkpoint to step 30 (one more
launch). The slow tests stop a run for real (--steps-this-run, SIGTERM) and resume it. DeepSpeed
JIT-builds its shm comm op once (~50 s cold) into TORCH_EXTENSIONS_DIR, shared by every run of the
session (and later sessions).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from pretrain.launch import build_command, free_port, launch, launch_env, preflight, wait_for_group
from pretrain.metrics import read_metrics
from pretrain.train_config import TrainConfig

pytest.importorskip("deepspeed")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))

GOLDEN_LOSSES = Path(__file__).resolve().parents[1] / "golden" / "losses_cpu.txt"
STEPS, STOP_AT, EVAL_EVERY = 30, 20, 15


def _cfg(golden: Path, out: Path, **kw) -> TrainConfig:
    base = dict(train_dir=str(golden / "4bins"), eval_file=str(golden / "eval_100.hdf5"), output_dir=str(out),
                model="tiny", max_steps=STEPS, device="cpu", deterministic=True, learning_rate=0.05,
                micro_batch=4, eval_interval_steps=EVAL_EVERY, checkpoint_interval=STOP_AT, tensorboard=False)
    return TrainConfig(**{**base, **kw})


def _losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r}


def _evals(out: Path) -> dict[int, float]:
    return {r["step"]: r["eval_mlm_accuracy"] for r in read_metrics(out / "metrics.jsonl") if "eval_mlm_accuracy" in r}


@pytest.fixture(scope="module")
def main_run(golden, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("train") / "main"
    t0 = time.perf_counter()
    assert launch(_cfg(golden, out, tensorboard=True), nproc=2) == 0
    print(f"\n2-rank tiny run, {STEPS} steps: {time.perf_counter() - t0:.1f} s wall")
    return out


def test_two_cpu_ranks_loss_falls_and_eval_is_reported(main_run, golden):
    losses = _losses(main_run)
    assert sorted(losses) == list(range(1, STEPS + 1))
    first, last = np.mean([losses[s] for s in range(1, 6)]), np.mean([losses[s] for s in range(STEPS - 4, STEPS + 1)])
    assert last < first - 0.5, (first, last)
    records = read_metrics(main_run / "metrics.jsonl")
    step = next(r for r in records if r.get("step") == 10 and "loss" in r)
    assert {"step", "loss", "lr", "seq_per_s", "step_time", "mlm_loss", "nsp_loss"} <= set(step)
    evals = [r for r in records if "eval_mlm_accuracy" in r]
    assert [r["step"] for r in evals] == [EVAL_EVERY, STEPS]
    with h5py.File(golden / "eval_100.hdf5") as h:
        masked = int((h["masked_lm_positions"][:] != 0).sum())
    assert all(r["eval_masked_tokens"] == masked for r in evals)  # every masked token of eval_100, once
    assert all(0.0 <= r["eval_mlm_accuracy"] <= 1.0 for r in evals)
    assert evals[-1]["eval_mlm_accuracy"] > 0.0  # learnt at least the frequent tokens
    summary = json.loads((main_run / "summary.json").read_text())
    assert summary["final_eval_mlm_accuracy"] == evals[-1]["eval_mlm_accuracy"]
    assert summary["eval_target"] == 0.72 and summary["world_size"] == 2 and summary["steps"] == STEPS
    assert summary["training_sequences_per_second"] > 0 and summary["e2e_time"] > summary["raw_train_time"]
    from pretrain.metrics import _without_tensorflow

    _without_tensorflow()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(main_run / "tensorboard"))
    events.Reload()
    assert [e.value for e in events.Scalars("loss")] == pytest.approx([losses[s] for s in range(1, STEPS + 1)])
    cfg = json.loads((main_run / "config.json").read_text())
    assert cfg["deepspeed"]["zero_optimization"]["stage"] == 1 and cfg["deepspeed"]["bf16"]["enabled"]
    assert (main_run / "checkpoints" / "latest").read_text().strip() == str(STEPS)
    print(f"tiny model: {summary['training_sequences_per_second']:.1f} seq/s (2 CPU ranks), "
          f"final eval accuracy {summary['final_eval_mlm_accuracy']:.4f}")


def test_resume_from_step_k_repeats_the_losses(main_run, golden, tmp_path):
    """A run continued from the step-20 checkpoint gives the uninterrupted run's losses 21..30 exactly."""
    out = tmp_path / "resumed"
    shutil.copytree(main_run / "checkpoints" / str(STOP_AT), out / "checkpoints" / str(STOP_AT))
    (out / "checkpoints" / "latest").write_text(str(STOP_AT))
    assert launch(_cfg(golden, out, resume=True), nproc=2) == 0
    expected, got = _losses(main_run), _losses(out)
    assert sorted(got) == list(range(STOP_AT + 1, STEPS + 1))
    assert [got[s] for s in range(STOP_AT + 1, STEPS + 1)] == [expected[s] for s in range(STOP_AT + 1, STEPS + 1)]
    assert _evals(out)[STEPS] == _evals(main_run)[STEPS]


@pytest.mark.slow
def test_stopped_and_resumed_run_repeats_the_losses(main_run, golden, tmp_path):
    out = tmp_path / "resumed"
    assert launch(_cfg(golden, out, steps_this_run=STOP_AT), nproc=2) == 0
    assert max(_losses(out)) == STOP_AT
    assert json.loads((out / "summary.json").read_text())["stopped_by"] == "steps_this_run"
    assert launch(_cfg(golden, out, resume=True), nproc=2) == 0
    expected, got = _losses(main_run), _losses(out)
    assert [got[s] for s in range(STOP_AT + 1, STEPS + 1)] == [expected[s] for s in range(STOP_AT + 1, STEPS + 1)]
    assert _evals(out)[STEPS] == _evals(main_run)[STEPS]


def test_golden_loss_curve(main_run):
    """style.md §9c: the first 20 losses of the deterministic tiny run on CPU.

    Regenerate with BERTPIPE_UPDATE_GOLDEN=1 after an intended change of model, data order or optimizer.
    """
    losses = _losses(main_run)
    lines = [f"{s} {losses[s]!r}" for s in range(1, 21)]
    if os.environ.get("BERTPIPE_UPDATE_GOLDEN") == "1":
        GOLDEN_LOSSES.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN_LOSSES.write_text("\n".join(lines) + "\n")
    expected = [float(line.split()[1]) for line in GOLDEN_LOSSES.read_text().split("\n") if line.strip()]
    # Bit-exact run to run on one machine (the resume tests check that with ==). Across CPUs the bf16 kernels
    # differ and so do the last bits: measured against this file, an AVX-512/bf16 Xeon moved the curve by up
    # to 3.7e-4, and the same Xeon pinned to AVX2 or SSE4.1 kernels (ATEN_CPU_CAPABILITY, ONEDNN_MAX_CPU_ISA)
    # by 4.4e-4 and 5.5e-4, so no pinning reproduces another CPU's bits. Real changes are far above 3e-3:
    # learning rate 0.05 -> 0.049 moved it by 0.022, another data-order seed by 0.12.
    assert [losses[s] for s in range(1, 21)] == pytest.approx(expected, rel=0, abs=3e-3)


def test_checkpoint_of_another_model_is_refused(main_run, golden):
    from core.errors import InputError

    other = _cfg(golden, main_run, resume=True, model_config=str(_write_json(main_run.parent / "m.json",
                                                                             {"hidden_size": 128})))
    with pytest.raises(InputError, match=r"another model config \(hidden_size: checkpoint 64 vs this run 128"):
        preflight(other)
    preflight(_cfg(golden, main_run, resume=True))  # the same model resumes


def _write_json(path: Path, obj: dict) -> Path:
    path.write_text(json.dumps(obj))
    return path


def test_cli_prints_the_launcher_command(golden, tmp_path, capsys):
    from bertpipe.cli import main

    rc = main(["train", "--train-dir", str(golden / "4bins"), "--eval-file", str(golden / "eval_100.hdf5"),
               "--model", "tiny", "--max-steps", "5", "--nproc", "2", "--output-dir", str(tmp_path),
               "--device", "cpu", "--dry-run"])
    line = capsys.readouterr().out.strip().splitlines()[-1]
    assert rc == 0
    assert "deepspeed --num_gpus 2 --master_port" in line and "pretrain/train.py" in line
    assert "--max-steps 5" in line and "--device cpu" in line


def test_cli_refuses_bad_input_before_launching(golden, tmp_path, capsys):
    from bertpipe.cli import main

    bins = tmp_path / "4bins"
    shutil.copytree(golden / "4bins", bins)
    (bins / "512/part_7_of_8.hdf5").unlink()
    rc = main(["train", "--train-dir", str(bins), "--output-dir", str(tmp_path / "o"), "--nproc", "2"])
    assert rc == 2 and "missing HDF5 shard" in capsys.readouterr().err
    rc = main(["train", "--train-dir", str(golden / "4bins"), "--vocab-size", "1000", "--output-dir",
               str(tmp_path / "o"), "--nproc", "2"])
    assert rc == 2 and "vocab_size 1000" in capsys.readouterr().err


def test_multinode_command_shape(golden, tmp_path):
    cmd = build_command(_cfg(golden, tmp_path), 8, hostfile="hosts", num_nodes=4, master_addr="10.0.0.1")
    assert cmd[1:9] == ["--hostfile", "hosts", "--num_nodes", "4", "--num_gpus", "8", "--master_addr", "10.0.0.1"]
    torchrun = build_command(_cfg(golden, tmp_path), 2, launcher="torchrun", master_port=1234)
    assert Path(torchrun[0]).name == "torchrun" and torchrun[1:5] == ["--nproc_per_node", "2", "--master_port", "1234"]
    assert launch_env(_cfg(golden, tmp_path), 2, base={})["DS_ACCELERATOR"] == "cpu"
    # an explicit --device beats a DS_ACCELERATOR left in the environment (else DeepSpeed picks another device)
    assert launch_env(_cfg(golden, tmp_path, device="cuda"), 1, base={"DS_ACCELERATOR": "cpu"})["DS_ACCELERATOR"] == "cuda"
    assert "DS_ACCELERATOR" not in launch_env(_cfg(golden, tmp_path, device="auto"), 1, base={"DS_ACCELERATOR": "hpu"})


@pytest.mark.slow
def test_sigterm_writes_a_checkpoint_and_resumes(golden, tmp_path):
    out = tmp_path / "sig"
    cfg = _cfg(golden, out, max_steps=400, eval_file="")
    cmd = build_command(cfg, 2, master_port=free_port())
    proc = subprocess.Popen(cmd, env={**os.environ, **launch_env(cfg, 2)}, start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and not ((out / "metrics.jsonl").exists() and len(_losses(out)) >= 3):
        time.sleep(1)
    os.killpg(proc.pid, signal.SIGTERM)
    proc.wait(timeout=120)
    assert wait_for_group(proc.pid), "ranks still running 120 s after SIGTERM"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_by"] == "sigterm" and 3 <= summary["steps"] < 400
    assert (out / "checkpoints" / "latest").read_text().strip() == str(summary["steps"])
    assert launch(_cfg(golden, out, max_steps=400, eval_file="", steps_this_run=2, resume=True), nproc=2) == 0
    assert max(_losses(out)) == summary["steps"] + 2


@pytest.mark.slow
def test_diverging_run_stops_before_the_optimizer_step(golden, tmp_path):
    """Weights initialised at 1e20 (a model config, since --learning-rate is bounded at parse time) overflow the
    first forward pass: step 1's loss is not finite, no optimizer step is taken, no checkpoint, the ranks exit 2."""
    out = tmp_path / "nan"
    cfg = _cfg(golden, out, train_dir=str(golden / "4bins" / "128"), eval_file="", optimizer="adamw",
               model_config=str(_write_json(tmp_path / "huge_init.json", {"initializer_range": 1e20})),
               warmup_proportion=0.0, deterministic=False, max_steps=6)
    cmd = build_command(cfg, 2, master_port=free_port())
    res = subprocess.run(cmd, env={**os.environ, **launch_env(cfg, 2)}, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0
    text = res.stdout + res.stderr
    assert re.search(r"non-finite loss (nan|inf) at step 1 \(micro-step 1 of 1\), epoch 0 batch 0 \(bin 128", text), text[-3000:]
    assert _losses(out) == {}  # no step was logged as taken
    assert not (out / "checkpoints" / "1").exists()


@pytest.mark.slow
def test_ranks_refuse_a_checkpoint_of_another_model(main_run, golden):
    """The check in train.py itself (the CLI's preflight is skipped here)."""
    cfg = _cfg(golden, main_run, resume=True, eval_file="",
               model_config=str(_write_json(main_run.parent / "m2.json", {"num_hidden_layers": 3})))
    cmd = build_command(cfg, 2, master_port=free_port())
    res = subprocess.run(cmd, env={**os.environ, **launch_env(cfg, 2)}, capture_output=True, text=True, timeout=300)
    assert res.returncode != 0
    assert "another model config (num_hidden_layers: checkpoint 2 vs this run 3)" in res.stdout + res.stderr
