"""LAMB, LANS and AdamW written in plain PyTorch (DeepSpeed's fused Lamb needs CUDA).

All three keep their state in fp32 and work under DeepSpeed ZeRO-1/2 as "untested" optimizers
(``zero_allow_untested_optimizer``). Under ZeRO each param group is flattened and partitioned across
ranks, so the optimizer sees one flat tensor per group. After :func:`attach_zero_partitions` (train.py calls
it once the engine is built) LAMB/LANS still take each original parameter's norms ("per-tensor", the
default): the sums of squares of each parameter's fragment in this rank's partition are all-reduced over
the data-parallel group, so the update equals unsharded per-tensor LAMB/LANS to fp32 round-off.
``trust_ratio="per-group"`` instead takes the norms of each rank's whole partition of a group, which is what
Habana's BERT-1.5B/5B ZeRO runs do (without ZeRO both modes are per-tensor).

Those per-parameter sums of squares stay in float32 (Gaudi has no float64 tensors) and are compensated: each
fragment is summed in blocks of :data:`BLOCK` elements, the block sums are added pairwise keeping every
addition's rounding error (TwoSum, :func:`compensated_sum`), and the ranks' partial sums are gathered and added
the same way, in rank order, so every rank gets the same bits. The result is within 1e-6 (relative) of the
float64 sum (tests/pretrain/test_optim_fp32_sums.py); no tensor of this module is float64 unless the parameters
are (a float64 partition, as in the CPU unit tests, is summed in float64).

Formulas (g: gradient, w: weight, t: step, wd: weight decay, b1/b2: betas):

* LAMB (You et al. 2019, NVIDIA's NVLAMB variant): g /= clip (clip = ||g_all|| / max_grad_norm when
  above 1); m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; u = m^/(sqrt(v^)+eps) + wd w;
  w -= lr * ||w||/||u|| * u  (ratio 1 when either norm is 0). As NVLAMB's default, apex FusedLAMB and
  NVIDIA's BERT trainer, a group with wd = 0 (biases, LayerNorm) takes w -= lr * u (ratio 1);
  ``trust_ratio_no_decay=True`` applies the ratio to those groups too.
* LANS (Zheng et al. 2020, spec §13): g^ = g/(||g||+eps); m, v from g^; d_m = m^/(sqrt(v^)+eps) + wd w,
  d_g = g^/(sqrt(v^)+eps) + wd w; w -= lr ||w||/||d_m|| b1 d_m + lr ||w||/||d_g|| (1-b1) d_g.
  With ``adjust_step`` the bias correction uses t-1 for t > 1 (Habana's lans.py option; off by default).
* AdamW (Loshchilov & Hutter): w -= lr wd w; w -= lr m^/(sqrt(v^)+eps).

Multi-tensor updates: without ZeRO partitions (ZeRO-0, plain PyTorch) each group's parameters are updated
together with ``torch._foreach_*`` ops (one kernel per op for all of a group's tensors, and the per-tensor norms
of LAMB/LANS by ``torch._foreach_norm``): the same formulas, equal to the per-parameter loop to fp32 round-off
(tests/pretrain/test_optim_foreach.py: <= 1e-6). ``foreach=False`` (constructor) keeps the loop. Under ZeRO the
optimizer already sees one flat tensor per group; the per-parameter trust ratios of the partition are applied
with ``torch._foreach_mul_`` over the fragments' views.

Step count t: each param group counts its own steps (``group["step"]``, saved with the optimizer state),
one per ``step()`` call that updates it, so bias correction runs t = 1, 2, 3 ... under ZeRO-0/1/2 in fp32
and bf16. A ``step()`` whose gradients are all exactly zero before the first real step is DeepSpeed's
state-initialisation call (its FP16_UnfusedOptimizer, used for bf16 without ZeRO, makes one at
construction): it changes nothing and is not counted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

OPTIMIZERS = ("lamb", "lans", "adamw")
TRUST_RATIOS = ("per-tensor", "per-group")
#: Elements summed by one plain float32 reduction before the compensated pairwise sum takes over.
BLOCK = 256


def _two_sum(a: Tensor, b: Tensor) -> tuple[Tensor, Tensor]:
    """Knuth's TwoSum: ``s = fl(a + b)`` and the exact rounding error ``e`` (a + b = s + e), elementwise."""
    s = a + b
    bb = s - a
    return s, (a - (s - bb)) + (b - bb)


