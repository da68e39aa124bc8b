"""No float64 on Gaudi: the ZeRO per-tensor norm sums are compensated float32, within 1e-6 of float64.

``RefuseFloat64`` gives the CPU an HPU's dtype rule: every aten op that reads or makes a float64 tensor raises
(Gaudi has no float64 tensors). The optimizer's flat (ZeRO) updates and train.py's HPU reductions run under it.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from pretrain.optim import (
    BLOCK,
    PartitionLayout,
    build_optimizer,
    combine_ranks,
    compensated_sum,
    fragment_sums_of_squares,
)


class RefuseFloat64(TorchDispatchMode):
    """Tensors as on a Gaudi card: an op with a float64 input or output raises."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if kwargs.get("dtype") == torch.float64:
            raise RuntimeError(f"float64 requested by {func} (an HPU has no float64 tensors)")
        for t in tree_flatten((args, kwargs))[0]:
            if isinstance(t, torch.Tensor) and t.dtype == torch.float64:
                raise RuntimeError(f"float64 input to {func} (an HPU has no float64 tensors)")
        out = func(*args, **kwargs)
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.dtype == torch.float64:
                raise RuntimeError(f"float64 output of {func} (an HPU has no float64 tensors)")
        return out


def test_the_fake_hpu_refuses_float64():
    with RefuseFloat64():
        torch.zeros(3).sum()  # float32 is fine
        with pytest.raises(RuntimeError, match="no float64"):
            torch.zeros(3, dtype=torch.float64)
        with pytest.raises(RuntimeError, match="no float64"):
            torch.ones(2).to(torch.float64)


def test_fragment_sums_are_within_1e6_of_float64():
    g = torch.Generator().manual_seed(0)
    sizes = [1, BLOCK - 1, BLOCK, BLOCK + 1, 100_003, 4_000_000]
    uniform = torch.rand(sum(sizes), generator=g) + 0.5  # similar magnitudes: the hard case for a running sum
    wide = torch.randn(sum(sizes), generator=g) * torch.randn(sum(sizes), generator=g).mul(4).exp()
    starts = np.cumsum([0] + sizes[:-1]).tolist()
    segments = tuple((j, s, n) for j, (s, n) in enumerate(zip(starts, sizes, strict=True)))
    for t in (uniform, wide):
        with RefuseFloat64():
            got = fragment_sums_of_squares(t, segments)
        assert got.dtype == torch.float32
        for (_, s, n), value in zip(segments, got.tolist(), strict=True):
            ref = float((t[s:s + n].double() ** 2).sum())
            assert abs(value - ref) <= 1e-6 * ref, (n, value, ref)
    # a plain float32 running sum of the largest fragment is not that close: the test can fail
    sq = uniform[starts[-1]:].numpy() ** 2
    ref = float((uniform[starts[-1]:].double() ** 2).sum())
    assert abs(float(np.add.accumulate(sq)[-1]) - ref) > 1e-5 * ref


def test_compensated_sum_keeps_what_float32_rounds_away():
    x = torch.tensor([1e8] + [1.0] * 999 + [-1e8], dtype=torch.float32)
    assert float(x.sum()) != 999.0  # float32 loses the ones next to 1e8
    assert float(compensated_sum(x)) == 999.0
    # 64 ranks' partials (the cross-rank step): the same bits whatever the values' order of magnitude
    g = torch.Generator().manual_seed(1)
    partials = [torch.rand(3, 5, generator=g) * 10.0 ** (i % 9) for i in range(64)]
    got = combine_ranks(partials)
    ref = torch.stack([p.double() for p in partials]).sum(0)
    assert got.shape == (3, 5) and torch.allclose(got.double(), ref, rtol=1e-7, atol=0)
    assert float(compensated_sum(torch.zeros(0))) == 0.0


@pytest.mark.parametrize(("name", "kw"), [("lamb", {}), ("lamb", {"lamb_trust_ratio_no_decay": True}), ("lans", {})])
def test_zero_flat_updates_run_under_hpu_dtype_rules(name, kw):
    """A flat float32 partition with its layout (ZeRO's view) steps under RefuseFloat64 and equals the float64
    per-tensor update of the same parameters to float32 round-off."""
    torch.manual_seed(0)
    shapes = [(40, 30), (50,), (600, 7)]
    ws = [torch.randn(s, dtype=torch.float64) for s in shapes]
    grads = [[torch.randn(s, dtype=torch.float64) for s in shapes] for _ in range(3)]
    n = sum(w.numel() for w in ws)
    for wd in (0.01, 0.0):
        ref = [w.clone().requires_grad_() for w in ws]
        opt_ref = build_optimizer(name, [{"params": ref, "weight_decay": wd}], lr=0.05, **kw)
        flat = torch.cat([w.flatten() for w in ws] + [torch.zeros(5, dtype=torch.float64)]).float().requires_grad_()
        opt = build_optimizer(name, [{"params": [flat], "weight_decay": wd}], lr=0.05, **kw)
        starts = np.cumsum([0] + [w.numel() for w in ws[:-1]]).tolist()
        opt.attach_partitions({flat: PartitionLayout(tuple((j, s, w.numel()) for j, (s, w) in enumerate(
            zip(starts, ws, strict=True))), len(ws))})
        for gs in grads:
            for p, gr in zip(ref, gs, strict=True):
                p.grad = gr.clone()
            opt_ref.step()
            flat.grad = torch.cat([gr.flatten() for gr in gs] + [torch.zeros(5, dtype=torch.float64)]).float()
            with RefuseFloat64():
                opt.step()
        want = torch.cat([p.detach().flatten() for p in ref])
        assert torch.allclose(flat.detach()[:n].double(), want, rtol=0, atol=1e-6), name
        assert torch.equal(flat.detach()[n:], torch.zeros(5))


def test_hpu_reductions_in_train_use_float32(monkeypatch, shared_data):
    """train.py's HPU choice (pretrain.devices.has_float64 -> False) on a CPU that refuses float64 like an HPU:
    the loss mean over ranks and an eval run; the CPU itself keeps float64 sums."""
    import pretrain.devices
    from pretrain import train
    from pretrain.config import model_config
    from pretrain.evaluate import EvalSet
    from pretrain.model import BertForPreTraining

    assert train._reduce_dtype("cpu") == torch.float64 and train._reduce_dtype("hpu") == torch.float32
    assert not pretrain.devices.has_float64("hpu:0") and pretrain.devices.has_float64(torch.device("cpu"))
    monkeypatch.setattr(pretrain.devices, "has_float64", lambda device: False)  # the HPU path, on this CPU
    torch.manual_seed(0)
    model = BertForPreTraining(model_config("tiny"))
    eval_set = EvalSet(shared_data / "golden" / "eval_100.hdf5", 8, max_samples=24)
    with RefuseFloat64():
        mean = train._mean_over_ranks({"loss": 2.5, "mlm_loss": 1.5}, "cpu")
        result = train.run_eval(model, eval_set, "cpu")
    assert mean == {"loss": 2.5, "mlm_loss": 1.5}
    assert result["eval_masked_tokens"] > 0 and 0.0 <= result["eval_mlm_accuracy"] <= 1.0
    monkeypatch.undo()
    with pytest.raises(RuntimeError, match="no float64"), RefuseFloat64():  # the CPU path does use float64
        train._mean_over_ranks({"loss": 2.5}, "cpu")
