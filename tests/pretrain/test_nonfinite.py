"""A non-finite loss stops training before the optimizer step, naming the step and the batch."""

from __future__ import annotations

import math

import pytest
import torch

from pretrain.config import model_config
from pretrain.data import BinnedSampler, discover_shards
from pretrain.model import BertForPreTraining
from pretrain.train import NonFiniteLossError, check_finite, train_step


class FakeEngine:
    """The part of DeepSpeed's engine that train_step uses, around a real model."""

    def __init__(self, model):
        self.model, self.calls = model, []

    def __call__(self, **batch):
        self.calls.append("forward")
        return self.model(**batch)

    def backward(self, loss):
        self.calls.append("backward")
        loss.backward()

    def step(self):
        self.calls.append("step")


@pytest.fixture
def sampler(golden):
    return BinnedSampler(discover_shards(golden / "4bins"), micro_batch=2, rank=0, world=1, seed=1)


def test_finite_steps_run_forward_backward_step(sampler):
    engine = FakeEngine(BertForPreTraining(model_config("tiny")))
    r = train_step(engine, sampler, gas=2, step=1, device="cpu", mark_step=lambda: None)
    assert engine.calls == ["forward", "backward", "step"] * 2
    assert math.isfinite(r["loss"]) and r["samples"] == 4


def test_nan_weights_abort_before_backward_and_step(sampler):
    model = BertForPreTraining(model_config("tiny"))
    with torch.no_grad():
        model.nsp_head.weight.fill_(float("nan"))
    engine = FakeEngine(model)
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss nan at step 7 \(micro-step 1 of 3\), "
                                                 r"epoch 0 batch 0 \(bin \d+, files part_\d+_of_8\.hdf5"):
        train_step(engine, sampler, gas=3, step=7, device="cpu", mark_step=lambda: None)
    assert engine.calls == ["forward"]  # neither backward nor the optimizer step ran
    assert all(p.grad is None for p in model.parameters())


def test_check_finite_names_inf():
    check_finite(1.5, 3, 0, 1, "batch x")
    with pytest.raises(NonFiniteLossError, match=r"non-finite loss inf at step 3 \(micro-step 2 of 4\), batch x"):
        check_finite(float("inf"), 3, 1, 4, "batch x")