def compensated_sum(x: Tensor) -> Tensor:
    """The sum over the last dimension of a float32 tensor (bf16/fp16 upcast; float64 kept), accurate to about one
    rounding of that dtype.

    Pairwise: the columns are added two by two (log2(n) rounds); each addition's rounding error (TwoSum) is
    carried in a second tensor, added up the same way and folded in at the end. No wider dtype is used.
    """
    hi = _f32(x)
    lo = torch.zeros_like(hi)
    while hi.shape[-1] > 1:
        if hi.shape[-1] % 2:
            pad = hi.new_zeros((*hi.shape[:-1], 1))
            hi, lo = torch.cat([hi, pad], -1), torch.cat([lo, pad], -1)
        hi, err = _two_sum(hi[..., 0::2], hi[..., 1::2])
        lo = lo[..., 0::2] + lo[..., 1::2] + err
    if hi.shape[-1] == 0:
        return hi.new_zeros(hi.shape[:-1])
    return (hi + lo)[..., 0]


def fragment_sums_of_squares(t: Tensor, segments: tuple[tuple[int, int, int], ...]) -> Tensor:
    """sum(x * x) of each ``(index, start, numel)`` fragment of the flat float32 tensor ``t``: (len(segments),).

    Each fragment is cut into blocks of :data:`BLOCK` elements summed in float32, and the block sums are
    added with :func:`compensated_sum` (one padded matrix for all fragments).
    """
    rows = []
    for _, start, n in segments:
        x = t.narrow(0, start, n)
        full = n // BLOCK
        parts = []
        if full:
            m = x.narrow(0, 0, full * BLOCK).view(full, BLOCK)
            parts.append((m * m).sum(1))
        if n > full * BLOCK:
            tail = x.narrow(0, full * BLOCK, n - full * BLOCK)
            parts.append((tail * tail).sum().reshape(1))
        rows.append(torch.cat(parts) if parts else t.new_zeros(1))
    width = max(len(r) for r in rows)
    mat = torch.stack([torch.nn.functional.pad(r, (0, width - len(r))) for r in rows])
    return compensated_sum(mat)


def combine_ranks(partials: list[Tensor]) -> Tensor:
    """The ranks' partial sums (same shape each) added elementwise with :func:`compensated_sum`, in rank order."""
    return compensated_sum(torch.stack(partials, dim=-1))


def _trust_ratio(w_norm: Tensor, u_norm: Tensor) -> Tensor:
    """||w|| / ||u||, or 1 when either norm is zero (the layer then takes a plain lr-sized step)."""
    ok = (w_norm > 0) & (u_norm > 0)
    return torch.where(ok, w_norm / torch.where(ok, u_norm, torch.ones_like(u_norm)), torch.ones_like(w_norm))


