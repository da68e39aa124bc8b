"""All training determinism in one place (style.md §8).

Rank rule: every RNG of rank ``r`` is seeded with ``seed + r`` (dropout differs across ranks, as in the
reference's ``seed + local_rank``). The data order does NOT use these RNGs: the sampler derives its own
generator from ``(seed, epoch)`` so that all ranks agree on the bin order (see pretrain/data.py).
"""

from __future__ import annotations

import os
import random
from collections.abc import MutableMapping
from typing import Any

import numpy as np

CUBLAS_WORKSPACE = ":4096:8"


def set_determinism(seed: int, rank: int, deterministic: bool, device: str, *, torch_mod: Any = None,
                    env: MutableMapping[str, str] | None = None) -> int:
    """Seed python, numpy and torch (and the device's RNG) with ``seed + rank``.

    Args:
        seed: the run's base seed.
        rank: global rank of this process.
        deterministic: strict mode: ``torch.use_deterministic_algorithms(True)``, cudnn deterministic and no
            benchmark, ``CUBLAS_WORKSPACE_CONFIG`` set (CUDA), deterministic ops on HPU.
        device: "cpu", "cuda" or "hpu".
        torch_mod: the torch module (tests pass a fake); imported when None.
        env: environment to update (``os.environ`` when None).

    Returns:
        The seed used on this rank.
    """
    import torch as real_torch

    torch_mod = real_torch if torch_mod is None else torch_mod
    env = os.environ if env is None else env
    rank_seed = int(seed) + int(rank)
    random.seed(rank_seed)
    np.random.seed(rank_seed % 2**32)
    torch_mod.manual_seed(rank_seed)
    if device == "cuda":
        torch_mod.cuda.manual_seed_all(rank_seed)
    elif device == "hpu" and hasattr(torch_mod, "hpu"):  # habana_frameworks registers torch.hpu
        seed_hpu = getattr(torch_mod.hpu, "manual_seed_all", None) or getattr(torch_mod.hpu, "manual_seed", None)
        if seed_hpu is not None:
            seed_hpu(rank_seed)
    if deterministic:
        if device == "cuda":
            env["CUBLAS_WORKSPACE_CONFIG"] = CUBLAS_WORKSPACE  # must be set before the first cuBLAS call
            torch_mod.backends.cudnn.deterministic = True
            torch_mod.backends.cudnn.benchmark = False
        torch_mod.use_deterministic_algorithms(True)
    return rank_seed


def rng_state(device: str = "cpu") -> dict[str, Any]:
    """This process's RNG states as plain tensors and ints (loadable with ``weights_only=True``)."""
    import torch

    version, mt, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": version, "mt": list(mt), "gauss": gauss},
        "numpy": {"name": name, "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "cached": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if device == "cuda":
        state["cuda"] = torch.cuda.get_rng_state_all()
    elif device == "hpu" and hasattr(getattr(torch, "hpu", None), "get_rng_state"):
        state["hpu"] = torch.hpu.get_rng_state()
    return state


def set_rng_state(state: dict[str, Any], device: str = "cpu") -> None:
    """Restore what :func:`rng_state` returned."""
    import torch

    py = state["python"]
    random.setstate((py["version"], tuple(py["mt"]), py["gauss"]))
    npst = state["numpy"]
    np.random.set_state((npst["name"], npst["keys"].numpy().astype(np.uint32), npst["pos"],
                         npst["has_gauss"], npst["cached"]))
    torch.set_rng_state(state["torch"])
    if device == "cuda" and "cuda" in state:
        torch.cuda.set_rng_state_all(state["cuda"])
    elif device == "hpu" and "hpu" in state:
        torch.hpu.set_rng_state(state["hpu"])
