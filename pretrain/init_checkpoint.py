"""Start training from pretrained weights: ``bertpipe train --init-checkpoint PATH``.

The format is recognised from the path:

  tf           a TF1 checkpoint: its prefix (MLPerf's ``tf1_ckpt/model.ckpt-28252``), one of its files
               (``.index``, ``.data-00000-of-00001``) or its directory (see pretrain/tf_import.py)
  safetensors  ``FILE.safetensors`` with our tensor names, as ``bertpipe import-tf --out-safetensors`` writes
  hf           a transformers BertForPreTraining directory (config.json + model.safetensors, sharded or
               pytorch_model.bin), as ``bertpipe export-hf`` or ``import-tf --out-hf`` write

    from pretrain.init_checkpoint import load_init_checkpoint
    model = BertForPreTraining(config)
    load_init_checkpoint(model, "init.safetensors")    # each rank, before deepspeed.initialize

Only weights are loaded: the optimizer moments, step count, LR schedule and data order start fresh (MLPerf's
initial checkpoint is used that way). Every tensor of the model must come from the checkpoint with the same
shape, else :class:`InputError` names the tensor and both shapes; nothing is loaded partially. A run that
resumes from a checkpoint of its own ignores the init checkpoint (:func:`init_weights`).

:func:`check_init_checkpoint` is the launcher's cheap check (format, and for safetensors/transformers every
shape from the file headers, no tensor read); a TF checkpoint is checked by the ranks, which import TensorFlow.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from core.errors import InputError
from pretrain.config import BertConfig

log = logging.getLogger(__name__)

FORMATS = ("tf", "safetensors", "hf")
HF_WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                   "pytorch_model.bin.index.json")
_HF_LAYER = re.compile(r"^bert\.encoder\.layer\.(\d+)\.")
_VOCAB_SIZED = ("embeddings.word_embeddings.weight", "mlm_head.bias")
# config fields that change what the weights compute without changing any shape
_FUNCTIONAL = ("hidden_act", "layer_norm_large_model", "layer_norm_eps")
_NO_TF = ("init checkpoint {path} is a TF checkpoint, and reading one needs TensorFlow (pip install "
          "'bertpipe[tf]'); or convert it once where TensorFlow is installed: bertpipe import-tf {path} "
          "--config bert_config.json --out-safetensors init.safetensors, and pass init.safetensors")
_HELP = ("give a TF1 checkpoint prefix (model.ckpt-28252) or its directory, a .safetensors file from "
         "`bertpipe import-tf`, or a transformers directory from `bertpipe export-hf`")


def hf_weight_files(directory: str | Path) -> list[Path]:
    """The weight files of a transformers directory (the shards of an index), or [] when it has none."""
    d = Path(directory)
    for name in HF_WEIGHT_FILES:
        f = d / name
        if f.is_file():
            if name.endswith(".index.json"):
                try:
                    shards = sorted(set(json.loads(f.read_text())["weight_map"].values()))
                except (OSError, ValueError, KeyError, AttributeError) as e:
                    raise InputError(f"{f}: not a readable weight index ({e})") from e
                return [d / s for s in shards]
            return [f]
    return []


def checkpoint_format(path: str | Path) -> tuple[str, str]:
    """(format, the path to read) of an init checkpoint; see the module docstring.

    Raises:
        InputError: the path does not exist or is none of the three formats.
    """
    from pretrain.tf_import import resolve_tf_checkpoint

    p = Path(path)
    if p.is_file() and p.suffix == ".safetensors":
        return "safetensors", str(p)
    if p.is_dir() and (p / "config.json").is_file() and hf_weight_files(p):
        return "hf", str(p)
    if p.is_dir() and (p / "checkpoints").is_dir() and not any(p.glob("*.index")):
        raise InputError(f"init checkpoint {p} is a training run directory: export its weights with "
                         f"`bertpipe export-hf {p} HF_DIR` and pass HF_DIR, or continue it with --resume")
    if not p.exists() and not Path(f"{p}.index").is_file():
        raise InputError(f"init checkpoint {p} does not exist; {_HELP}")
    try:
        return "tf", resolve_tf_checkpoint(p)
    except InputError as e:
        raise InputError(f"init checkpoint {p} is not a checkpoint bertpipe reads ({e}); {_HELP}") from None


def _meta_like(shape: Any, dtype: torch.dtype = torch.float32) -> Tensor:
    return torch.empty(tuple(shape), dtype=dtype, device="meta")


def read_safetensors(path: str | Path, meta: bool = False) -> tuple[dict[str, Tensor], dict[str, str]]:
    """Tensors and metadata of a safetensors file; ``meta``: shapes only (meta tensors, nothing read)."""
    from safetensors import safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            if meta:
                return {k: _meta_like(f.get_slice(k).get_shape()) for k in f.keys()}, metadata
            return {k: f.get_tensor(k) for k in f.keys()}, metadata
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: not a readable safetensors file ({e})") from e
    except Exception as e:  # safetensors_rust.SafetensorError (header, truncation) is no OSError
        if type(e).__name__ != "SafetensorError":
            raise
        raise InputError(f"{path}: not a readable safetensors file ({e})") from e


def read_hf_state_dict(directory: str | Path, meta: bool = False) -> dict[str, Tensor]:
    """transformers' tensors of a directory (legacy LayerNorm gamma/beta renamed); ``meta``: shapes only."""
    from pretrain.checkpoint import weights_only_load

    files = hf_weight_files(directory)
    if not files:
        raise InputError(f"{directory} has no {' or '.join(HF_WEIGHT_FILES)}")
    state: dict[str, Tensor] = {}
    for f in files:
        if not f.is_file():
            raise InputError(f"{f} is missing (named by the directory's weight index)")
        if f.suffix == ".safetensors":
            part = read_safetensors(f, meta)[0]
        else:
            part = weights_only_load(f, map_location="meta" if meta else "cpu")
        state.update(part)
    return {k.replace("LayerNorm.gamma", "LayerNorm.weight").replace("LayerNorm.beta", "LayerNorm.bias"): v
            for k, v in state.items()}


