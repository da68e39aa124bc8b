"""A long evaluation says how far it is (rank 0, about every tenth of its batches), a short one stays quiet."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from pretrain.evaluate import PROGRESS_MIN_BATCHES, evaluate


class _Set:
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def batches(self):
        for i in range(self.n):
            yield {"i": np.array([i])}


def _forward(batch) -> tuple[float, float, float]:
    return 1.0, 2.0, 0.5  # correct, masked tokens, loss


@pytest.mark.parametrize("n, lines", [(PROGRESS_MIN_BATCHES - 1, 0), (100, 9), (PROGRESS_MIN_BATCHES, 9)])
def test_progress_lines(n: int, lines: int, caplog, monkeypatch) -> None:
    monkeypatch.setenv("RANK", "0")
    with caplog.at_level(logging.INFO, logger="pretrain.evaluate"):
        r = evaluate(_forward, _Set(n))
    got = [rec.getMessage() for rec in caplog.records if rec.getMessage().startswith("eval: ")]
    assert len(got) == lines, got
    assert r["eval_mlm_accuracy"] == pytest.approx(0.5) and r["eval_masked_tokens"] == 2 * n
    if lines:
        every = -(-n // 10)
        assert got[0].startswith(f"eval: {every}/{n} batches (") and "masked-LM accuracy so far (rank 0) 0.5000" in got[0]


def test_other_ranks_stay_quiet(caplog, monkeypatch) -> None:
    monkeypatch.setenv("RANK", "1")
    with caplog.at_level(logging.INFO, logger="pretrain.evaluate"):
        evaluate(_forward, _Set(100))
    assert not [rec for rec in caplog.records if rec.getMessage().startswith("eval: ")]