def _f32(t: Tensor) -> Tensor:
    """``t`` in at least fp32 (bf16/fp16 are upcast, fp64 stays fp64)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


@dataclass(frozen=True)
class PartitionLayout:
    """Where the original parameters of one param group lie in this rank's flat partition.

    ``segments``: (index of the parameter in the group, start in the partition, numel) of every parameter
    fragment this rank holds; ``num_params``: parameters in the whole group (all ranks);
    ``process_group``: the data-parallel group whose ranks hold the other fragments (None: one process).
    """

    segments: tuple[tuple[int, int, int], ...]
    num_params: int
    process_group: Any = None

    def sum_squares(self, tensors: list[Tensor]) -> Tensor:
        """Per-parameter sums of squares of ``tensors`` (each a flat float32 partition), summed over the ranks:
        (len, num_params) float32, compensated (module docstring: no float64, within 1e-6 of it)."""
        dtype = torch.promote_types(tensors[0].dtype, torch.float32)  # float32 (float64 only if given float64)
        out = torch.zeros(len(tensors), self.num_params, dtype=dtype, device=tensors[0].device)
        if self.segments:
            index = torch.tensor([j for j, _, _ in self.segments], device=out.device)
            for k, t in enumerate(tensors):
                out[k].index_copy_(0, index, fragment_sums_of_squares(t.to(dtype), self.segments))
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            world = torch.distributed.get_world_size(self.process_group)
            if world > 1:  # gathered, then added in rank order: the same bits on every rank
                partials = [torch.empty_like(out) for _ in range(world)]
                torch.distributed.all_gather(partials, out, group=self.process_group)
                out = combine_ranks(partials)
        return out

    def scaled(self, t: Tensor, factors: Tensor) -> Tensor:
        """A copy of ``t`` with each parameter's fragment multiplied by its factor (padding kept as is)."""
        out = t.clone()
        if not self.segments:
            return out
        views = [out.narrow(0, start, n) for _, start, n in self.segments]
        picked = factors.to(out.dtype).index_select(0, torch.tensor([j for j, _, _ in self.segments],
                                                                    device=factors.device)).tolist()
        torch._foreach_mul_(views, picked)  # one multi-tensor op (the same fp32 factors as a loop)
        return out