def _saved_config(fmt: str, path: str, metadata: dict[str, str]) -> dict[str, Any]:
    """The model config the checkpoint records, when it records one (for warnings only)."""
    try:
        if fmt == "safetensors" and "bert_config" in metadata:
            return json.loads(metadata["bert_config"])
        if fmt == "hf":
            from pretrain.hf_export import CONFIG_NAME

            ours = Path(path) / CONFIG_NAME
            if ours.is_file():
                return json.loads(ours.read_text())
            hf = json.loads((Path(path) / "config.json").read_text())
            return {"hidden_act": hf.get("hidden_act"), "layer_norm_eps": hf.get("layer_norm_eps"),
                    "layer_norm_large_model": False}
    except (OSError, ValueError):
        pass
    return {}


def read_init_state(path: str | Path, config: BertConfig, *, meta: bool = False
                    ) -> tuple[dict[str, Tensor], str, dict[str, Any]]:
    """Our state dict (padded vocab) from a safetensors file or a transformers directory.

    Returns:
        (state, format, the config the checkpoint records or {}). TF checkpoints: see load_init_checkpoint.
    """
    from pretrain.hf_export import _strip_prefix, from_hf_state_dict, pad_vocab

    fmt, resolved = checkpoint_format(path)
    if fmt == "tf":
        raise ValueError("read_init_state reads safetensors and transformers checkpoints; TF: load_tf_checkpoint")
    if fmt == "safetensors":
        state, metadata = read_safetensors(resolved, meta)
        state = _strip_prefix(state)
        for name in _VOCAB_SIZED:  # unpadded (vocab_size rows) is accepted too
            t = state.get(name)
            if t is not None and t.shape[0] == config.vocab_size != config.padded_vocab_size:
                state[name] = pad_vocab(t, config, name)
        return state, fmt, _saved_config(fmt, resolved, metadata)
    hf_state = read_hf_state_dict(resolved, meta)
    layers = {int(m.group(1)) for k in hf_state if (m := _HF_LAYER.match(k))}
    if layers and len(layers) != config.num_hidden_layers:
        raise InputError(f"{resolved}: the checkpoint has {len(layers)} encoder layers (bert.encoder.layer.0.."
                         f"{max(layers)}) but the model's num_hidden_layers={config.num_hidden_layers}; "
                         "a checkpoint of another model config? check --model/--model-config")
    try:
        state = from_hf_state_dict(hf_state, config)
    except KeyError as e:
        raise InputError(f"{resolved}: has no tensor {e.args[0]!r} (not a BertForPreTraining checkpoint with "
                         f"{config.num_hidden_layers} layers? a BertModel without the cls.* heads does not do)") from None
    except InputError as e:  # a vocab-sized tensor of another vocab (pad_vocab)
        raise InputError(f"{resolved}: {e}") from None
    return state, fmt, _saved_config(fmt, resolved, {})


