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
    Lamb([p], lr=0.1, weight_decay=0.0, eps=EPS, trust_ratio_no_decay=True).step()
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
    Lamb([clipped], lr=0.1, weight_decay=0.0, max_grad_norm=1.0, trust_ratio_no_decay=True).step()
    Lamb([plain], lr=0.1, weight_decay=0.0, trust_ratio_no_decay=True).step()
    assert torch.allclose(clipped, plain, atol=1e-12)
    zero = _param([0.0, 0.0], [0.6, 0.8])  # ||w|| = 0: the trust ratio falls back to 1 (a plain lr step)
    Lamb([zero], lr=0.1, weight_decay=0.01, trust_ratio_no_decay=True).step()
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
    opt = build_optimizer("lans", [{"params": [p]}], lr=0.01)
    assert isinstance(opt, Lans) and opt.defaults["adjust_step"] is False  # t = 1, 2, 3 under every ZeRO stage
    opt.step()
    assert opt.state[p]["exp_avg"].dtype == torch.float32 and p.dtype == torch.bfloat16
    assert isinstance(build_optimizer("lamb", [{"params": [p]}], 0.1), Lamb)
    with pytest.raises(ValueError, match="unknown optimizer"):
        build_optimizer("sgd", [{"params": [p]}], 0.1)


def _lamb_by_hand(w, grads, lr, wd, ratio_applies):
    """NVLAMB (apex FusedLAMB's default): the trust ratio only where weight decay is on."""
    m, v = [0.0] * len(w), [0.0] * len(w)
    for t, g in enumerate(grads, start=1):
        m = [B1 * a + (1 - B1) * x for a, x in zip(m, g, strict=True)]
        v = [B2 * a + (1 - B2) * x * x for a, x in zip(v, g, strict=True)]
        u = [a / (1 - B1**t) / (math.sqrt(b / (1 - B2**t)) + EPS) + wd * x for a, b, x in zip(m, v, w, strict=True)]
        r = _norm(w) / _norm(u) if ratio_applies else 1.0
        w = [x - lr * r * a for x, a in zip(w, u, strict=True)]
    return w


def test_lamb_no_decay_group_takes_plain_lr_steps_by_default():
    grads = [[0.6, -0.8, 0.1], [0.3, 0.2, -0.5]]
    w0 = [1.0, -2.0, 0.5]
    for flag in (False, True):
        decay, plain = _param(w0, grads[0]), _param(w0, grads[0])
        opt = Lamb([{"params": [decay], "weight_decay": 0.01}, {"params": [plain], "weight_decay": 0.0}], lr=0.05,
                   eps=EPS, trust_ratio_no_decay=flag)
        opt.step()
        decay.grad, plain.grad = (torch.tensor(grads[1], dtype=torch.float64) for _ in range(2))
        opt.step()
        assert decay.detach().tolist() == pytest.approx(_lamb_by_hand(w0, grads, 0.05, 0.01, True), abs=1e-12)
        assert plain.detach().tolist() == pytest.approx(_lamb_by_hand(w0, grads, 0.05, 0.0, flag), abs=1e-12)
    # the ratio really matters here: ||w|| / ||u|| is far from 1
    assert _lamb_by_hand(w0, grads, 0.05, 0.0, True) != pytest.approx(_lamb_by_hand(w0, grads, 0.05, 0.0, False))
    assert build_optimizer("lamb", [{"params": [plain]}], 0.1).defaults["trust_ratio_no_decay"] is False
    assert build_optimizer("lamb", [{"params": [plain]}], 0.1,
                           lamb_trust_ratio_no_decay=True).defaults["trust_ratio_no_decay"] is True


@pytest.mark.parametrize("name", ["lamb", "lans", "adamw"])
def test_groups_count_steps_and_a_zero_gradient_state_init_call_is_ignored(name):
    p = _param([1.0, -2.0, 0.5], [0.0, 0.0, 0.0])
    opt = build_optimizer(name, [{"params": [p], "weight_decay": 0.01}], lr=0.05)
    opt.step()  # DeepSpeed's FP16_UnfusedOptimizer does this at construction
    assert p.detach().tolist() == [1.0, -2.0, 0.5] and "step" not in opt.state[p]
    assert opt.param_groups[0]["step"] == 0
    for t in (1, 2, 3):
        p.grad = torch.tensor([0.3, 0.2, -0.5], dtype=torch.float64) * t
        opt.step()
        assert opt.param_groups[0]["step"] == t and opt.state[p]["step"] == t
    p.grad.zero_()  # after a real step, a zero gradient is a real (weight-decay only) step
    before = p.detach().clone()
    opt.step()
    assert opt.param_groups[0]["step"] == 4 and not torch.equal(before, p.detach())
    # the count survives a state_dict round trip (DeepSpeed checkpoints the base optimizer's state_dict)
    q = _param([1.0, -2.0, 0.5], [0.3, 0.2, -0.5])
    opt2 = build_optimizer(name, [{"params": [q], "weight_decay": 0.01}], lr=0.05)
    opt2.load_state_dict(opt.state_dict())
    opt2.step()
    assert opt2.param_groups[0]["step"] == 5


