"""LAMB, LANS and AdamW against steps computed by hand (scalar formulas, spec §13)."""

from __future__ import annotations

import math

import pytest
import torch

from pretrain.optim import AdamW, Lamb, Lans, build_optimizer

B1, B2, EPS = 0.9, 0.999, 1e-6


def _param(values, grad):
    p = torch.tensor(values, dtype=torch.float64, requires_grad=True)
    p.grad = torch.tensor(grad, dtype=torch.float64)
    return p


def _norm(xs):
    return math.sqrt(sum(x * x for x in xs))


def test_lamb_first_step_by_hand():
    p = _param([3.0, 4.0], [0.6, 0.8])
    Lamb([p], lr=0.1, weight_decay=0.0, eps=EPS).step()
    # m^ = g, v^ = g^2 -> u_i = g_i / (|g_i| + eps) ~ 1; trust ratio ||w|| / ||u|| = 5 / ~sqrt(2)
    u = [0.6 / (0.6 + EPS), 0.8 / (0.8 + EPS)]
    expected = [w - 0.1 * 5.0 / _norm(u) * ui for w, ui in zip([3.0, 4.0], u, strict=True)]
    assert p.detach().tolist() == pytest.approx(expected, abs=1e-12)
    assert expected == pytest.approx([2.6464466, 3.6464466], abs=1e-6)


def _lans_by_hand(w, grads, lr, wd, adjust):
    m, v = [0.0] * len(w), [0.0] * len(w)
    for t, g in enumerate(grads, start=1):
        gn = _norm(g)
        gh = [x / (gn + EPS) for x in g]
        m = [B1 * a + (1 - B1) * x for a, x in zip(m, gh, strict=True)]
        v = [B2 * a + (1 - B2) * x * x for a, x in zip(v, gh, strict=True)]
        tt = t - 1 if adjust and t > 1 else t
        bc1, bc2 = 1 - B1**tt, 1 - B2**tt
        den = [math.sqrt(a / bc2) + EPS for a in v]
        dm = [a / bc1 / d + wd * x for a, d, x in zip(m, den, w, strict=True)]
        dg = [a / d + wd * x for a, d, x in zip(gh, den, w, strict=True)]
        wn = _norm(w)
        rm, rg = wn / _norm(dm), wn / _norm(dg)
        w = [x - lr * rm * B1 * a - lr * rg * (1 - B1) * b for x, a, b in zip(w, dm, dg, strict=True)]
    return w


@pytest.mark.parametrize("adjust", [False, True])
def test_lans_two_steps_by_hand(adjust):
    grads = [[0.6, -0.8, 0.1], [0.3, 0.2, -0.5]]
    p = _param([1.0, -2.0, 0.5], grads[0])
    opt = Lans([p], lr=0.05, weight_decay=0.01, eps=EPS, adjust_step=adjust)
    opt.step()
    p.grad = torch.tensor(grads[1], dtype=torch.float64)
    opt.step()
    assert p.detach().tolist() == pytest.approx(_lans_by_hand([1.0, -2.0, 0.5], grads, 0.05, 0.01, adjust), abs=1e-12)


def test_lans_adjust_step_changes_the_second_step():
    out = []
    for adjust in (False, True):
        p = _param([1.0, -2.0, 0.5], [0.6, -0.8, 0.1])
        opt = Lans([p], lr=0.05, adjust_step=adjust)
        opt.step()
        p.grad = torch.tensor([0.3, 0.2, -0.5], dtype=torch.float64)
        opt.step()
        out.append(p.detach().clone())
    assert not torch.allclose(out[0], out[1])


def test_lamb_global_clipping_and_zero_weight_fallback():
    clipped = _param([3.0, 4.0], [1.2, 1.6])  # ||g|| = 2 > max_grad_norm 1 -> g / 2
    plain = _param([3.0, 4.0], [0.6, 0.8])
    Lamb([clipped], lr=0.1, weight_decay=0.0, max_grad_norm=1.0).step()
    Lamb([plain], lr=0.1, weight_decay=0.0).step()
    assert torch.allclose(clipped, plain, atol=1e-12)
    zero = _param([0.0, 0.0], [0.6, 0.8])  # ||w|| = 0: the trust ratio falls back to 1 (a plain lr step)
    Lamb([zero], lr=0.1, weight_decay=0.0).step()
    assert zero.detach().tolist() == pytest.approx([-0.1 * 0.6 / (0.6 + EPS), -0.1 * 0.8 / (0.8 + EPS)])


def test_adamw_matches_torch():
    torch.manual_seed(0)
    a = torch.randn(5, 3, dtype=torch.float64, requires_grad=True)
    b = a.detach().clone().requires_grad_()
    ours = AdamW([a], lr=0.01, weight_decay=0.1, eps=1e-8)
    ref = torch.optim.AdamW([b], lr=0.01, weight_decay=0.1, eps=1e-8)
    for _ in range(5):
        g = torch.randn(5, 3, dtype=torch.float64)
        a.grad, b.grad = g.clone(), g.clone()
        ours.step()
        ref.step()
    assert torch.allclose(a, b, atol=1e-12)


def test_bf16_params_keep_fp32_state_and_build_by_name():
    p = torch.nn.Parameter(torch.ones(4, dtype=torch.bfloat16))
    p.grad = torch.full((4,), 0.5, dtype=torch.bfloat16)
    opt = build_optimizer("lans", [{"params": [p]}], lr=0.01, zero_enabled=True)
    assert isinstance(opt, Lans) and opt.defaults["adjust_step"] is True
    opt.step()
    assert opt.state[p]["exp_avg"].dtype == torch.float32 and p.dtype == torch.bfloat16
    assert isinstance(build_optimizer("lamb", [{"params": [p]}], 0.1), Lamb)
    with pytest.raises(ValueError, match="unknown optimizer"):
        build_optimizer("sgd", [{"params": [p]}], 0.1)
