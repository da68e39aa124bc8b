"""Checkpoints: DeepSpeed's own files plus what exact resume needs and DeepSpeed does not keep.

Layout under ``OUTPUT_DIR/checkpoints/``::

    latest                          tag of the newest complete checkpoint (written last, by DeepSpeed)
    <step>/mp_rank_00_model_states.pt, *_optim_states.pt    DeepSpeed (weights, ZeRO fp32 partitions,
                                                            optimizer moments, lr scheduler)
    <step>/bertpipe_config.json     model config + run settings; a resume with another model is refused
    <step>/bertpipe_rank<r>.pt      per rank: RNG states and the data sampler's position (plain tensors
                                    and ints, read back with ``torch.load(weights_only=True)``)

Every file is read with ``torch.load(weights_only=True)``, DeepSpeed's too: its own loader passes
``weights_only=False`` (a full pickle load), so :func:`safe_deepspeed_loads` replaces it on the engine with
one that allows only the few plain DeepSpeed classes its checkpoints hold (:data:`DEEPSPEED_SAFE_GLOBALS`).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from core.errors import InputError

CONFIG_NAME = "bertpipe_config.json"
STATE_VERSION = 1


def checkpoint_dir(output_dir: str | Path) -> Path:
    return Path(output_dir) / "checkpoints"


def latest_tag(output_dir: str | Path) -> str | None:
    """The tag in ``checkpoints/latest``, or None when there is no complete checkpoint."""
    f = checkpoint_dir(output_dir) / "latest"
    if not f.is_file():
        return None
    tag = f.read_text().strip()
    return tag or None


def rank_state_path(output_dir: str | Path, tag: str, rank: int) -> Path:
    return checkpoint_dir(output_dir) / tag / f"bertpipe_rank{rank}.pt"


def write_run_config(output_dir: str | Path, tag: str, model_cfg: dict[str, Any], run: dict[str, Any]) -> None:
    """Rank 0: the model config and run settings next to DeepSpeed's files."""
    d = checkpoint_dir(output_dir) / tag
    d.mkdir(parents=True, exist_ok=True)
    (d / CONFIG_NAME).write_text(json.dumps({"model": model_cfg, "run": run}, indent=2, sort_keys=True))


def check_model_config(output_dir: str | Path, tag: str, model_cfg: dict[str, Any]) -> None:
    """Refuse to resume a checkpoint written for another model shape.

    Raises:
        InputError: naming the checkpoint and the differing fields.
    """
    path = checkpoint_dir(output_dir) / tag / CONFIG_NAME
    try:
        saved = json.loads(path.read_text())["model"]
    except (OSError, ValueError, KeyError) as exc:
        raise InputError(f"checkpoint {path.parent} has no readable {CONFIG_NAME} ({exc}); it was not "
                         "written by bertpipe train or is incomplete: remove it or use another --output-dir") from exc
    diffs = [f"{k}: checkpoint {saved.get(k)!r} vs this run {model_cfg.get(k)!r}"
             for k in sorted(set(saved) | set(model_cfg)) if saved.get(k) != model_cfg.get(k)]
    if diffs:
        raise InputError(f"checkpoint {path.parent} was written for another model config ({'; '.join(diffs)}); "
                         "resume it with the same --model/--model-config, or use another --output-dir")


def save_rank_state(output_dir: str | Path, tag: str, rank: int, step: int, rng: dict, data: dict) -> None:
    """Per-rank RNG + data position (``torch.save`` of plain tensors, ints and strings)."""
    import torch

    path = rank_state_path(output_dir, tag, rank)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save({"version": STATE_VERSION, "step": int(step), "rng": rng, "data": data}, tmp)
    tmp.replace(path)


