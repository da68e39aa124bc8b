"""LAMB, LANS and AdamW written in plain PyTorch (DeepSpeed's fused Lamb needs CUDA).

All three keep their state in fp32 and work under DeepSpeed ZeRO-1/2 as "untested" optimizers
(``zero_allow_untested_optimizer``). Under ZeRO each param group is flattened and partitioned across
ranks, so the per-tensor norms of LAMB/LANS become norms of each rank's partition of a group, exactly
as in Habana's BERT-1.5B/5B runs (LANS with ``adjust_step=zero_enabled``).

Formulas (g: gradient, w: weight, t: step, wd: weight decay, b1/b2: betas):

* LAMB (You et al. 2019, NVIDIA's NVLAMB variant): g /= clip (clip = ||g_all|| / max_grad_norm when
  above 1); m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; u = m^/(sqrt(v^)+eps) + wd w;
  w -= lr * ||w||/||u|| * u  (ratio 1 when either norm is 0).
* LANS (Zheng et al. 2020, spec §13): g^ = g/(||g||+eps); m, v from g^; d_m = m^/(sqrt(v^)+eps) + wd w,
  d_g = g^/(sqrt(v^)+eps) + wd w; w -= lr ||w||/||d_m|| b1 d_m + lr ||w||/||d_g|| (1-b1) d_g.
  With ``adjust_step`` the bias correction uses t-1 for t > 1.
* AdamW (Loshchilov & Hutter): w -= lr wd w; w -= lr m^/(sqrt(v^)+eps).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

OPTIMIZERS = ("lamb", "lans", "adamw")


def _trust_ratio(w_norm: Tensor, u_norm: Tensor) -> Tensor:
    """||w|| / ||u||, or 1 when either norm is zero (the layer then takes a plain lr-sized step)."""
    ok = (w_norm > 0) & (u_norm > 0)
    return torch.where(ok, w_norm / torch.where(ok, u_norm, torch.ones_like(u_norm)), torch.ones_like(w_norm))


def _f32(t: Tensor) -> Tensor:
    """``t`` in at least fp32 (bf16/fp16 are upcast, fp64 stays fp64)."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


class _Base(torch.optim.Optimizer):
    """Shared state handling: moments in at least fp32, a per-param step count."""

    def _state(self, p: Tensor) -> dict:
        st = self.state[p]
        if not st:
            dtype = torch.promote_types(p.dtype, torch.float32)
            st["step"] = 0
            st["exp_avg"] = torch.zeros_like(p, dtype=dtype)
            st["exp_avg_sq"] = torch.zeros_like(p, dtype=dtype)
        return st

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

    def step(self, closure=None):  # noqa: D102 (torch.optim signature)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        clip = self._clip_factor(self._params_with_grad(), self.defaults.get("max_grad_norm", 0.0))
        with torch.no_grad():
            for group in self.param_groups:
                for p in group["params"]:
                    if p.grad is not None:
                        self._update(p, group, clip)
        return loss

    def _update(self, p: Tensor, group: dict, clip: float) -> None:
        raise NotImplementedError


class Lamb(_Base):
    """LAMB with global gradient-norm clipping (NVLAMB) and optional bias correction."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.01, bias_correction: bool = True,
                 max_grad_norm: float = 0.0) -> None:
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        bias_correction=bias_correction, max_grad_norm=max_grad_norm)
        super().__init__(params, defaults)

    def _update(self, p: Tensor, group: dict, clip: float) -> None:
        st = self._state(p)
        st["step"] += 1
        b1, b2 = group["betas"]
        g = _f32(p.grad) / clip
        w = _f32(p)
        st["exp_avg"].mul_(b1).add_(g, alpha=1 - b1)
        st["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
        bc1, bc2 = self._bias_corrections(group, st["step"])
        u = (st["exp_avg"] / bc1) / ((st["exp_avg_sq"] / bc2).sqrt() + group["eps"])
        if group["weight_decay"]:
            u.add_(w, alpha=group["weight_decay"])
        ratio = _trust_ratio(torch.linalg.vector_norm(w), torch.linalg.vector_norm(u))
        p.copy_(w - group["lr"] * ratio * u)


class Lans(_Base):
    """LANS (Habana's ``lans.py`` semantics, spec §13): normalised gradients, two trust-ratio terms."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.01, bias_correction: bool = True,
                 max_grad_norm: float = 0.0, adjust_step: bool = False) -> None:
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay,
                        bias_correction=bias_correction, max_grad_norm=max_grad_norm, adjust_step=adjust_step)
        super().__init__(params, defaults)

    def _update(self, p: Tensor, group: dict, clip: float) -> None:
        st = self._state(p)
        st["step"] += 1
        b1, b2 = group["betas"]
        eps, wd, lr = group["eps"], group["weight_decay"], group["lr"]
        g = _f32(p.grad) / clip
        g_hat = g / (torch.linalg.vector_norm(g) + eps)
        w = _f32(p)
        st["exp_avg"].mul_(b1).add_(g_hat, alpha=1 - b1)
        st["exp_avg_sq"].mul_(b2).addcmul_(g_hat, g_hat, value=1 - b2)
        bc1, bc2 = self._bias_corrections(group, st["step"], group["adjust_step"])
        denom = (st["exp_avg_sq"] / bc2).sqrt() + eps
        d_m = (st["exp_avg"] / bc1) / denom + wd * w
        d_g = g_hat / denom + wd * w
        w_norm = torch.linalg.vector_norm(w)
        r_m = _trust_ratio(w_norm, torch.linalg.vector_norm(d_m))
        r_g = _trust_ratio(w_norm, torch.linalg.vector_norm(d_g))
        p.copy_(w - lr * r_m * b1 * d_m - lr * r_g * (1 - b1) * d_g)


class AdamW(_Base):
    """Adam with decoupled weight decay (same results as ``torch.optim.AdamW``)."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-6, weight_decay: float = 0.01, bias_correction: bool = True) -> None:
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction)
        super().__init__(params, defaults)

    def _update(self, p: Tensor, group: dict, clip: float) -> None:
        st = self._state(p)
        st["step"] += 1
        b1, b2 = group["betas"]
        g = _f32(p.grad)
        w = _f32(p) * (1 - group["lr"] * group["weight_decay"])
        st["exp_avg"].mul_(b1).add_(g, alpha=1 - b1)
        st["exp_avg_sq"].mul_(b2).addcmul_(g, g, value=1 - b2)
        bc1, bc2 = self._bias_corrections(group, st["step"])
        denom = (st["exp_avg_sq"] / bc2).sqrt() + group["eps"]
        p.copy_(w - group["lr"] * (st["exp_avg"] / bc1) / denom)


def build_optimizer(name: str, param_groups: list[dict], lr: float, *, zero_enabled: bool = False,
                    **kw) -> torch.optim.Optimizer:
    """The optimizer named on the command line ("lamb", "lans" or "adamw") over ``param_groups``.

    LANS gets ``adjust_step=zero_enabled`` as in Habana's run_pretraining.py.
    """
    if name == "lamb":
        return Lamb(param_groups, lr=lr, **kw)
    if name == "lans":
        return Lans(param_groups, lr=lr, adjust_step=zero_enabled, **kw)
    if name == "adamw":
        return AdamW(param_groups, lr=lr, **kw)
    raise ValueError(f"unknown optimizer {name!r}; choose from {', '.join(OPTIMIZERS)}")