def test_a_state_without_group_counts_resumes_from_the_param_counts():
    p = _param([1.0, -2.0, 0.5], [0.3, 0.2, -0.5])
    opt = Lans([p], lr=0.05)
    opt.step()
    opt.step()
    state = opt.state_dict()
    del state["param_groups"][0]["step"]  # a checkpoint written before groups counted
    q = _param([1.0, -2.0, 0.5], [0.3, 0.2, -0.5])
    opt2 = Lans([q], lr=0.05)
    opt2.load_state_dict(state)
    opt2.step()
    assert opt2.param_groups[0]["step"] == 3


@pytest.mark.parametrize(("name", "kw"), [("lamb", {}), ("lamb", {"lamb_trust_ratio_no_decay": True}), ("lans", {})])
def test_flat_partition_with_a_layout_equals_per_tensor_updates(name, kw):
    """One process: a flat tensor holding 3 parameters (+ padding) steps like the 3 tensors themselves."""
    from pretrain.optim import PartitionLayout

    torch.manual_seed(0)
    shapes = [(4, 3), (5,), (2, 2)]
    ws = [torch.randn(s, dtype=torch.float64) for s in shapes]
    grads = [[torch.randn(s, dtype=torch.float64) for s in shapes] for _ in range(3)]
    for wd in (0.01, 0.0):
        sep = [w.clone().requires_grad_() for w in ws]
        flat = torch.cat([w.flatten() for w in ws] + [torch.zeros(3, dtype=torch.float64)]).requires_grad_()
        opt_a = build_optimizer(name, [{"params": sep, "weight_decay": wd}], lr=0.05, **kw)
        opt_b = build_optimizer(name, [{"params": [flat], "weight_decay": wd}], lr=0.05, **kw)
        starts = [0, 12, 17]
        layout = PartitionLayout(tuple((j, s, w.numel()) for j, (s, w) in enumerate(zip(starts, ws, strict=True))), 3)
        opt_b.attach_partitions({flat: layout})
        for gs in grads:
            for p, g in zip(sep, gs, strict=True):
                p.grad = g.clone()
            flat.grad = torch.cat([g.flatten() for g in gs] + [torch.zeros(3, dtype=torch.float64)])
            opt_a.step()
            opt_b.step()
        got = torch.cat([p.detach().flatten() for p in sep])
        assert torch.allclose(flat.detach()[:21], got, atol=1e-12, rtol=0)
        assert torch.equal(flat.detach()[21:], torch.zeros(3, dtype=torch.float64))  # padding untouched
        # per-group: one ratio for the whole partition, another update
        flat2 = torch.cat([w.flatten() for w in ws] + [torch.zeros(3, dtype=torch.float64)]).requires_grad_()
        opt_c = build_optimizer(name, [{"params": [flat2], "weight_decay": wd}], lr=0.05, **kw)
        opt_c.attach_partitions({flat2: layout}, trust_ratio="per-group")
        flat2.grad = torch.cat([g.flatten() for g in grads[0]] + [torch.zeros(3, dtype=torch.float64)])
        opt_c.step()
        if name == "lans" or wd or kw:
            sep_one = [w.clone().requires_grad_() for w in ws]
            one = build_optimizer(name, [{"params": sep_one, "weight_decay": wd}], lr=0.05, **kw)
            for p, g in zip(sep_one, grads[0], strict=True):
                p.grad = g.clone()
            one.step()
            assert not torch.allclose(flat2.detach()[:21], torch.cat([p.detach().flatten() for p in sep_one]))
    with pytest.raises(ValueError, match="trust_ratio"):
        opt_b.attach_partitions({}, trust_ratio="per-layer")