class _Base(torch.optim.Optimizer):
    """Shared state handling: moments in at least fp32, a per-group step count, ZeRO partition layouts."""

    def __init__(self, params: Iterable, defaults: dict, foreach: bool = True) -> None:
        super().__init__(params, defaults)
        self._layouts: dict[Tensor, PartitionLayout] = {}
        self.trust_ratio = "per-tensor"
        self.foreach = foreach  # multi-tensor updates of the unpartitioned parameters (module docstring)

    def attach_partitions(self, layouts: dict[Tensor, PartitionLayout], trust_ratio: str = "per-tensor") -> None:
        """Use these layouts for these flat (ZeRO) partitions; see :func:`attach_zero_partitions`.

        Keyed by the flat tensor itself: DeepSpeed's ZeRO optimizer steps one group at a time, swapping
        ``param_groups`` for a one-group list, so group indices do not identify a group inside ``step``.
        """
        if trust_ratio not in TRUST_RATIOS:
            raise ValueError(f"trust_ratio must be one of {TRUST_RATIOS}, got {trust_ratio!r}")
        self._layouts, self.trust_ratio = dict(layouts), trust_ratio

    def _layout(self, p: Tensor) -> PartitionLayout | None:
        return self._layouts.get(p) if self.trust_ratio == "per-tensor" else None

    def _state(self, p: Tensor) -> dict:
        st = self.state[p]
        if not st:
            dtype = torch.promote_types(p.dtype, torch.float32)
            st["step"] = 0
            st["exp_avg"] = torch.zeros_like(p, dtype=dtype)
            st["exp_avg_sq"] = torch.zeros_like(p, dtype=dtype)
        return st

    def _group_step(self, group: dict) -> int:
        """The group's step count (an optimizer state saved before groups counted: its params' count)."""
        if "step" not in group:
            group["step"] = max((int(self.state[p]["step"]) for p in group["params"] if self.state.get(p)),
                                default=0)
        return group["step"]

    @staticmethod
    def _clip_factor(params: list[Tensor], max_grad_norm: float) -> float:
        if max_grad_norm <= 0 or not params:
            return 1.0
        norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(_f32(p.grad)) for p in params]))
        return max(float(norm) / max_grad_norm, 1.0)

    def _params_with_grad(self) -> list[Tensor]:
        return [p for g in self.param_groups for p in g["params"] if p.grad is not None]

    @staticmethod
    def _bias_corrections(group: dict, step: int, adjust: bool = False) -> tuple[float, float]:
        if not group.get("bias_correction", True):
            return 1.0, 1.0
        t = step - 1 if adjust and step > 1 else step
        b1, b2 = group["betas"]
        return 1.0 - b1**t, 1.0 - b2**t

    def _is_state_init_call(self, params: list[Tensor]) -> bool:
        """Before any real step, all-zero gradients: DeepSpeed creating the optimizer state.

        Never for ZeRO partitions (DeepSpeed 0.19.8 makes no such call there, and a rank whose partition
        happens to have only zero gradients must still take part in the norms' all-reduce).
        """
        if self._layouts or any(self._group_step(g) for g in self.param_groups) or not params:
            return False
        return not any(bool(p.grad.any()) for p in params)

    def step(self, closure=None):  # noqa: D102 (torch.optim signature)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        params = self._params_with_grad()
        if self._is_state_init_call(params):
            return loss
        clip = self._clip_factor(params, self.defaults.get("max_grad_norm", 0.0))
        with torch.no_grad():
            for group in self.param_groups:
                live = [p for p in group["params"] if p.grad is not None]
                if not live:
                    continue
                group["step"] = self._group_step(group) + 1
                many = []
                for p in live:
                    st = self._state(p)
                    st["step"] = group["step"]
                    layout = self._layout(p)
                    if layout is not None:
                        self._update_flat(p, st, group, clip, layout)
                    elif self.foreach:
                        many.append(p)
                    else:
                        self._update(p, st, group, clip)
                if many:
                    self._update_many(many, [self.state[p] for p in many], group, clip)
        return loss

    def _update(self, p: Tensor, st: dict, group: dict, clip: float) -> None:
        raise NotImplementedError

    def _update_many(self, params: list[Tensor], states: list[dict], group: dict, clip: float) -> None:
        for p, st in zip(params, states, strict=True):  # (subclasses: multi-tensor)
            self._update(p, st, group, clip)

    @staticmethod
    def _grads_weights(params: list[Tensor], clip: float) -> tuple[list[Tensor], list[Tensor]]:
        """fp32 gradients (divided by clip; never the .grad tensors themselves) and fp32 weights of ``params``."""
        grads = [_f32(p.grad) for p in params]  # (read only below)
        return (torch._foreach_div(grads, clip) if clip != 1.0 else grads), [_f32(p) for p in params]

    @staticmethod
    def _moments_many(states: list[dict], grads: list[Tensor], b1: float, b2: float) -> tuple[list, list]:
        m, v = [st["exp_avg"] for st in states], [st["exp_avg_sq"] for st in states]
        torch._foreach_mul_(m, b1)
        torch._foreach_add_(m, grads, alpha=1 - b1)
        torch._foreach_mul_(v, b2)
        torch._foreach_addcmul_(v, grads, grads, value=1 - b2)
        return m, v

    @staticmethod
    def _denominators(v: list[Tensor], bc2: float, eps: float) -> list[Tensor]:
        den = torch._foreach_div(v, bc2)
        torch._foreach_sqrt_(den)
        torch._foreach_add_(den, eps)
        return den

    @staticmethod
    def _norms(tensors: list[Tensor]) -> Tensor:
        return torch.stack(torch._foreach_norm(tensors))

    @staticmethod
    def _write(params: list[Tensor], new: list[Tensor]) -> None:
        torch._foreach_copy_(params, [n.to(p.dtype) for p, n in zip(params, new, strict=True)])

    def _update_flat(self, p: Tensor, st: dict, group: dict, clip: float, layout: PartitionLayout) -> None:
        self._update(p, st, group, clip)  # AdamW has no norms: a flat partition is just a tensor