def check_state_dict(state: dict[str, Tensor], own: dict[str, tuple[int, ...]], config: BertConfig,
                     source: str) -> None:
    """Every tensor of the model present with its shape, and nothing else.

    Raises:
        InputError: naming the first missing, extra or mis-shaped tensor (with both shapes).
    """
    missing = [k for k in own if k not in state]
    if missing:
        raise InputError(f"{source}: has no tensor {missing[0]!r} ({len(missing)} of the model's {len(own)} "
                         "missing); a checkpoint of another model config?")
    extra = sorted(set(state) - set(own))
    if extra:
        raise InputError(f"{source}: has tensors the model does not, e.g. {extra[0]!r} ({len(extra)} in all); "
                         "a checkpoint of another model config?")
    for name, want in own.items():
        got = tuple(state[name].shape)
        if got == want:
            continue
        if name in _VOCAB_SIZED and got[1:] == want[1:]:
            raise InputError(f"{source}: {name} has shape {got} in the checkpoint but {want} in this run's model "
                             f"(vocab_size={config.vocab_size}, padded to {config.padded_vocab_size} rows): "
                             "another vocabulary; set --vocab-size/--model-config to the checkpoint's")
        raise InputError(f"{source}: {name} has shape {got} in the checkpoint but {want} in this run's model; "
                         "a checkpoint of another model config? check --model/--model-config")


def _warn_functional_differences(saved: dict[str, Any], config: BertConfig, source: str) -> None:
    def norm(key: str, value: Any) -> Any:  # transformers' gelu_new is our gelu_tanh too
        return "gelu_new" if key == "hidden_act" and value == "gelu_tanh" else value

    diffs = [f"{k}: checkpoint {saved[k]!r} vs this run {getattr(config, k)!r}" for k in _FUNCTIONAL
             if saved.get(k) is not None and norm(k, saved[k]) != norm(k, getattr(config, k))]
    if diffs:
        log.warning("%s: the weights fit, but were trained with another %s", source, "; ".join(diffs))


def _shapes(model: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def check_init_checkpoint(path: str | Path, config: BertConfig) -> str:
    """The launcher's check before any rank starts; returns the format.

    safetensors and transformers checkpoints: every shape, from the headers (no tensor is read). TF
    checkpoints: existence only (the ranks check the shapes; the launcher does not import TensorFlow).
    """
    fmt, _ = checkpoint_format(path)
    if fmt == "tf":
        import importlib.util

        if importlib.util.find_spec("tensorflow") is None:  # (not imported here)
            raise InputError(_NO_TF.format(path=path))
    else:
        from pretrain.tf_import import model_shapes

        state, fmt, _ = read_init_state(path, config, meta=True)
        check_state_dict(state, model_shapes(config), config, str(path))
    return fmt


def load_init_checkpoint(model: torch.nn.Module, path: str | Path) -> dict[str, Any]:
    """Fill `model` (our BertForPreTraining) with a checkpoint's weights, every shape checked first.

    Returns:
        {"path", "format", "tensors"}.

    Raises:
        InputError: missing or unrecognised checkpoint, or a tensor whose shape differs from the model's.
    """
    config: BertConfig = model.config
    fmt, resolved = checkpoint_format(path)
    if fmt == "tf":
        from pretrain.tf_import import load_tf_checkpoint

        try:
            n = load_tf_checkpoint(model, resolved)["loaded"]
        except ImportError as e:
            raise InputError(_NO_TF.format(path=path)) from e
    else:
        state, fmt, saved = read_init_state(resolved, config)
        check_state_dict(state, _shapes(model), config, str(path))
        _warn_functional_differences(saved, config, str(path))
        with torch.no_grad():
            model.load_state_dict(state, strict=True)
        n = len(state)
    log.info("initialised %d tensors from %s checkpoint %s", n, fmt, path)
    return {"path": str(path), "format": fmt, "tensors": n}


def init_weights(model: torch.nn.Module, path: str, resume_tag: str | None) -> dict[str, Any] | None:
    """`--init-checkpoint` in a run: load it, unless the run resumes from a checkpoint of its own.

    Returns:
        None without a path; else what the summary records: {"path", "loaded", "format", "tensors"} or
        {"path", "loaded": False, "reason"} when ignored.
    """
    if not path:
        return None
    if resume_tag:
        log.info("--init-checkpoint %s ignored: resuming from this run's checkpoint %s (its weights win)",
                 path, resume_tag)
        return {"path": str(path), "loaded": False, "reason": f"resumed from checkpoint {resume_tag}"}
    return {**load_init_checkpoint(model, path), "loaded": True}
