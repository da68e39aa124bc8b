"""OUTPUT_DIR/mllog.txt: the run's MLPerf log (``:::MLLOG`` lines), written with MLCommons' ``mlperf_logging``.

    pip install "mlperf-logging==4.1.59"     # PyPI; in the `train` extra (the default install) and `mlperf`
    python -m mlperf_logging.compliance_checker --usage training --ruleset 5.0.0 OUTPUT_DIR/mllog.txt

Only rank 0 writes. The keys are the BERT benchmark's (training ruleset 5.0.0, ``closed_bert.yaml``):
the submission fields (``--mlperf-division/-org/-platform/-status``), cache_clear, init_start/stop,
run_start/stop (status success when the 0.720 masked-LM accuracy target was reached, else aborted), seed,
the batch, LAMB and schedule hyper-parameters, max_sequence_length, train_samples, eval_samples, one
block per eval interval (block_start/stop with first_epoch_num/epoch_count in training samples, as
MLPerf's BERT counts "epochs" in samples), eval_start/stop and eval_accuracy with epoch_num = samples
trained, and epoch_start/stop at the data sampler's epoch boundaries. Samples are sequences: a packed run
passes the sequences its packs held, summed over the ranks (pretrain/train.py), as NVIDIA's and Habana's
packed trainers count them; global_batch_size stays the configured batch in rows (packs). The warm-up keys record the run's
schedule (pretrain/recipe.py). Without ``mlperf_logging`` installed (a custom install without the ``train``
extra) the run logs one line saying so and writes no mllog.txt.

A resumed invocation starts a new mllog.txt (MLPerf timing covers one uninterrupted run); the previous
invocation's log is kept as ``mllog.to-step-<N>.txt``.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

LOG_NAME = "mllog.txt"
TARGET = 0.720
#: how to get the library (PyPI; the `train` and `mlperf` extras)
INSTALL_HINT = 'pip install "mlperf-logging==4.1.59", or ".[mlperf]" in a checkout'


class MLPerfLog:
    """Rank 0's MLPerf logger over ``output_dir/mllog.txt``; a no-op elsewhere or without the library."""

    def __init__(self, output_dir: str | Path, enabled: bool, resumed_from: str | None = None) -> None:
        self.enabled, self.path = False, Path(output_dir) / LOG_NAME
        self._mllog = self._logger = None
        self._block: int | None = None  # first sample of the open block
        self._epoch: int | None = None  # the open epoch
        if not enabled:
            return
        try:
            from mlperf_logging.mllog import mllog
        except ImportError:
            log.info("mlperf_logging is not installed: no %s (%s)", self.path, INSTALL_HINT)
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if resumed_from and self.path.exists():
            self.path.replace(self.path.with_name(f"mllog.to-step-{resumed_from}.txt"))
        logger = logging.getLogger(f"bertpipe.mllog.{id(self)}")  # file only: not on the launcher's stdout
        logger.propagate = False
        logger.setLevel(logging.INFO)
        self._handler = logging.FileHandler(self.path, mode="w", encoding="utf-8")
        logger.addHandler(self._handler)
        self._logger = logger
        root = str(Path(__file__).resolve().parents[1])  # metadata "file": pretrain/train.py
        self._mllog = mllog.MLLogger(logger=logger, root_dir=root)
        self.enabled = True

    # --- low level -------------------------------------------------------------------------------------------
    # stack_offset: each line's metadata names the first caller outside this module (pretrain/train.py)
    def event(self, key: str, value: Any = None, metadata: dict | None = None, time_ms: float | None = None):
        if self.enabled:
            self._mllog.event(key=key, value=value, metadata=metadata, time_ms=time_ms, stack_offset=_offset())

    def start(self, key: str, value: Any = None, metadata: dict | None = None, time_ms: float | None = None):
        if self.enabled:
            self._mllog.start(key=key, value=value, metadata=metadata, time_ms=time_ms, stack_offset=_offset())

    def end(self, key: str, value: Any = None, metadata: dict | None = None):
        if self.enabled:
            self._mllog.end(key=key, value=value, metadata=metadata, stack_offset=_offset())

    # --- the run's phases ------------------------------------------------------------------------------------
    def init_start(self, start_time_s: float) -> None:
        """cache_clear and init_start, dated at the process start."""
        self.event("cache_clear", True, time_ms=start_time_s * 1e3)
        self.start("init_start", time_ms=start_time_s * 1e3)

    def run_start(self, cfg, mcfg, world: int, device: str, global_batch: int, gas: int, optimizer,
                  eval_samples: int, samples: int, epoch: int, schedule=None) -> None:
        """Submission fields, hyper-parameters, init_stop, run_start and the first epoch.

        ``schedule``: the run's :class:`pretrain.recipe.ScheduleSpec` (default: the flags'): the warm-up steps and
        start_warmup_step it runs (mlperf convention: MLPerf's integers; habana: the step where the warm-up ends,
        start 0).
        """
        if not self.enabled:
            return
        from pretrain.recipe import schedule_spec

        spec = schedule or schedule_spec(cfg)
        for key, value in (("submission_benchmark", "bert"), ("submission_division", cfg.mlperf_division),
                           ("submission_org", cfg.mlperf_org),
                           ("submission_platform", cfg.mlperf_platform or f"{world}x{device}"),
                           ("submission_status", cfg.mlperf_status)):
            self.event(key, value)
        group = optimizer_group(optimizer)
        betas = group.get("betas", (0.9, 0.999))
        warmup = spec.warmup_steps
        warmup = int(warmup) if float(warmup).is_integer() else float(warmup)
        for key, value in (("seed", cfg.seed), ("global_batch_size", global_batch),
                           ("gradient_accumulation_steps", gas), ("max_sequence_length", mcfg.max_position_embeddings),
                           ("opt_name", cfg.optimizer), ("opt_base_learning_rate", cfg.learning_rate),
                           ("opt_lamb_epsilon", group.get("eps", 1e-6)),
                           ("opt_learning_rate_training_steps", spec.total_steps),
                           ("opt_learning_rate_warmup_steps", warmup), ("num_warmup_steps", warmup),
                           ("start_warmup_step", spec.start_warmup_step), ("opt_lamb_beta_1", betas[0]),
                           ("opt_lamb_beta_2", betas[1]), ("opt_lamb_weight_decay_rate", cfg.weight_decay),
                           ("opt_lamb_learning_rate_decay_poly_power", spec.degree),
                           ("eval_samples", eval_samples)):
            self.event(key, value)
        self.end("init_stop")
        self.start("run_start")
        self.epoch(epoch, samples)

    def block(self, samples: int, count: int | None = None) -> None:
        """Open the block of training that starts at ``samples`` (closed by the next eval)."""
        if self.enabled and self._block is None:
            self._block = samples
            self.start("block_start", metadata={"first_epoch_num": samples, "epoch_count": max(1, count or 1),
                                                "samples_count": samples})

    def _close_block(self, samples: int) -> None:
        if self._block is not None:
            self.end("block_stop", metadata={"first_epoch_num": self._block, "samples_count": samples})
            self._block = None

    def epoch(self, epoch: int, samples: int) -> None:
        """Note the sampler's epoch: an epoch change closes the open one and opens the next."""
        if not self.enabled or epoch == self._epoch:
            return
        if self._epoch is not None:
            self.end("epoch_stop", metadata={"epoch_num": self._epoch, "samples_count": samples})
        self._epoch = epoch
        self.start("epoch_start", metadata={"epoch_num": epoch, "samples_count": samples})

    def eval_start(self, samples: int) -> None:
        """Close the open block and start an eval after ``samples`` training samples."""
        if self.enabled:
            self._close_block(samples)
            self.start("eval_start", metadata={"epoch_num": samples})

    def eval_stop(self, samples: int, accuracy: float) -> None:
        self.end("eval_stop", metadata={"epoch_num": samples})
        self.event("eval_accuracy", float(accuracy), metadata={"epoch_num": samples})

    def run_stop(self, samples: int, accuracy: float | None, epoch: int | None = None) -> None:
        """train_samples and run_stop (success when the 0.720 target was reached, else aborted)."""
        if not self.enabled:
            return
        self._close_block(samples)
        if self._epoch is not None:
            self.end("epoch_stop", metadata={"epoch_num": self._epoch, "samples_count": samples})
            self._epoch = None
        self.event("train_samples", samples)
        status = "success" if accuracy is not None and accuracy >= TARGET else "aborted"
        self.end("run_stop", metadata={"status": status, "epoch_num": samples})
        self.close()

    def close(self) -> None:
        if self.enabled:
            self._logger.removeHandler(self._handler)
            self._handler.close()
            self.enabled = False


def _offset() -> int:
    """mllog's stack offset that skips this module's frames (mllog counts from its own logging method)."""
    frame, ours = sys._getframe(1), 0
    while frame is not None and frame.f_code.co_filename == __file__:
        frame, ours = frame.f_back, ours + 1
    return ours + 1


def optimizer_group(optimizer) -> dict:
    """The optimizer's first weight-decay group (else its first group): betas, eps."""
    groups = list(getattr(optimizer, "param_groups", None) or [{}])
    return next((g for g in groups if g.get("weight_decay", 0) > 0), groups[0])
