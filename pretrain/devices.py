"""Device selection: Gaudi (HPU) when ``habana_frameworks`` imports, else CUDA, else CPU.

The decision is a pure function of probe results (:func:`select_device`), so it is unit-tested here
without Habana's or NVIDIA's software: the probes (:func:`probe_hpu`, :func:`probe_cuda`) are the only
places that touch those packages, and they are called only when the caller does not inject results.

| kind | DeepSpeed accelerator (``DS_ACCELERATOR``) | torch.distributed backend | device            |
| ---- | ------------------------------------------ | ------------------------- | ----------------- |
| hpu  | ``hpu``                                    | ``hccl``                  | ``hpu``           |
| cuda | ``cuda``                                   | ``nccl``                  | ``cuda:<local>``  |
| cpu  | ``cpu``                                    | ``gloo``                  | ``cpu``           |

On HPU, lazy mode (``PT_HPU_LAZY_MODE`` unset or ``1``, the default of older Gaudi releases) needs
``htcore.mark_step()`` after ``backward`` and after ``step``; eager mode (``PT_HPU_LAZY_MODE=0``) may use
``torch.compile`` instead.
"""

from __future__ import annotations

import importlib
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass

log = logging.getLogger(__name__)

KINDS = ("auto", "hpu", "cuda", "cpu")
_BACKENDS = {"hpu": "hccl", "cuda": "nccl", "cpu": "gloo"}


@dataclass(frozen=True)
class DeviceChoice:
    """Where training runs."""

    kind: str
    """"hpu", "cuda" or "cpu"."""
    backend: str
    """torch.distributed backend: hccl / nccl / gloo."""
    lazy_mode: bool = False
    """HPU lazy mode (graph built until ``mark_step``); always False off HPU."""

    @property
    def accelerator(self) -> str:
        """The value of ``DS_ACCELERATOR`` that makes DeepSpeed pick the same device."""
        return self.kind

    def torch_device(self, local_rank: int = 0) -> str:
        """The torch device string of this rank."""
        return f"cuda:{local_rank}" if self.kind == "cuda" else self.kind


def has_float64(device) -> bool:  # noqa: ANN001 - a torch.device or its string
    """Whether tensors on ``device`` may be float64: not on Gaudi (HPU), which has no float64 tensors."""
    return not str(device).startswith("hpu")


def probe_hpu() -> bool:
    """True when Habana's PyTorch bridge imports (a Gaudi host)."""
    try:
        importlib.import_module("habana_frameworks.torch.core")
    except Exception:  # ImportError, or a broken install raising anything at import time
        return False
    return True


def probe_cuda() -> bool:
    """True when torch sees at least one CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def hpu_lazy_mode(env: Mapping[str, str] | None = None) -> bool:
    """Gaudi's lazy mode is on unless ``PT_HPU_LAZY_MODE`` is ``0``."""
    env = os.environ if env is None else env
    return env.get("PT_HPU_LAZY_MODE", "1").strip() != "0"


def select_device(requested: str = "auto", *, hpu_available: bool | None = None,
                  cuda_available: bool | None = None, env: Mapping[str, str] | None = None) -> DeviceChoice:
    """Choose the device: the flag when given, else HPU > CUDA > CPU by what is installed.

    Args:
        requested: "auto", "hpu", "cuda" or "cpu" (the ``--device`` flag). ``DS_ACCELERATOR`` in ``env``
            counts as a request when this is "auto".
        hpu_available: probe result injected by tests; probed with :func:`probe_hpu` when None.
        cuda_available: probe result injected by tests; probed with :func:`probe_cuda` when None.
        env: environment to read (``os.environ`` when None).

    Raises:
        ValueError: an unknown kind, or a requested device that is not available here.
    """
    env = os.environ if env is None else env
    if requested not in KINDS:
        raise ValueError(f"unknown device {requested!r}; choose from {', '.join(KINDS)}")
    if requested == "auto" and env.get("DS_ACCELERATOR", "") in _BACKENDS:
        requested = env["DS_ACCELERATOR"]
    if requested in ("auto", "hpu"):
        hpu = probe_hpu() if hpu_available is None else hpu_available
        if hpu:
            return DeviceChoice("hpu", "hccl", lazy_mode=hpu_lazy_mode(env))
        if requested == "hpu":
            raise ValueError("device 'hpu' requested but habana_frameworks does not import: install Intel "
                             "Gaudi's software stack (pip install .[hpu] documents it) or pass --device cpu")
    if requested in ("auto", "cuda"):
        cuda = probe_cuda() if cuda_available is None else cuda_available
        if cuda:
            return DeviceChoice("cuda", "nccl")
        if requested == "cuda":
            raise ValueError("device 'cuda' requested but torch sees no CUDA device; pass --device cpu")
    return DeviceChoice("cpu", "gloo")


@dataclass
class DeviceRuntime:
    """Per-process hooks of a device: the ``mark_step`` of HPU lazy mode, a no-op elsewhere."""

    choice: DeviceChoice
    mark_step: Callable[[], None]


def _noop() -> None:
    return None


def init_runtime(choice: DeviceChoice, local_rank: int = 0,
                 importer: Callable[[str], object] = importlib.import_module) -> DeviceRuntime:
    """Import the device's runtime modules and bind this process to its device.

    ``importer`` is injectable so tests can check the HPU path with fake modules.
    """
    if choice.kind == "hpu":
        htcore = importer("habana_frameworks.torch.core")
        importer("habana_frameworks.torch.distributed.hccl")  # registers the hccl backend
        return DeviceRuntime(choice, htcore.mark_step if choice.lazy_mode else _noop)
    if choice.kind == "cuda":
        import torch

        torch.cuda.set_device(local_rank)
    return DeviceRuntime(choice, _noop)


def maybe_compile(engine: object, choice: DeviceChoice, enabled: bool) -> bool:
    """``torch.compile`` the DeepSpeed engine when asked; never in HPU lazy mode."""
    if not enabled:
        return False
    if choice.kind == "hpu" and choice.lazy_mode:
        log.warning("--compile ignored: HPU lazy mode builds graphs itself (set PT_HPU_LAZY_MODE=0 to compile)")
        return False
    # DeepSpeed picks the accelerator's backend (hpu_backend on Gaudi, inductor elsewhere); static shapes
    # as in Habana's run (batches come in four bin shapes).
    engine.compile(compile_kwargs={"dynamic": False})
    return True
