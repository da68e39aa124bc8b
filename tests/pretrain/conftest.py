"""A real tiny training run shared by tests/pretrain/test_mllog.py and test_export_import.py (one launch).

2 CPU ranks (DeepSpeed, ZeRO-1, bf16), 6 steps of the tiny model on the golden 4 bins with an eval every 3
steps, trained with ``--vocab`` (a copy of MLPerf's vocab.txt: recorded, and the model's vocab_size) and the
closed division's MLPerf flags, so OUTPUT_DIR holds config.json, summary.json, mllog.txt and a checkpoint.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

MLPERF_FLAGS = dict(mlperf_division="closed", mlperf_org="TestOrg", mlperf_platform="2xCPU-test",
                    mlperf_status="research")  # (test_mllog.py asserts these values in the log)
VOCAB_RUN_STEPS = 6


@pytest.fixture(scope="session")
def vocab_run(shared_data: Path, tmp_path_factory) -> Path:
    """OUTPUT_DIR of the run (its vocab.txt copy is OUTPUT_DIR/../data/vocab.txt)."""
    pytest.importorskip("deepspeed")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path.home() / ".cache" / "torch_extensions"))
    from pretrain.launch import launch
    from pretrain.train_config import TrainConfig

    root = tmp_path_factory.mktemp("vocab_run")
    vocab = root / "data" / "vocab.txt"
    vocab.parent.mkdir()
    vocab.write_bytes((shared_data / "vocab.txt").read_bytes())
    golden = shared_data / "golden"
    out = root / "run"
    cfg = TrainConfig(train_dir=str(golden / "4bins"), eval_file=str(golden / "eval_100.hdf5"), output_dir=str(out),
                      model="tiny", max_steps=VOCAB_RUN_STEPS, device="cpu", learning_rate=0.05, micro_batch=4,
                      eval_interval_steps=3, max_eval_samples=40, checkpoint_interval=0, tensorboard=False,
                      vocab=str(vocab), **MLPERF_FLAGS)
    t0 = time.perf_counter()
    assert launch(cfg, nproc=2) == 0
    print(f"\n2-rank tiny run with --vocab, {VOCAB_RUN_STEPS} steps: {time.perf_counter() - t0:.1f} s wall")
    return out
