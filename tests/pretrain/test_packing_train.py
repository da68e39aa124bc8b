"""A real packed training run: 2 CPU ranks (DeepSpeed, ZeRO-1, bf16), tiny model, `--packed` on Habana-layout
packs of golden rows (1 to 3 sequences a pack, 1.9 on average); a copy of its step-3 checkpoint resumes and repeats steps 4..6
exactly (slow: 3 launches in all).

MLPerf counts samples as sequences. The sequences each step trains are counted here independently of the
trainer: the same sampler's batches for both ranks, each pack's sequences read from its ``input_mask``
(sequence numbers 1..k), not from ``next_sentence_weights`` as the trainer does. The run's MLPerf log
(MLCommons' compliance checker passes it), its evals (``--eval-interval-samples``: at the step whose count
reaches the interval, where rows would reach it a step later), metrics.jsonl and summary.json carry those
counts; a resume continues them, and a checkpoint written before the count existed resumes with
step x global batch x the packed rows' mean sequences per pack (rows packed / packs).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from pretrain.metrics import read_metrics
from pretrain.packing import best_fit_packs, pack_rows, sequence_lengths, training_sampler, write_habana
from pretrain.schedule import crosses_multiple
from pretrain.train_config import TrainConfig

pytest.importorskip("deepspeed")
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))
STEPS, STOP_AT, MICRO, RANKS = 6, 3, 4, 2
GLOBAL = MICRO * RANKS  # packs a step


def _losses(out: Path) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r}


def _mllog(out: Path) -> list[dict]:
    lines = (out / "mllog.txt").read_text().splitlines()
    return [json.loads(line[len(":::MLLOG "):]) for line in lines]


def _sequences_per_step(data: Path, seed: int) -> list[int]:
    """Sequences of each step's packs over both ranks: the batches the ranks draw, counted from input_mask."""
    per_step = [0] * STEPS
    for rank in range(RANKS):
        sampler, _ = training_sampler(str(data), True, MICRO, rank, RANKS, seed)
        for i in range(STEPS):
            per_step[i] += sum(int(a["input_mask"].max(axis=1).sum()) for a in sampler.next_batch().parts())
        sampler.close()
    return per_step


@pytest.fixture(scope="module")
def packed_run(golden, tmp_path_factory):
    """(data dir, run config maker, main run's dir, cumulative sequences after each step 0..STEPS, interval)."""
    from pretrain.launch import launch

    tmp = tmp_path_factory.mktemp("packed_run")
    with h5py.File(golden / "sample.hdf5") as f:  # the short rows of the first 6,000 and 600 long ones
        lengths = (f["input_mask"][:6000] != 0).sum(axis=1)
        pick = np.sort(np.concatenate([np.nonzero(lengths <= 256)[0], np.nonzero(lengths > 256)[0][:600]]))
        rows = {k: f[k][:6000][pick] for k in f}
    packs = best_fit_packs(sequence_lengths(rows), 512, 3)
    assert sorted(i for p in packs for i in p) == list(range(len(pick)))
    assert {len(p) for p in packs} == {1, 2, 3}
    packed = pack_rows(rows, packs, 512)
    data = tmp / "packed"
    data.mkdir()
    half = len(packed["input_ids"]) // 2
    write_habana(data / "mixed_strategies_part_0.hdf5", {k: v[:half] for k, v in packed.items()})
    write_habana(data / "mixed_strategies_part_1.hdf5", {k: v[half:] for k, v in packed.items()})
    # Habana's metadata file beside the folder: the packing rate of MLPerf's global batch (packs x rate)
    (tmp / "packed_metadata.json").write_text(json.dumps({"avg_seq_per_sample": len(pick) / len(packs)}))

    seed = TrainConfig().seed
    counts = np.cumsum([0, *_sequences_per_step(data, seed)]).tolist()
    interval = counts[STOP_AT]  # reached at step 3 by sequences; rows (8 a step) reach it at step 5 or later
    assert counts[STOP_AT] > (STOP_AT + 1) * GLOBAL and counts[STEPS] > STEPS * GLOBAL  # packs hold several

    def cfg(out: Path, **kw) -> TrainConfig:
        return TrainConfig(train_dir=str(data), packed=True, eval_file=str(golden / "eval_100.hdf5"),
                           output_dir=str(out), model="tiny", max_steps=STEPS, device="cpu", deterministic=True,
                           learning_rate=0.05, micro_batch=MICRO, eval_interval_samples=interval,
                           max_eval_samples=40, checkpoint_interval=STOP_AT, tensorboard=False, seed=seed, **kw)

    main = tmp / "main"
    assert launch(cfg(main), nproc=RANKS) == 0
    return {"data": data, "cfg": cfg, "main": main, "counts": counts, "interval": interval,
            "mean": len(pick) / len(packs)}


