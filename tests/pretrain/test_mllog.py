"""OUTPUT_DIR/mllog.txt: MLCommons' compliance checker (training ruleset 5.0.0) on a tiny CPU run's log.

The run (tests/pretrain/conftest.py ``vocab_run``: 2 ranks, 6 steps, evals at steps 3 and 6) is made with
``--mlperf-division closed``: the checker must fail it on the 0.720 accuracy target and nothing else. The
open-division check runs on the same log with its submission_division line set to open (the only line the
flag changes; the flag itself is asserted on the closed log), and the slow test makes a real open run
through ``bertpipe train``.
"""

from __future__ import annotations

import json
import logging
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mlperf_logging")

ACCURACY_CHECK = "Failed checks for eval_accuracy : (v['value'] >= 0.720) and v['value'] < 1.0"


def records(log: Path) -> list[dict]:
    lines = log.read_text().splitlines()
    assert lines and all(line.startswith(":::MLLOG ") for line in lines), lines[:3]
    return [json.loads(line[len(":::MLLOG "):]) for line in lines]


def check(log: Path, cwd: Path) -> tuple[int, str, list[str]]:
    """Run the checker (it writes compliance_checker.log into its cwd): (exit code, output, its warnings)."""
    r = subprocess.run([sys.executable, "-m", "mlperf_logging.compliance_checker", "--usage", "training",
                        "--ruleset", "5.0.0", str(log)], capture_output=True, text=True, cwd=cwd, timeout=300)
    out = r.stdout + r.stderr
    warnings = [w.strip() for w in re.findall(r"WARNING - (.*?)(?=\n(?:INFO|WARNING|ERROR) - |\Z)", out, re.S)]
    return r.returncode, out, warnings


def test_closed_division_fails_only_the_accuracy_target(vocab_run: Path, tmp_path: Path) -> None:
    log = vocab_run / "mllog.txt"
    rc, out, warnings = check(log, tmp_path)
    assert rc != 0 and "ERROR - FAILED" in out, out
    assert warnings == [ACCURACY_CHECK], out  # exactly one failing check: 0.720 not reached in 6 steps
    assert "training_5.0.0/closed_bert.yaml" in out  # the BERT rules were applied


def test_open_division_log_passes(vocab_run: Path, tmp_path: Path) -> None:
    text = (vocab_run / "mllog.txt").read_text()
    closed = '"key": "submission_division", "value": "closed"'
    assert text.count(closed) == 1
    (tmp_path / "open.txt").write_text(text.replace(closed, closed.replace("closed", "open")))
    rc, out, warnings = check(tmp_path / "open.txt", tmp_path)
    assert rc == 0 and "SUCCESS" in out and not warnings, out
    assert "training_5.0.0/open_bert.yaml" in out


def test_log_has_the_runs_values(vocab_run: Path) -> None:
    recs = records(vocab_run / "mllog.txt")
    first = {}
    for r in recs:
        first.setdefault(r["key"], r)
    value = {k: r["value"] for k, r in first.items()}
    train = json.loads((vocab_run / "config.json").read_text())["train"]  # the flags the fixture passed
    steps = train["max_steps"]
    assert value["submission_benchmark"] == "bert"
    assert (value["submission_division"], value["submission_org"], value["submission_platform"],
            value["submission_status"]) == ("closed", "TestOrg", "2xCPU-test", "research")
    assert value["submission_org"] == train["mlperf_org"] and value["submission_platform"] == train["mlperf_platform"]
    global_batch = 4 * 2  # micro-batch 4 x 2 ranks
    assert value["global_batch_size"] == global_batch and value["gradient_accumulation_steps"] == 1
    assert value["opt_base_learning_rate"] == 0.05 and value["opt_learning_rate_training_steps"] == steps
    assert value["seed"] == 12439 and value["max_sequence_length"] == 512 and value["eval_samples"] == 40
    assert value["opt_lamb_beta_1"] == 0.9 and value["opt_lamb_weight_decay_rate"] == 0.01
    assert value["train_samples"] == steps * global_batch
    keys = [r["key"] for r in recs]
    assert keys.count("run_start") == 1 and keys.count("init_start") == 1  # rank 0 only
    assert keys.index("init_stop") < keys.index("run_start") < keys.index("block_start")
    assert keys[-1] == "run_stop" and recs[-1]["metadata"]["status"] == "aborted"  # target not reached
    evals = [r for r in recs if r["key"] == "eval_accuracy"]
    assert [r["metadata"]["epoch_num"] for r in evals] == [3 * global_batch, 6 * global_batch]  # samples trained
    summary = json.loads((vocab_run / "summary.json").read_text())
    assert evals[-1]["value"] == pytest.approx(summary["final_eval_mlm_accuracy"])
    # padded rows: samples are rows (packed data counts sequences: tests/pretrain/test_packing_train.py)
    assert summary["train_samples"] == steps * global_batch and "training_rows_per_second" not in summary
    from pretrain.metrics import read_metrics

    train_records = [r for r in read_metrics(vocab_run / "metrics.jsonl") if "loss" in r]
    assert [r["samples"] for r in train_records] == [s * global_batch for s in range(1, steps + 1)]
    assert not any("rows" in r for r in train_records)
    assert summary["mllog"] == str(vocab_run / "mllog.txt")
    blocks = [r["metadata"]["first_epoch_num"] for r in recs if r["key"] == "block_start"]
    assert blocks == [0, 3 * global_batch]
    t = [r["time_ms"] for r in recs]
    assert t == sorted(t)
    assert {r["metadata"]["file"] for r in recs} == {"pretrain/train.py"}  # the call sites, repo-relative


def test_without_mlperf_logging_no_log_and_one_line(tmp_path: Path, monkeypatch, caplog) -> None:
    from pretrain.mlperf_log import MLPerfLog

    monkeypatch.setitem(sys.modules, "mlperf_logging", None)  # import fails as when not installed
    monkeypatch.setitem(sys.modules, "mlperf_logging.mllog", None)
    with caplog.at_level(logging.INFO, logger="pretrain.mlperf_log"):
        m = MLPerfLog(tmp_path, enabled=True)
    assert not m.enabled
    assert [r.getMessage() for r in caplog.records if "mlperf_logging is not installed" in r.getMessage()], \
        caplog.text
    m.init_start(0.0)
    m.eval_start(8)
    m.eval_stop(8, 0.5)
    m.run_stop(8, 0.5)
    assert not list(tmp_path.iterdir())


def test_other_ranks_write_nothing_and_a_resume_keeps_the_previous_log(tmp_path: Path) -> None:
    from pretrain.mlperf_log import MLPerfLog

    m = MLPerfLog(tmp_path, enabled=False)
    m.init_start(0.0)
    assert not m.enabled and not list(tmp_path.iterdir())
    first = MLPerfLog(tmp_path, enabled=True)
    first.init_start(1.0)
    first.run_stop(0, None)
    before = (tmp_path / "mllog.txt").read_text()
    assert '"key": "run_stop"' in before and '"status": "aborted"' in before
    resumed = MLPerfLog(tmp_path, enabled=True, resumed_from="20")
    resumed.init_start(2.0)
    resumed.close()
    assert (tmp_path / "mllog.to-step-20.txt").read_text() == before
    assert [r["key"] for r in records(tmp_path / "mllog.txt")] == ["cache_clear", "init_start"]


@pytest.mark.slow
def test_bertpipe_train_open_division_passes(shared_data: Path, tmp_path: Path) -> None:
    """A real open-division run through the CLI flags: the checker prints SUCCESS."""
    pytest.importorskip("deepspeed")
    golden = shared_data / "golden"
    out = tmp_path / "run"
    r = subprocess.run([sys.executable, "-m", "bertpipe", "train", "--train-dir", str(golden / "4bins"),
                        "--eval-file", str(golden / "eval_100.hdf5"), "--output-dir", str(out), "--nproc", "2",
                        "--device", "cpu", "--max-steps", "4", "--micro-batch", "4", "--eval-interval-steps", "2",
                        "--max-eval-samples", "24", "--checkpoint-interval", "0", "--no-tensorboard",
                        "--mlperf-division", "open", "--mlperf-org", "Open Org"],
                       capture_output=True, text=True, timeout=900, cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rc, text, warnings = check(out / "mllog.txt", tmp_path)
    assert rc == 0 and "SUCCESS" in text and not warnings, text
    value = {rec["key"]: rec["value"] for rec in records(out / "mllog.txt")}
    assert value["submission_division"] == "open" and value["submission_org"] == "Open Org"


def synthetic_padded_hdf5(path: Path, rows: int, seed: int, vocab_size: int = 1024) -> None:
    """A padded HDF5 file in the tfrecord-to-hdf5 layout with random rows (no reference data needed)."""
    import h5py
    import numpy as np

    rng = np.random.default_rng(seed)
    ids = np.zeros((rows, 512), np.int32)
    mask = np.zeros((rows, 512), np.int8)
    seg = np.zeros((rows, 512), np.int8)
    pos = np.zeros((rows, 76), np.int32)
    mlm = np.zeros((rows, 76), np.int32)
    for r in range(rows):
        n = int(rng.integers(16, 512))
        ids[r, :n] = rng.integers(104, vocab_size, n)
        ids[r, 0], ids[r, n - 1] = 101, 102
        mask[r, :n] = 1
        seg[r, n // 2:n] = 1
        k = max(1, n * 15 // 100)
        where = np.sort(rng.choice(np.arange(1, n - 1), size=min(k, 76, n - 2), replace=False))
        pos[r, :len(where)] = where
        mlm[r, :len(where)] = ids[r, where]
        ids[r, where] = 103  # [MASK]
    with h5py.File(path, "w") as h:
        for name, data in (("input_ids", ids), ("input_mask", mask), ("segment_ids", seg),
                           ("masked_lm_positions", pos), ("masked_lm_ids", mlm),
                           ("next_sentence_labels", rng.integers(0, 2, rows).astype(np.int8))):
            h.create_dataset(name, data=data)


@pytest.mark.slow
def test_open_division_log_of_a_run_without_shared_data_passes(tmp_path: Path) -> None:
    """A plain clone's case: data made here (no ../shared), 1 CPU rank, 3 steps with evals, `bertpipe train`'s
    default flags; MLCommons' checker from PyPI's mlperf-logging (training 5.0.0, open) passes the log."""
    pytest.importorskip("deepspeed")
    (tmp_path / "train").mkdir()
    synthetic_padded_hdf5(tmp_path / "train" / "part_0.hdf5", 96, seed=1)
    synthetic_padded_hdf5(tmp_path / "eval.hdf5", 32, seed=2)
    out = tmp_path / "run"
    env = {k: v for k, v in os.environ.items() if k != "BERTPIPE_SHARED"}
    r = subprocess.run([sys.executable, "-m", "bertpipe", "train", "--train-dir", str(tmp_path / "train"),
                        "--eval-file", str(tmp_path / "eval.hdf5"), "--output-dir", str(out), "--nproc", "1",
                        "--device", "cpu", "--vocab-size", "1024", "--max-steps", "3", "--micro-batch", "4",
                        "--eval-interval-steps", "2", "--checkpoint-interval", "0", "--no-tensorboard"],
                       capture_output=True, text=True, timeout=900, cwd=Path(__file__).resolve().parents[2], env=env)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rc, text, warnings = check(out / "mllog.txt", tmp_path)
    assert rc == 0 and "SUCCESS" in text and not warnings, text
    assert "training_5.0.0/open_bert.yaml" in text
    value = {rec["key"]: rec["value"] for rec in records(out / "mllog.txt")}
    assert value["submission_division"] == "open" and value["opt_learning_rate_training_steps"] == 3
    assert [rec["metadata"]["epoch_num"] for rec in records(out / "mllog.txt") if rec["key"] == "eval_accuracy"] \
        == [8, 12]  # after steps 2 and 3 (the last step always evaluates), in samples