def check_torch_file(path: str | Path) -> None:
    """Refuse a ``torch.save`` file that is cut off or damaged, cheaply: its zip central directory (at the
    end of the file) must be readable. A checkpoint truncated by a full disk or a kill fails here, naming it."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as z:
            z.namelist()
    except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
        raise InputError(f"{path} is truncated or damaged ({exc}); that checkpoint is incomplete: delete its "
                         "folder (or write an older tag into checkpoints/latest) and run again") from None


def check_checkpoint_files(output_dir: str | Path, tag: str) -> None:
    """Every ``.pt`` file of checkpoint ``tag`` is complete (see :func:`check_torch_file`)."""
    d = checkpoint_dir(output_dir) / tag
    files = sorted(d.glob("*.pt")) if d.is_dir() else []
    if not files:
        raise InputError(f"{d} holds no checkpoint files (*.pt); it is incomplete: delete it (or write an older "
                         "tag into checkpoints/latest) and run again")
    for p in files:
        check_torch_file(p)


def load_rank_state(output_dir: str | Path, tag: str, rank: int) -> dict[str, Any]:
    """Read what :func:`save_rank_state` wrote, with ``weights_only=True``."""
    import torch

    path = rank_state_path(output_dir, tag, rank)
    if not path.is_file():
        raise InputError(f"{path} is missing: the checkpoint was written by fewer ranks or is incomplete; "
                         "resume with the same number of ranks")
    check_torch_file(path)
    state = torch.load(path, weights_only=True)
    if state.get("version") != STATE_VERSION:
        raise InputError(f"{path}: unknown state version {state.get('version')!r} (expected {STATE_VERSION})")
    return state


#: DeepSpeed classes found in its ZeRO checkpoints (loss scaler, ZeRO stage enum, fp32 fragment address):
#: plain data, safe to rebuild. Anything else in a checkpoint makes the load fail.
DEEPSPEED_SAFE_GLOBALS = (
    ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
    ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
    ("deepspeed.utils.tensor_fragment", "fragment_address"),
)


def weights_only_load(path: str | Path, map_location: Any = None) -> Any:
    """``torch.load(weights_only=True)`` that also accepts :data:`DEEPSPEED_SAFE_GLOBALS`.

    A file with any other Python object (e.g. a crafted pickle) is refused with an InputError naming it.
    """
    import importlib

    import torch

    allowed = []
    for module, name in DEEPSPEED_SAFE_GLOBALS:
        try:
            allowed.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):  # another DeepSpeed release: that class is not needed
            pass
    check_torch_file(path)
    try:
        with torch.serialization.safe_globals(allowed):
            return torch.load(path, map_location=map_location, weights_only=True)
    except Exception as exc:
        if type(exc).__name__ == "UnpicklingError" or "Weights only load failed" in str(exc):
            first = str(exc).split("WeightsUnpickler error:")[-1].strip().splitlines()[0]
            raise InputError(f"{path}: refused to load: it holds objects other than tensors and plain data "
                             f"({first}); bertpipe loads checkpoints with torch.load(weights_only=True)") from None
        raise


def safe_deepspeed_loads(engine: Any) -> None:
    """Make ``engine.load_checkpoint`` read its files with :func:`weights_only_load` (no full pickle load)."""
    ce = getattr(engine, "checkpoint_engine", None)
    if ce is not None and hasattr(ce, "load"):
        ce.load = lambda path, map_location=None: weights_only_load(path, map_location)


def prune_checkpoints(output_dir: str | Path, keep: int) -> list[Path]:
    """Delete all but the ``keep`` newest numeric checkpoint tags (never the one ``latest`` names).

    Returns the deleted directories. ``keep <= 0`` keeps everything.
    """
    if keep <= 0:
        return []
    root = checkpoint_dir(output_dir)
    tags = sorted((int(p.name), p) for p in root.iterdir() if p.is_dir() and p.name.isdigit()) if root.is_dir() else []
    latest = latest_tag(output_dir)
    doomed = [p for _, p in tags[:-keep] if p.name != latest]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed
