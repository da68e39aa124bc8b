"""Multi-tensor (torch._foreach_*) LAMB, LANS and AdamW steps equal the per-parameter loop (<= 1e-6 relative),
over several steps, with clipping, weight-decay-0 groups, bf16 parameters and ZeRO-style flat partitions."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")

from pretrain.optim import AdamW, Lamb, Lans, PartitionLayout  # noqa: E402

CASES = [(Lamb, {}), (Lamb, {"trust_ratio_no_decay": True}), (Lamb, {"max_grad_norm": 0.5}),
         (Lans, {}), (Lans, {"adjust_step": True, "max_grad_norm": 0.5}), (AdamW, {})]


def params(dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    shapes = [(64, 32), (32,), (128,), (16, 16, 3), (1,), (300,)]
    ps = [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in shapes]
    ps[4].data.zero_()  # a zero weight: trust ratio 1
    return ps


def run(opt_cls, kw, foreach: bool, dtype=torch.float32, steps: int = 4):
    ps = params(dtype)
    opt = opt_cls([{"params": ps[:4], "weight_decay": 0.01}, {"params": ps[4:], "weight_decay": 0.0}],
                  lr=1e-2, foreach=foreach, **kw)
    g = torch.Generator().manual_seed(1)
    for step in range(steps):
        for i, p in enumerate(ps):
            p.grad = (torch.randn(p.shape, generator=g) * (0.1 + i)).to(dtype)
            if step == 1 and i == 1:
                p.grad.zero_()  # a zero gradient (LANS: ||g|| = 0)
        opt.step()
    return ps, opt


def rel(a, b) -> float:
    return float((a.double() - b.double()).abs().max() / b.double().abs().max().clamp_min(1e-30))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("opt_cls", "kw"), CASES)
def test_foreach_equals_the_loop(opt_cls, kw, dtype):
    loop, opt_loop = run(opt_cls, kw, foreach=False, dtype=dtype)
    many, opt_many = run(opt_cls, kw, foreach=True, dtype=dtype)
    assert opt_many.foreach and not opt_loop.foreach
    for a, b in zip(many, loop, strict=True):
        assert rel(a.detach(), b.detach()) <= 1e-6
        sa, sb = opt_many.state[a], opt_loop.state[b]
        assert sa["step"] == sb["step"] == 4
        for k in ("exp_avg", "exp_avg_sq"):
            assert sa[k].dtype == torch.float32
            assert rel(sa[k], sb[k]) <= 1e-6


def test_foreach_is_the_default_and_grads_are_not_modified():
    ps = params()
    opt = Lamb(ps, lr=1e-2, max_grad_norm=0.1)
    grads = [torch.randn(p.shape) for p in ps]
    for p, g in zip(ps, grads, strict=True):
        p.grad = g.clone()
    opt.step()
    assert opt.foreach
    assert all(torch.equal(p.grad, g) for p, g in zip(ps, grads, strict=True))


@pytest.mark.parametrize("opt_cls", [Lamb, Lans])
def test_flat_partition_scaling_equals_the_loop(opt_cls):
    """The ZeRO path (one flat tensor, per-parameter trust ratios applied by _foreach_mul_ on fragments) against
    the per-parameter updates of the same tensors."""
    ps = params()
    flat = torch.nn.Parameter(torch.cat([p.detach().flatten() for p in ps]))
    segments, at = [], 0
    for j, p in enumerate(ps):
        segments.append((j, at, p.numel()))
        at += p.numel()
    opt_flat = opt_cls([flat], lr=1e-2)
    opt_flat.attach_partitions({flat: PartitionLayout(tuple(segments), len(ps))})
    opt_each = opt_cls(copy.deepcopy(ps), lr=1e-2)
    each = opt_each.param_groups[0]["params"]
    g = torch.Generator().manual_seed(2)
    for _ in range(3):
        grads = [torch.randn(p.shape, generator=g) for p in ps]
        flat.grad = torch.cat([x.flatten() for x in grads])
        for p, x in zip(each, grads, strict=True):
            p.grad = x.clone()
        opt_flat.step()
        opt_each.step()
    assert rel(flat.detach(), torch.cat([p.detach().flatten() for p in each])) <= 1e-6
