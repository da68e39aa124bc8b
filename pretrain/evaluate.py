"""Masked-LM accuracy on the eval HDF5 (MLPerf's quality metric, target 0.720; spec §12).

Accuracy is a micro-average: correctly predicted masked tokens / all masked tokens, summed over every
eval sample on every rank (as TF's ``tf.metrics.accuracy`` with ``masked_lm_weights``), never a mean of
per-batch accuracies. The eval file is small (eval_10k: 10,000 rows, ~30 MB padded), so each rank loads
its rows (``r, r+W, ...``) once and groups them by length bin, padding each batch only to its bin bound. A long
eval logs its progress every tenth of its batches on rank 0 (``eval: 63/625 batches (10%)``), so a run's logs
never go quiet for the whole of it.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from core.schema import BIN_BOUNDS, HDF5_FIELDS, SEQ_FEATURES
from pretrain.data import _open_h5, check_vocab, inspect_shard

MLPERF_TARGET_ACCURACY = 0.720
#: an eval of at least this many batches (on a rank) logs its progress ten times (rank 0)
PROGRESS_MIN_BATCHES = 20
log = logging.getLogger(__name__)


class EvalSet:
    """One rank's share of an eval HDF5 file, as length-binned numpy batches."""

    def __init__(self, path: Path | str, batch_size: int, rank: int = 0, world: int = 1,
                 vocab_size: int | None = None, max_samples: int | None = None) -> None:
        self.path = Path(path)
        if not self.path.is_file():
            from core.errors import InputError

            raise InputError(f"eval file {self.path} does not exist; pass the eval HDF5 (e.g. eval_10k.hdf5)")
        shard = inspect_shard(self.path, None)
        n = shard.rows if max_samples is None else min(shard.rows, max_samples)
        with _open_h5(self.path) as h:
            data = {k: np.asarray(h[k][:n]).astype(np.int64) for k in HDF5_FIELDS}
        if vocab_size is not None:
            check_vocab(data, vocab_size, f"eval file {self.path}")
        mine = np.arange(rank, n, world)
        self.data = {k: v[mine] for k, v in data.items()}
        self.total_rows = n
        self.batch_size = batch_size
        lengths = self.data["input_mask"].sum(axis=1)
        width = self.data["input_ids"].shape[1]
        bounds = [b for b in BIN_BOUNDS if b < width] + [width]
        self.groups = []
        lo = 0
        for b in bounds:
            idx = np.nonzero((lengths > lo) & (lengths <= b))[0]
            if len(idx):
                self.groups.append((b, idx))
            lo = b

    def __len__(self) -> int:
        return sum((len(idx) + self.batch_size - 1) // self.batch_size for _, idx in self.groups)

    def batches(self) -> Iterator[dict[str, np.ndarray]]:
        """Batches in a fixed order, 2-D fields sliced to the bin bound."""
        for bound, idx in self.groups:
            for i in range(0, len(idx), self.batch_size):
                sel = idx[i:i + self.batch_size]
                yield {k: (v[sel, :bound] if k in SEQ_FEATURES else v[sel])
                       for k, v in self.data.items()}


def evaluate(forward: Callable[[dict[str, np.ndarray]], tuple[float, float, float]], eval_set: EvalSet,
             all_reduce: Callable[[np.ndarray], np.ndarray] | None = None,
             should_stop: Callable[[], bool] | None = None) -> dict[str, float]:
    """Run ``forward`` (returns correct, count, loss-sum of one batch) over the set, summed over ranks.

    Returns ``eval_mlm_accuracy`` (micro-average over masked tokens), ``eval_masked_tokens`` and
    ``eval_loss`` (mean of the per-batch losses weighted by masked tokens). ``should_stop`` (a SIGTERM):
    checked before each batch; a rank that sees it stops its share early, and the one all-reduce tells
    every rank, which then returns ``{"eval_interrupted": True}`` instead of a (partial) result.
    """
    totals = np.zeros(4, dtype=np.float64)  # correct, count, loss sum, ranks interrupted
    n = len(eval_set)
    every = -(-n // 10) if n >= PROGRESS_MIN_BATCHES and os.environ.get("RANK", "0") == "0" else 0
    t0 = time.perf_counter()
    for i, batch in enumerate(eval_set.batches(), 1):
        if should_stop is not None and should_stop():
            totals[3] = 1.0
            break
        correct, count, loss = forward(batch)
        totals[:3] += (correct, count, loss * count)
        if every and i % every == 0 and i < n:  # a long eval says how far it is (rank 0: the run's logs)
            log.info("eval: %d/%d batches (%.0f%%), %.0f s; masked-LM accuracy so far (rank 0) %.4f", i, n,
                     100 * i / n, time.perf_counter() - t0, totals[0] / totals[1] if totals[1] else float("nan"))
    if all_reduce is not None:
        totals = all_reduce(totals)
    if totals[3] > 0:
        return {"eval_interrupted": True}
    correct, count, loss_sum = (float(x) for x in totals[:3])
    return {"eval_mlm_accuracy": correct / count if count else float("nan"),
            "eval_masked_tokens": count,
            "eval_loss": loss_sum / count if count else float("nan"),
            "eval_target": MLPERF_TARGET_ACCURACY}
