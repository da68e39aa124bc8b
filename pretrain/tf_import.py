"""Import a TF1 BERT checkpoint (Google / MLPerf naming) into our BertForPreTraining.

MLPerf's initial checkpoint (`model.ckpt-28252`, BERT-Large, its bert_config.json) is the usual input:

    from pretrain.config import BertConfig
    from pretrain.model import BertForPreTraining
    from pretrain.tf_import import load_tf_checkpoint
    model = BertForPreTraining(BertConfig.from_json_file("bert_config.json"))
    load_tf_checkpoint(model, "tf1_ckpt/model.ckpt-28252")   # expect eval accuracy ~0.34085

    # command line: to our weights (safetensors, our names) and/or a transformers directory
    python -m pretrain.tf_import tf1_ckpt/model.ckpt-28252 --config bert_config.json \
        --out-safetensors init.safetensors --out-hf hf_init/

TensorFlow (the `tf` extra) is imported only inside `read_tf_checkpoint`. TF dense kernels are [in, out]
and are transposed; `cls/seq_relationship/output_weights` is already [2, hidden] (TF uses transpose_b);
query/key/value are concatenated into our fused QKV; the word embeddings and the MLM output bias are
zero-padded from vocab_size to the padded vocab rows. Optimizer slots (adam_m/adam_v, ...) and
global_step are ignored.
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from pretrain.config import BertConfig

log = logging.getLogger(__name__)

# ours -> (TF name, transpose?) outside the encoder
_TOP = {
    "embeddings.word_embeddings.weight": ("bert/embeddings/word_embeddings", False),
    "embeddings.position_embeddings.weight": ("bert/embeddings/position_embeddings", False),
    "embeddings.token_type_embeddings.weight": ("bert/embeddings/token_type_embeddings", False),
    "embeddings.LayerNorm.weight": ("bert/embeddings/LayerNorm/gamma", False),
    "embeddings.LayerNorm.bias": ("bert/embeddings/LayerNorm/beta", False),
    "pooler.weight": ("bert/pooler/dense/kernel", True),
    "pooler.bias": ("bert/pooler/dense/bias", False),
    "mlm_head.dense.weight": ("cls/predictions/transform/dense/kernel", True),
    "mlm_head.dense.bias": ("cls/predictions/transform/dense/bias", False),
    "mlm_head.LayerNorm.weight": ("cls/predictions/transform/LayerNorm/gamma", False),
    "mlm_head.LayerNorm.bias": ("cls/predictions/transform/LayerNorm/beta", False),
    "mlm_head.bias": ("cls/predictions/output_bias", False),
    "nsp_head.weight": ("cls/seq_relationship/output_weights", False),
    "nsp_head.bias": ("cls/seq_relationship/output_bias", False),
}
# ours -> TF scope inside bert/encoder/layer_N/ (dense layers: kernel transposed; LayerNorm: gamma/beta)
_LAYER_DENSE = {"attn_out": "attention/output/dense", "ffn_in": "intermediate/dense", "ffn_out": "output/dense"}
_LAYER_NORM = {"attn_LayerNorm": "attention/output/LayerNorm", "ffn_LayerNorm": "output/LayerNorm"}
_VOCAB_SIZED = ("embeddings.word_embeddings.weight", "mlm_head.bias")


def read_tf_checkpoint(path: str | Path) -> dict[str, np.ndarray]:
    """All variables of a TF checkpoint (prefix like `model.ckpt-28252`, or a directory) as numpy arrays."""
    try:
        import tensorflow as tf
    except ImportError as e:
        raise ImportError("importing a TF1 checkpoint needs TensorFlow: pip install 'bertpipe[tf]'") from e
    path = str(path)
    try:
        reader = tf.train.load_checkpoint(path)
    except (ValueError, tf.errors.OpError) as e:
        raise ValueError(f"{path}: not a readable TensorFlow checkpoint (give the prefix, e.g. "
                         f"model.ckpt-28252, or its directory): {e}") from e
    return {name: reader.get_tensor(name) for name in reader.get_variable_to_shape_map()}


def tf_variable_map(config: BertConfig) -> dict[str, tuple[str, bool]]:
    """ours -> (TF variable, transpose?) for every tensor except the fused QKV (see tf_to_state_dict)."""
    names = dict(_TOP)
    for i in range(config.num_hidden_layers):
        src, dst = f"encoder.layer.{i}.", f"bert/encoder/layer_{i}/"
        for ours, scope in _LAYER_DENSE.items():
            names[f"{src}{ours}.weight"] = (f"{dst}{scope}/kernel", True)
            names[f"{src}{ours}.bias"] = (f"{dst}{scope}/bias", False)
        for ours, scope in _LAYER_NORM.items():
            names[f"{src}{ours}.weight"] = (f"{dst}{scope}/gamma", False)
            names[f"{src}{ours}.bias"] = (f"{dst}{scope}/beta", False)
    return names


def _get(tf_vars: dict[str, np.ndarray], name: str, source: str) -> Tensor:
    try:
        return torch.from_numpy(np.ascontiguousarray(tf_vars[name]))
    except KeyError:
        raise ValueError(f"{source}: TF checkpoint has no variable {name!r} (is it a BERT checkpoint with "
                         f"Google/MLPerf naming, and does the config's num_hidden_layers match?)") from None


def tf_to_state_dict(tf_vars: dict[str, np.ndarray], config: BertConfig, source: str = "checkpoint"
                     ) -> dict[str, Tensor]:
    """Our state dict (float32, padded vocab) from TF1 variables; `source` names the file in errors."""
    state: dict[str, Tensor] = {}
    for ours, (name, transpose) in tf_variable_map(config).items():
        t = _get(tf_vars, name, source)
        state[ours] = t.T.contiguous() if transpose else t
    for i in range(config.num_hidden_layers):
        scope = f"bert/encoder/layer_{i}/attention/self/"
        qkv = [_get(tf_vars, f"{scope}{n}/kernel", source).T for n in ("query", "key", "value")]
        state[f"encoder.layer.{i}.attn_qkv.weight"] = torch.cat(qkv, dim=0).contiguous()
        state[f"encoder.layer.{i}.attn_qkv.bias"] = torch.cat(
            [_get(tf_vars, f"{scope}{n}/bias", source) for n in ("query", "key", "value")], dim=0
        )
    for ours in _VOCAB_SIZED:
        t = state[ours]
        if t.shape[0] != config.vocab_size:
            raise ValueError(f"{source}: {ours} has {t.shape[0]} vocab rows, the config says "
                             f"vocab_size={config.vocab_size}")
        state[ours] = torch.cat([t, t.new_zeros((config.padded_vocab_size - t.shape[0], *t.shape[1:]))])
    return {k: v.float() for k, v in state.items()}


def load_tf_checkpoint(model: torch.nn.Module, path: str | Path,
                       tf_vars: dict[str, np.ndarray] | None = None) -> dict[str, int]:
    """Load a TF1 BERT checkpoint into `model` (our BertForPreTraining), checking every shape.

    Args:
        model: the model to fill in place.
        path: checkpoint prefix or directory (named in errors).
        tf_vars: the checkpoint's variables when already read (read_tf_checkpoint), else read from path.

    Returns:
        counts: {"loaded": tensors loaded, "ignored": TF variables not used (optimizer slots, global_step)}.
    """
    config: BertConfig = model.config
    tf_vars = read_tf_checkpoint(path) if tf_vars is None else tf_vars
    state = tf_to_state_dict(tf_vars, config, source=str(path))
    own = model.state_dict()
    for name, t in state.items():
        if own[name].shape != t.shape:
            raise ValueError(f"{path}: {name} has shape {tuple(t.shape)} in the checkpoint but "
                             f"{tuple(own[name].shape)} in the model (a checkpoint from another config?)")
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise ValueError(f"{path}: model tensors not covered by the checkpoint: {missing}; extra: {unexpected}")
    used = set(n for n, _ in tf_variable_map(config).values())
    used |= {f"bert/encoder/layer_{i}/attention/self/{n}/{p}" for i in range(config.num_hidden_layers)
             for n in ("query", "key", "value") for p in ("kernel", "bias")}
    ignored = sorted(set(tf_vars) - used)
    unusual = [n for n in ignored if n != "global_step" and not n.rsplit("/", 1)[-1].startswith(("adam_", "LAMB"))]
    if unusual:
        log.warning("%s: %d TF variables not imported, e.g. %s", path, len(unusual), unusual[:5])
    log.info("imported %d tensors from %s (%d TF variables ignored)", len(state), path, len(ignored))
    return {"loaded": len(state), "ignored": len(ignored)}


def main(argv: list[str] | None = None) -> int:
    import argparse

    from pretrain.config import model_config
    from pretrain.model import BertForPreTraining

    p = argparse.ArgumentParser(description="Convert a TF1 BERT checkpoint (Google/MLPerf names).")
    p.add_argument("tf_checkpoint", help="checkpoint prefix (model.ckpt-28252) or its directory")
    p.add_argument("--config", help="bert_config.json (default: the BERT-Large preset)")
    p.add_argument("--out-safetensors", help="write our state dict here (load with safetensors.torch.load_file)")
    p.add_argument("--out-hf", help="write a transformers BertForPreTraining directory here")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not (args.out_safetensors or args.out_hf):
        p.error("give --out-safetensors and/or --out-hf")
    try:
        tf_vars = read_tf_checkpoint(args.tf_checkpoint)  # first: fail fast before building a large model
        config = BertConfig.from_json_file(args.config) if args.config else model_config("large")
        model = BertForPreTraining(config)
        load_tf_checkpoint(model, args.tf_checkpoint, tf_vars)
    except ValueError as e:
        print(f"tf_import: error: {e}", file=sys.stderr)
        return 2
    if args.out_safetensors:
        from safetensors.torch import save_file

        state = {k: v.contiguous() for k, v in model.state_dict().items()}
        save_file(state, args.out_safetensors, metadata={"bert_config": config.to_json()})
    if args.out_hf:
        from pretrain.hf_export import export_to_hf

        export_to_hf(model, args.out_hf)
    return 0


if __name__ == "__main__":
    sys.exit(main())