class Lamb(_Base):
    """LAMB with global gradient-norm clipping (NVLAMB) and optional bias correction.

    ``trust_ratio_no_decay``: also apply the trust ratio to weight-decay-0 groups (NVLAMB's default and
    apex FusedLAMB don't; this was bertpipe's behaviour before).
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.01, bias_correction: bool = True,
                 max_grad_norm: float = 0.0, trust_ratio_no_decay: bool = False, foreach: bool = True) -> None:
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction,
                        max_grad_norm=max_grad_norm, trust_ratio_no_decay=trust_ratio_no_decay)
        super().__init__(params, defaults, foreach)

    def _update_many(self, params: list[Tensor], states: list[dict], group: dict, clip: float) -> None:
        b1, b2 = group["betas"]
        g, w = self._grads_weights(params, clip)
        m, v = self._moments_many(states, g, b1, b2)
        bc1, bc2 = self._bias_corrections(group, states[0]["step"])
        u = torch._foreach_div(m, bc1)
        torch._foreach_div_(u, self._denominators(v, bc2, group["eps"]))
        if group["weight_decay"]:
            torch._foreach_add_(u, w, alpha=group["weight_decay"])
        if self._plain(group):
            torch._foreach_mul_(u, group["lr"])
        else:
            ratio = _trust_ratio(self._norms(w), self._norms(u))
            torch._foreach_mul_(u, (group["lr"] * ratio).tolist())  # the loop's fp32 factors (one host sync)
        self._write(params, torch._foreach_sub(w, u))

    def _direction(self, p: Tensor, st: dict, group: dict, clip: float) -> tuple[Tensor, Tensor]:
        b1, b2 = group["betas"]
        g = _f32(p.grad) / clip
        w = _f32(p)
        st["exp_avg"].mul_(b1).add_(g, alpha=1 - b1)
        st["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
        bc1, bc2 = self._bias_corrections(group, st["step"])
        u = (st["exp_avg"] / bc1) / ((st["exp_avg_sq"] / bc2).sqrt() + group["eps"])
        if group["weight_decay"]:
            u.add_(w, alpha=group["weight_decay"])
        return w, u

    @staticmethod
    def _plain(group: dict) -> bool:
        return not group["weight_decay"] and not group.get("trust_ratio_no_decay", False)

    def _update(self, p: Tensor, st: dict, group: dict, clip: float) -> None:
        w, u = self._direction(p, st, group, clip)
        if self._plain(group):
            p.copy_(w - group["lr"] * u)
            return
        ratio = _trust_ratio(torch.linalg.vector_norm(w), torch.linalg.vector_norm(u))
        p.copy_(w - group["lr"] * ratio * u)

    def _update_flat(self, p: Tensor, st: dict, group: dict, clip: float, layout: PartitionLayout) -> None:
        w, u = self._direction(p, st, group, clip)
        if self._plain(group):
            p.copy_(w - group["lr"] * u)
            return
        sq = layout.sum_squares([w, u]).sqrt()
        ratio = _trust_ratio(sq[0], sq[1])
        p.copy_(w - group["lr"] * layout.scaled(u, ratio))


class Lans(_Base):
    """LANS (Habana's ``lans.py`` semantics, spec §13): normalised gradients, two trust-ratio terms."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.01, bias_correction: bool = True,
                 max_grad_norm: float = 0.0, adjust_step: bool = False, foreach: bool = True) -> None:
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        bias_correction=bias_correction, max_grad_norm=max_grad_norm, adjust_step=adjust_step)
        super().__init__(params, defaults, foreach)

    def _update_many(self, params: list[Tensor], states: list[dict], group: dict, clip: float) -> None:
        b1, b2 = group["betas"]
        eps, wd, lr = group["eps"], group["weight_decay"], group["lr"]
        g, w = self._grads_weights(params, clip)
        g_norm = self._norms(g)
        g_hat = torch._foreach_div(g, (g_norm + eps).tolist())  # (fp32 values: the loop's divisors)
        m, v = self._moments_many(states, g_hat, b1, b2)
        bc1, bc2 = self._bias_corrections(group, states[0]["step"], group["adjust_step"])
        denom = self._denominators(v, bc2, eps)
        d_m = torch._foreach_div(m, bc1)
        torch._foreach_div_(d_m, denom)
        d_g = torch._foreach_div(g_hat, denom)
        wd_w = torch._foreach_mul(w, wd)
        torch._foreach_add_(d_m, wd_w)
        torch._foreach_add_(d_g, wd_w)
        w_norm = self._norms(w)
        r_m = _trust_ratio(w_norm, self._norms(d_m))
        r_g = _trust_ratio(w_norm, self._norms(d_g))
        torch._foreach_mul_(d_m, (lr * r_m * b1).tolist())  # the loop's fp32 factors
        torch._foreach_mul_(d_g, (lr * r_g * (1 - b1)).tolist())
        new = torch._foreach_sub(w, d_m)
        torch._foreach_sub_(new, d_g)
        self._write(params, new)

    def _moments(self, g_hat: Tensor, st: dict, group: dict) -> Tensor:
        b1, b2 = group["betas"]
        st["exp_avg"].mul_(b1).add_(g_hat, alpha=1 - b1)
        st["exp_avg_sq"].mul_(b2).addcmul_(g_hat, g_hat, value=1 - b2)
        bc1, bc2 = self._bias_corrections(group, st["step"], group["adjust_step"])
        return bc1, (st["exp_avg_sq"] / bc2).sqrt() + group["eps"]

    def _update(self, p: Tensor, st: dict, group: dict, clip: float) -> None:
        b1 = group["betas"][0]
        eps, wd, lr = group["eps"], group["weight_decay"], group["lr"]
        g = _f32(p.grad) / clip
        g_hat = g / (torch.linalg.vector_norm(g) + eps)
        w = _f32(p)
        bc1, denom = self._moments(g_hat, st, group)
        d_m = (st["exp_avg"] / bc1) / denom + wd * w
        d_g = g_hat / denom + wd * w
        w_norm = torch.linalg.vector_norm(w)
        r_m = _trust_ratio(w_norm, torch.linalg.vector_norm(d_m))
        r_g = _trust_ratio(w_norm, torch.linalg.vector_norm(d_g))
        p.copy_(w - lr * r_m * b1 * d_m - lr * r_g * (1 - b1) * d_g)

    def _update_flat(self, p: Tensor, st: dict, group: dict, clip: float, layout: PartitionLayout) -> None:
        b1 = group["betas"][0]
        eps, wd, lr = group["eps"], group["weight_decay"], group["lr"]
        g = _f32(p.grad) / clip
        g_norm = layout.sum_squares([g])[0].sqrt()
        g_hat = layout.scaled(g, 1.0 / (g_norm + eps))
        w = _f32(p)
        bc1, denom = self._moments(g_hat, st, group)
        d_m = (st["exp_avg"] / bc1) / denom + wd * w
        d_g = g_hat / denom + wd * w
        sq = layout.sum_squares([w, d_m, d_g]).sqrt()
        r_m, r_g = _trust_ratio(sq[0], sq[1]), _trust_ratio(sq[0], sq[2])
        p.copy_(w - lr * b1 * layout.scaled(d_m, r_m) - lr * (1 - b1) * layout.scaled(d_g, r_g))


