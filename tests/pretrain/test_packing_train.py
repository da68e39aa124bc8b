"""A real packed training run: 2 CPU ranks (DeepSpeed, ZeRO-1, bf16), tiny model, `--packed` on Habana-layout
packs of golden rows; a copy of its step-3 checkpoint resumes and repeats steps 4..6 exactly (slow: 2 launches)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import h5py
import pytest

from pretrain.metrics import read_metrics
from pretrain.packing import best_fit_packs, pack_rows, sequence_lengths, write_habana
from pretrain.train_config import TrainConfig

pytest.importorskip("deepspeed")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))
STEPS, STOP_AT = 6, 3


def _losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r}


@pytest.mark.slow
def test_packed_two_rank_run_trains_and_resumes_exactly(golden, tmp_path):
    from pretrain.launch import launch

    with h5py.File(golden / "sample.hdf5") as f:
        rows = {k: f[k][:1500] for k in f}
    packed = pack_rows(rows, best_fit_packs(sequence_lengths(rows), 512, 3), 512)
    data = tmp_path / "packed"
    data.mkdir()
    half = len(packed["input_ids"]) // 2
    write_habana(data / "mixed_strategies_part_0.hdf5", {k: v[:half] for k, v in packed.items()})
    write_habana(data / "mixed_strategies_part_1.hdf5", {k: v[half:] for k, v in packed.items()})

    def cfg(out: Path, **kw) -> TrainConfig:
        return TrainConfig(train_dir=str(data), packed=True, eval_file=str(golden / "eval_100.hdf5"),
                           output_dir=str(out), model="tiny", max_steps=STEPS, device="cpu", deterministic=True,
                           learning_rate=0.05, micro_batch=4, eval_interval_steps=STOP_AT, max_eval_samples=40,
                           checkpoint_interval=STOP_AT, tensorboard=False, **kw)

    main = tmp_path / "main"
    assert launch(cfg(main), nproc=2) == 0
    losses = _losses(main)
    assert sorted(losses) == list(range(1, STEPS + 1)) and all(v == v for v in losses.values())
    summary = json.loads((main / "summary.json").read_text())
    assert summary["data_layout"] == "packed-habana" and summary["steps"] == STEPS
    packs_per_s = summary["training_sequences_per_second"]  # rows = packs here
    assert summary["training_real_sequences_per_second"] > 1.1 * packs_per_s  # packs hold several sequences
    assert summary["training_real_tokens_per_second"] > 300 * summary["training_real_sequences_per_second"] / 2
    assert json.loads((main / "config.json").read_text())["train"]["packed"] is True
    assert "packed rows: attention sdpa-block-diagonal-mask" in (main / "launcher.log").read_text()
    evals = [r for r in read_metrics(main / "metrics.jsonl") if "eval_mlm_accuracy" in r]
    assert [r["step"] for r in evals] == [STOP_AT, STEPS]  # eval (padded rows) works on a packed-trained model

    resumed = tmp_path / "resumed"
    shutil.copytree(main / "checkpoints" / str(STOP_AT), resumed / "checkpoints" / str(STOP_AT))
    (resumed / "checkpoints" / "latest").write_text(str(STOP_AT))
    assert launch(cfg(resumed, resume=True), nproc=2) == 0
    got = _losses(resumed)
    assert sorted(got) == list(range(STOP_AT + 1, STEPS + 1))
    assert [got[s] for s in got] == [losses[s] for s in got]  # bit for bit: data position + RNG restored