def _resume_from_copy(run: dict, out: Path, strip_count: bool = False) -> None:
    """Resume a copy of the main run's step-3 checkpoint in ``out`` (``strip_count``: as a checkpoint written
    before the sequence count was kept: the count taken out of the rank states, the completion record redone)."""
    import torch

    from pretrain import checkpoint as ckpt
    from pretrain.launch import launch

    shutil.copytree(run["main"] / "checkpoints" / str(STOP_AT), out / "checkpoints" / str(STOP_AT))
    (out / "checkpoints" / "latest").write_text(str(STOP_AT))
    if strip_count:
        for rank in range(RANKS):
            path = ckpt.rank_state_path(out, str(STOP_AT), rank)
            state = torch.load(path, weights_only=True)
            assert state.pop("samples") == run["counts"][STOP_AT]
            torch.save(state, path)
        tag = str(STOP_AT)
        ckpt.write_completion(out, tag, STOP_AT, RANKS, ckpt.describe_files(out, tag, ckpt.tag_files(out, tag)))
    assert launch(run["cfg"](out, resume=True), nproc=RANKS) == 0


@pytest.mark.slow
def test_packed_two_rank_run_counts_sequences_and_resumes_exactly(packed_run, tmp_path):
    from tests.pretrain.test_mllog import check

    main, counts, interval = packed_run["main"], packed_run["counts"], packed_run["interval"]
    losses = _losses(main)
    assert sorted(losses) == list(range(1, STEPS + 1)) and all(v == v for v in losses.values())
    summary = json.loads((main / "summary.json").read_text())
    assert summary["data_layout"] == "packed-habana" and summary["steps"] == STEPS
    assert summary["train_samples"] == counts[STEPS]
    assert summary["training_sequences_per_second"] == pytest.approx(counts[STEPS] / summary["raw_train_time"])
    assert summary["training_rows_per_second"] == pytest.approx(STEPS * GLOBAL / summary["raw_train_time"])
    assert summary["training_real_sequences_per_second"] == pytest.approx(summary["training_sequences_per_second"])
    assert summary["training_real_tokens_per_second"] > 300 * summary["training_real_sequences_per_second"] / 2
    assert json.loads((main / "config.json").read_text())["train"]["packed"] is True
    launcher = (main / "launcher.log").read_text()
    assert "packed rows: attention varlen:split_varlen" in launcher
    assert f"eval every {interval} sequences" in launcher
    rate = packed_run["mean"]
    assert f"packed rows: MLPerf global batch {round(GLOBAL * rate)} sequences = {GLOBAL} packs x {rate:.4g} " \
           "sequences a pack" in launcher and "packed_metadata.json avg_seq_per_sample" in launcher
    assert summary["mlperf_global_batch"] == round(GLOBAL * rate) and summary["average_packing_rate"] == rate

    # metrics: samples = sequences, rows = packs; seq/s in sequences
    records = read_metrics(main / "metrics.jsonl")
    train = [r for r in records if "loss" in r]
    assert [r["samples"] for r in train] == counts[1:] and [r["rows"] for r in train] == \
        [s * GLOBAL for s in range(1, STEPS + 1)]
    assert all(r["seq_per_s"] == pytest.approx((counts[r["step"]] - counts[r["step"] - 1]) / r["step_time"])
               for r in train)
    # the attention kernel that ran (CPU: one SDPA per sequence) and the loader's wait per step
    assert all(r["attention"] == "varlen:split_varlen" and 0 <= r["loader_wait"] < r["step_time"] for r in train)
    assert summary["packed_attention"] == "varlen:split_varlen"
    assert 0 <= summary["loader_wait_per_step"] < summary["raw_train_time"] / STEPS

    # evals: where the sequence count reaches the interval (and the last step); rows would reach it later
    by_sequences = [s for s in range(1, STEPS + 1) if crosses_multiple(counts[s - 1], counts[s], interval)]
    by_rows = [s for s in range(1, STEPS + 1) if crosses_multiple((s - 1) * GLOBAL, s * GLOBAL, interval)]
    assert by_sequences[0] == STOP_AT and STOP_AT not in by_rows
    eval_steps = sorted(set(by_sequences) | {STEPS})
    assert [r["step"] for r in records if "eval_mlm_accuracy" in r] == eval_steps

    # the MLPerf log: MLCommons' checker passes it (open division), and every count is in sequences
    rc, out, warnings = check(main / "mllog.txt", tmp_path)
    assert rc == 0 and "SUCCESS" in out and not warnings, out
    recs = _mllog(main)
    value = {r["key"]: r["value"] for r in recs if r["key"] in ("train_samples", "global_batch_size")}
    # MLPerf's global batch in sequences, as NVIDIA logs packed runs: packs x the rate the data records
    assert value == {"train_samples": counts[STEPS], "global_batch_size": round(GLOBAL * packed_run["mean"])}
    assert [r["metadata"]["epoch_num"] for r in recs if r["key"] == "eval_accuracy"] == [counts[s] for s in eval_steps]
    assert [r["metadata"]["first_epoch_num"] for r in recs if r["key"] == "block_start"] == \
        [0] + [counts[s] for s in eval_steps[:-1]]
    assert [r["metadata"]["samples_count"] for r in recs if r["key"] == "block_stop"] == [counts[s] for s in eval_steps]
    assert [r["metadata"]["samples_count"] for r in recs if r["key"] in ("epoch_start", "epoch_stop")] == \
        [0, counts[STEPS]]
    assert recs[-1]["key"] == "run_stop" and recs[-1]["metadata"]["epoch_num"] == counts[STEPS]

    # resume at step 3: same losses bit for bit, and the count goes on from the checkpoint's
    resumed = tmp_path / "resumed"
    _resume_from_copy(packed_run, resumed)
    got = _losses(resumed)
    assert sorted(got) == list(range(STOP_AT + 1, STEPS + 1))
    assert [got[s] for s in got] == [losses[s] for s in got]  # bit for bit: data position + RNG restored
    again = [r for r in read_metrics(resumed / "metrics.jsonl") if "loss" in r]
    assert [r["samples"] for r in again] == counts[STOP_AT + 1:]
    recs = _mllog(resumed)
    assert [r["metadata"]["samples_count"] for r in recs if r["key"] == "epoch_start"] == [counts[STOP_AT]]
    assert [r["metadata"]["first_epoch_num"] for r in recs if r["key"] == "block_start"][0] == counts[STOP_AT]
    assert [r["value"] for r in recs if r["key"] == "train_samples"] == [counts[STEPS]]
    assert json.loads((resumed / "summary.json").read_text())["train_samples"] == counts[STEPS]


@pytest.mark.slow
def test_checkpoint_without_the_count_resumes_with_the_mean_sequences_per_pack(packed_run, tmp_path):
    counts = packed_run["counts"]
    out = tmp_path / "legacy"
    _resume_from_copy(packed_run, out, strip_count=True)
    estimate = round(STOP_AT * GLOBAL * packed_run["mean"])
    assert estimate != counts[STOP_AT]  # (else this test could not tell the estimate from the count)
    launcher = (out / "launcher.log").read_text()
    assert f"checkpoint {STOP_AT} predates the sequence count of packed runs" in launcher
    assert f"count as {estimate} sequences" in launcher
    train = [r for r in read_metrics(out / "metrics.jsonl") if "loss" in r]
    assert [r["samples"] for r in train] == [estimate + c - counts[STOP_AT] for c in counts[STOP_AT + 1:]]
    recs = _mllog(out)
    assert [r["value"] for r in recs if r["key"] == "train_samples"] == [estimate + counts[STEPS] - counts[STOP_AT]]
    assert _losses(out) == {s: v for s, v in _losses(packed_run["main"]).items() if s > STOP_AT}  # training as before