class AdamW(_Base):
    """Adam with decoupled weight decay (same results as ``torch.optim.AdamW``)."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.01, bias_correction: bool = True,
                 foreach: bool = True) -> None:
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction)
        super().__init__(params, defaults, foreach)

    def _update_many(self, params: list[Tensor], states: list[dict], group: dict, clip: float) -> None:
        b1, b2 = group["betas"]
        g = [_f32(p.grad) for p in params]
        w = torch._foreach_mul([_f32(p) for p in params], 1 - group["lr"] * group["weight_decay"])
        m, v = self._moments_many(states, g, b1, b2)
        bc1, bc2 = self._bias_corrections(group, states[0]["step"])
        step = torch._foreach_div(m, bc1)
        torch._foreach_mul_(step, group["lr"])  # lr * (m / bc1) / denom, the loop's order
        torch._foreach_div_(step, self._denominators(v, bc2, group["eps"]))
        self._write(params, torch._foreach_sub(w, step))

    def _update(self, p: Tensor, st: dict, group: dict, clip: float) -> None:
        b1, b2 = group["betas"]
        g = _f32(p.grad)
        w = _f32(p) * (1 - group["lr"] * group["weight_decay"])
        st["exp_avg"].mul_(b1).add_(g, alpha=1 - b1)
        st["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
        bc1, bc2 = self._bias_corrections(group, st["step"])
        denom = (st["exp_avg_sq"] / bc2).sqrt() + group["eps"]
        p.copy_(w - group["lr"] * (st["exp_avg"] / bc1) / denom)


def build_optimizer(name: str, param_groups: list[dict], lr: float, *, lamb_trust_ratio_no_decay: bool = False,
                    **kw) -> torch.optim.Optimizer:
    """The optimizer named on the command line ("lamb", "lans" or "adamw") over ``param_groups``.

    Bias correction counts t = 1, 2, 3 under every ZeRO stage (no ``adjust_step``: with DeepSpeed 0.19.8
    Habana's ``adjust_step=zero_enabled`` would make ZeRO runs count t = 1, 1, 2).
    """
    if name == "lamb":
        return Lamb(param_groups, lr=lr, trust_ratio_no_decay=lamb_trust_ratio_no_decay, **kw)
    if name == "lans":
        return Lans(param_groups, lr=lr, **kw)
    if name == "adamw":
        return AdamW(param_groups, lr=lr, **kw)
    raise ValueError(f"unknown optimizer {name!r}; choose from {', '.join(OPTIMIZERS)}")


def zero_partition_layouts(zero_optimizer) -> dict[int, PartitionLayout]:
    """The :class:`PartitionLayout` of each flat param group of a DeepSpeed ZeRO-1/2 (or BF16) optimizer.

    DeepSpeed links every original (bit16) parameter that has elements in this rank's fp32 partition to its
    fragment (``param._hp_mapping.hp_fragment_address``: start and numel within the partition); the group's
    parameters are ``bit16_groups[i]`` (``bf16_groups[i]`` for BF16_Optimizer) in param-group order.
    Empty when the optimizer does not partition (ZeRO-0: the base optimizer sees the parameters themselves).
    """
    groups = getattr(zero_optimizer, "bit16_groups", None) or getattr(zero_optimizer, "bf16_groups", None)
    if not groups:
        return {}
    pgs = getattr(zero_optimizer, "real_dp_process_group", None) or [None] * len(groups)
    layouts = {}
    for i, params in enumerate(groups):
        segments = []
        for j, lp in enumerate(params):
            mapping = getattr(lp, "_hp_mapping", None)
            if mapping is not None:
                addr = mapping.hp_fragment_address
                segments.append((j, int(addr.start), int(addr.numel)))
        layouts[i] = PartitionLayout(tuple(segments), len(params), pgs[i])
    return layouts


def attach_zero_partitions(engine, optimizer: torch.optim.Optimizer, trust_ratio: str = "per-tensor") -> int:
    """Give ``optimizer`` (ours, wrapped by ``engine``) the ZeRO partition layouts; returns the groups attached.

    Call after ``deepspeed.initialize``. A no-op (0) without partitioning or for an optimizer of another kind.
    """
    if not isinstance(optimizer, _Base):
        return 0
    layouts = zero_partition_layouts(getattr(engine, "optimizer", None))
    flat = {optimizer.param_groups[i]["params"][0]: lay for i, lay in layouts.items()
            if i < len(optimizer.param_groups) and len(optimizer.param_groups[i]["params"]) == 1}
    optimizer.attach_partitions(flat, trust_ratio)
    return len(flat)
