"""PolyWarmUp (spec §13) and the MLPerf eval interval (spec §12 table)."""

from __future__ import annotations

import pytest
import torch

from pretrain.schedule import (
    PolyWarmUpScheduler,
    eval_interval_steps,
    is_eval_step,
    mlperf_eval_interval_samples,
    poly_warmup_factor,
)


@pytest.mark.parametrize(
    ("step", "factor"),
    [(0, 0.0), (5, 0.5), (10, 1.0), (29, 1.0), (30, 1.0), (65, 0.5), (93, 0.1), (100, 0.0), (120, 0.0)],
)
def test_poly_warmup_by_hand(step, factor):
    # total 100, warm-up 10 %, constant 20 %: decay from progress 0.3 over the remaining 0.7
    assert poly_warmup_factor(step, 100, 0.1, 0.2, 1.0) == pytest.approx(factor)


def test_degree_two_decay():
    assert poly_warmup_factor(75, 100, 0.0, 0.5, 2.0) == pytest.approx(0.25)  # ((1-.75)/.5)^2


def test_scheduler_drives_the_optimizer_and_resumes():
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=2.0)
    sched = PolyWarmUpScheduler(opt, warmup=0.25, total_steps=8, constant=0.25)
    seen = []
    for _ in range(8):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    # step k uses f(k): warm-up ends at step 2 (progress 0.25), constant to step 4, linear decay to 0 at step 8
    assert seen == pytest.approx([1.0, 2.0, 2.0, 2.0, 1.5, 1.0, 0.5, 0.0])
    state = sched.state_dict()
    opt2 = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=2.0)
    sched2 = PolyWarmUpScheduler(opt2, warmup=0.25, total_steps=8, constant=0.25)
    sched2.load_state_dict(state)
    assert sched2.get_last_lr() == sched.get_last_lr()


@pytest.mark.parametrize(
    ("batch", "samples"),
    [(256, 150_000), (1024, 150_000), (1536, 150_000), (2048, 150_000), (3072, 175_000), (4096, 175_000),
     (8192, 225_000)],
)
def test_mlperf_eval_interval_table(batch, samples):
    assert mlperf_eval_interval_samples(batch) == samples


def test_eval_steps_cross_sample_multiples():
    steps = [s for s in range(1, 101) if is_eval_step(s, 4096, 175_000)]
    assert steps == [43, 86]  # 43 * 4096 = 176,128 >= 175,000; 86 * 4096 = 352,256 >= 350,000
    assert [s for s in range(1, 5) if is_eval_step(s, 8, 16)] == [2, 4]
    assert eval_interval_steps(4096) == pytest.approx(175_000 / 4096)
    with pytest.raises(ValueError):
        mlperf_eval_interval_samples(0)


@pytest.mark.parametrize(("total", "warmup", "constant", "degree"), [(100, 0.05, 0.25, 1.0), (40, 0.1, 0.0, 2.0),
                                                                      (7, 0.0, 0.0, 1.0)])
def test_step_k_uses_f_of_k(total, warmup, constant, degree):
    """The reference formula, written out: lr_k = base * f(k/total) for the k-th optimizer step (k = 1..total)."""
    def f(progress):
        if progress < warmup:
            return progress / warmup
        if progress < warmup + constant:
            return 1.0
        return max(0.0, (1 - progress) / (1 - warmup - constant)) ** degree

    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.5)
    sched = PolyWarmUpScheduler(opt, warmup=warmup, total_steps=total, constant=constant, degree=degree)
    for k in range(1, total + 1):
        assert opt.param_groups[0]["lr"] == pytest.approx(0.5 * f(k / total), abs=1e-15), k
        opt.step()
        sched.step()
    assert PolyWarmUpScheduler(torch.optim.SGD([p], lr=0.5), 0.05, 100).get_last_lr()[0] > 0  # step 1 is not lr 0
