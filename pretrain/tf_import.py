"""Import a TF1 BERT checkpoint (Google / MLPerf naming) into our BertForPreTraining.

MLPerf's initial checkpoint (`model.ckpt-28252`, BERT-Large, its bert_config.json) is the usual input:

    from pretrain.config import BertConfig
    from pretrain.model import BertForPreTraining
    from pretrain.tf_import import load_tf_checkpoint
    model = BertForPreTraining(BertConfig.from_json_file("bert_config.json"))
    load_tf_checkpoint(model, "tf1_ckpt/model.ckpt-28252")   # expect eval accuracy ~0.34085

    # command line: to our weights (safetensors, our names) and/or a transformers directory
    bertpipe import-tf tf1_ckpt/model.ckpt-28252 --config bert_config.json \
        --out-safetensors init.safetensors --out-hf hf_init/ --vocab vocab.txt   # (python -m pretrain.tf_import: the same)
    bertpipe train --init-checkpoint init.safetensors ...         # or the TF prefix itself

The checkpoint may be given as its prefix, as one of its files (.index, .data-00000-of-00001) or as its
directory. Every variable's shape is checked against the config before any tensor is read, and a mismatch
raises InputError naming the TF variable, our tensor and both shapes.

TensorFlow (the `tf` extra) is imported only inside `read_tf_checkpoint`. TF dense kernels are [in, out]
and are transposed; `cls/seq_relationship/output_weights` is already [2, hidden] (TF uses transpose_b);
query/key/value are concatenated into our fused QKV; the word embeddings and the MLM output bias are
zero-padded from vocab_size to the padded vocab rows. Optimizer slots (adam_m/adam_v, ...) and
global_step are ignored.
"""

from __future__ import annotations

import logging
import re
import sys
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from core.errors import InputError
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


_TF_FILE = re.compile(r"\.(index|meta|data-\d{5}-of-\d{5})$")
_LAYER = re.compile(r"^bert/encoder/layer_(\d+)/")


def resolve_tf_checkpoint(path: str | Path) -> str:
    """The prefix TensorFlow reads: `model.ckpt-28252` given as itself, one of its files, or its directory.

    Raises:
        InputError: the path does not exist, or a directory holds no (or several) checkpoints.
    """
    p = Path(path)
    if p.is_file() and _TF_FILE.search(p.name):
        p = p.with_name(_TF_FILE.sub("", p.name))
    if p.is_dir():
        indexes = sorted(p.glob("*.index"))
        if len(indexes) == 1:
            return str(indexes[0].with_suffix(""))
        if indexes and (p / "checkpoint").is_file():
            return str(p)  # TF's own state file names the newest one
        if indexes:
            raise InputError(f"{p} holds {len(indexes)} TF checkpoints ({', '.join(i.stem for i in indexes[:4])}"
                             f"{', ...' if len(indexes) > 4 else ''}); give one prefix, e.g. {indexes[-1].with_suffix('')}")
        raise InputError(f"{p} holds no TF checkpoint (no *.index file)")
    if Path(f"{p}.index").is_file():
        return str(p)
    raise InputError(f"TF checkpoint {p} does not exist (no {p.name}.index; give the prefix, e.g. "
                     "tf1_ckpt/model.ckpt-28252, or its directory)")


def _reader(path: str | Path):
    try:
        import tensorflow as tf
    except ImportError as e:
        raise ImportError("importing a TF1 checkpoint needs TensorFlow: pip install 'bertpipe[tf]'") from e
    prefix = resolve_tf_checkpoint(path)
    try:
        return tf.train.load_checkpoint(prefix)
    except (ValueError, tf.errors.OpError) as e:
        raise InputError(f"{path}: not a readable TensorFlow checkpoint (give the prefix, e.g. "
                         f"model.ckpt-28252, or its directory): {e}") from e


def tf_checkpoint_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Every variable's shape, from the checkpoint's index only (no tensor is read)."""
    return {k: tuple(v) for k, v in _reader(path).get_variable_to_shape_map().items()}


def read_tf_checkpoint(path: str | Path, names: list[str] | None = None) -> dict[str, np.ndarray]:
    """Variables of a TF checkpoint (prefix like `model.ckpt-28252`, one of its files, or its directory).

    Args:
        path: the checkpoint.
        names: read only these variables (default: all, optimizer slots included).
    """
    reader = _reader(path)
    return {name: reader.get_tensor(name) for name in (names or reader.get_variable_to_shape_map())}


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


def _qkv_names(i: int) -> list[str]:
    scope = f"bert/encoder/layer_{i}/attention/self/"
    return [f"{scope}{n}/{p}" for n in ("query", "key", "value") for p in ("kernel", "bias")]


def model_shapes(config: BertConfig) -> dict[str, tuple[int, ...]]:
    """Our tensor shapes for `config` (a model built on the meta device: no memory, no init cost)."""
    from pretrain.model import BertForPreTraining

    with torch.device("meta"):
        model = BertForPreTraining(config)
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def tf_expected_shapes(config: BertConfig, own: dict[str, tuple[int, ...]] | None = None
                       ) -> dict[str, tuple[tuple[int, ...], str]]:
    """TF variable -> (its shape for a model of `config`, our tensor it feeds); `own`: our shapes."""
    own = model_shapes(config) if own is None else own
    exp: dict[str, tuple[tuple[int, ...], str]] = {}
    for ours, (name, transpose) in tf_variable_map(config).items():
        s = own[ours]
        if ours in _VOCAB_SIZED:
            s = (config.vocab_size, *s[1:])
        exp[name] = (s[::-1] if transpose else s, ours)
    for i in range(config.num_hidden_layers):
        w, b = own[f"encoder.layer.{i}.attn_qkv.weight"], own[f"encoder.layer.{i}.attn_qkv.bias"]
        for name in _qkv_names(i):
            kernel = name.endswith("/kernel")
            exp[name] = ((w[1], w[0] // 3) if kernel else (b[0] // 3,), f"encoder.layer.{i}.attn_qkv." +
                         ("weight" if kernel else "bias"))
    return exp


def check_tf_shapes(shapes: dict[str, tuple[int, ...]], config: BertConfig, source: str,
                    own: dict[str, tuple[int, ...]] | None = None) -> None:
    """Refuse a checkpoint that does not fit a model of `config` (layer count, vocab, every shape).

    Raises:
        InputError: naming the TF variable, our tensor and both shapes.
    """
    layers = sorted({int(m.group(1)) for n in shapes if (m := _LAYER.match(n))})
    if layers and len(layers) != config.num_hidden_layers:
        missing = f"layer_{config.num_hidden_layers - 1}" if len(layers) < config.num_hidden_layers else ""
        raise InputError(f"{source}: the checkpoint has {len(layers)} encoder layers (bert/encoder/layer_0.."
                         f"layer_{layers[-1]}) but the model's num_hidden_layers={config.num_hidden_layers}"
                         + (f" (no bert/encoder/{missing})" if missing else "")
                         + "; use the checkpoint's bert_config.json")
    for name, (want, ours) in tf_expected_shapes(config, own).items():
        if name not in shapes:
            raise InputError(f"{source}: TF checkpoint has no variable {name!r} (is it a BERT checkpoint with "
                             f"Google/MLPerf naming, and does the config's num_hidden_layers match?)")
        got = tuple(shapes[name])
        if got == want:
            continue
        if ours in _VOCAB_SIZED and got[1:] == want[1:]:
            raise InputError(f"{source}: {name} has shape {got} but the model expects {want}: the checkpoint's "
                             f"vocabulary has {got[0]} ids, the model's vocab_size={config.vocab_size} "
                             "(use the checkpoint's vocab and bert_config.json)")
        raise InputError(f"{source}: {name} has shape {got} but the model expects {want} (our {ours}); "
                         "a checkpoint from another config? use its bert_config.json")


def _get(tf_vars: dict[str, np.ndarray], name: str, source: str) -> Tensor:
    try:
        return torch.from_numpy(np.ascontiguousarray(tf_vars[name]))
    except KeyError:
        raise InputError(f"{source}: TF checkpoint has no variable {name!r} (is it a BERT checkpoint with "
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
            raise InputError(f"{source}: {ours} has {t.shape[0]} vocab rows, the config says "
                             f"vocab_size={config.vocab_size}")
        state[ours] = torch.cat([t, t.new_zeros((config.padded_vocab_size - t.shape[0], *t.shape[1:]))])
    return {k: v.float() for k, v in state.items()}


def load_tf_checkpoint(model: torch.nn.Module, path: str | Path,
                       tf_vars: dict[str, np.ndarray] | None = None) -> dict[str, int]:
    """Load a TF1 BERT checkpoint into `model` (our BertForPreTraining), checking every shape first.

    Args:
        model: the model to fill in place.
        path: checkpoint prefix, one of its files, or its directory (named in errors).
        tf_vars: the checkpoint's variables when already read (read_tf_checkpoint), else read from path
            (only the model's variables: optimizer slots are never read).

    Returns:
        counts: {"loaded": tensors loaded, "ignored": TF variables not used (optimizer slots, global_step)}.

    Raises:
        InputError: missing checkpoint, missing variable, or a shape that does not fit the model's config.
    """
    config: BertConfig = model.config
    own = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    shapes = tf_checkpoint_shapes(path) if tf_vars is None else {k: tuple(v.shape) for k, v in tf_vars.items()}
    check_tf_shapes(shapes, config, str(path), own)
    used = set(n for n, _ in tf_variable_map(config).values())
    used |= {n for i in range(config.num_hidden_layers) for n in _qkv_names(i)}
    if tf_vars is None:
        tf_vars = read_tf_checkpoint(path, sorted(used))
    state = tf_to_state_dict(tf_vars, config, source=str(path))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise InputError(f"{path}: model tensors not covered by the checkpoint: {missing}; extra: {unexpected}")
    ignored = sorted(set(shapes) - used)
    unusual = [n for n in ignored if n != "global_step" and not n.rsplit("/", 1)[-1].startswith(("adam_", "LAMB"))]
    if unusual:
        log.warning("%s: %d TF variables not imported, e.g. %s", path, len(unusual), unusual[:5])
    if config.layer_norm_large_model:
        log.warning("%s: TF1 BERT checkpoints are post-LN; this model uses layer_norm_large_model=True (the "
                    "weights fit, but the function differs)", path)
    log.info("imported %d tensors from %s (%d TF variables ignored)", len(state), path, len(ignored))
    return {"loaded": len(state), "ignored": len(ignored)}


def save_safetensors(model: torch.nn.Module, path: str | Path, source: str = "") -> Path:
    """Our state dict as safetensors (metadata: the BertConfig as JSON), written atomically."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items()}
    tmp = path.with_name(path.name + ".tmp")
    save_file(state, str(tmp), metadata={"bert_config": model.config.to_json(), "source": source,
                                         "format": "bertpipe"})
    from pretrain.hf_export import make_readable

    make_readable([tmp])  # (safetensors writes 0600)
    tmp.replace(path)
    return path


def convert_tf_checkpoint(tf_checkpoint: str | Path, config: BertConfig, *, out_safetensors: str | Path | None = None,
                          out_hf: str | Path | None = None, vocab: str | Path | None = None,
                          do_lower_case: bool = True) -> torch.nn.Module:
    """TF1 checkpoint -> our model, written as safetensors (our names) and/or a transformers directory.

    ``out_hf`` gets the tokenizer of ``vocab`` too (vocab.txt, tokenizer_config.json, special_tokens_map.json,
    as `bertpipe export-hf` writes them), so ``transformers.pipeline("fill-mask", model=out_hf)`` works; the
    vocab is required with ``out_hf`` (without it transformers would build a 5-token tokenizer). The shapes
    and the vocab are checked before the model is built or any tensor read.

    Raises:
        InputError: no output asked for, ``out_hf`` without ``vocab``, a vocab that does not fit, a missing
            checkpoint, or a checkpoint that does not fit `config`.
    """
    from pretrain.model import BertForPreTraining

    if not (out_safetensors or out_hf):
        raise InputError("give --out-safetensors FILE and/or --out-hf DIR")
    if out_hf:
        from pretrain.hf_export import hf_config, tokenizer_files

        if not vocab:
            from pretrain.vocab_file import out_hf_needs_vocab

            raise InputError(out_hf_needs_vocab(out_hf))
        hf_config(config)  # refuses the pre-LN variant before any work
        tokenizer_files(vocab, config, do_lower_case)  # a vocab that does not fit: refused now
    check_tf_shapes(tf_checkpoint_shapes(tf_checkpoint), config, str(tf_checkpoint))  # fail fast
    model = BertForPreTraining(config)
    load_tf_checkpoint(model, tf_checkpoint)
    if out_safetensors:
        save_safetensors(model, out_safetensors, source=str(tf_checkpoint))
        log.info("wrote %s", out_safetensors)
    if out_hf:
        from pretrain.hf_export import export_to_hf, export_tokenizer

        export_to_hf(model, out_hf)
        export_tokenizer(vocab, out_hf, config, do_lower_case)
    return model



def main(argv: list[str] | None = None) -> int:
    """`python -m pretrain.tf_import`: the same as `bertpipe import-tf` (see bertpipe/commands/import_tf.py)."""
    import argparse

    from pretrain.config import model_config

    p = argparse.ArgumentParser(description="Convert a TF1 BERT checkpoint (Google/MLPerf names).")
    p.add_argument("tf_checkpoint", help="checkpoint prefix (model.ckpt-28252) or its directory")
    p.add_argument("--config", help="bert_config.json (default: the BERT-Large preset)")
    p.add_argument("--out-safetensors", help="write our state dict here (load with safetensors.torch.load_file)")
    p.add_argument("--out-hf", help="write a transformers BertForPreTraining directory here (needs --vocab)")
    p.add_argument("--vocab", help="the checkpoint's vocab.txt: the tokenizer written into --out-hf")
    p.add_argument("--do-lower-case", action=argparse.BooleanOptionalAction, default=True,
                   help="the tokenizer lower-cases (an uncased vocab, as MLPerf's) (default: true)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    if not (args.out_safetensors or args.out_hf):
        p.error("give --out-safetensors and/or --out-hf")
    try:
        config = BertConfig.from_json_file(args.config) if args.config else model_config("large")
        convert_tf_checkpoint(args.tf_checkpoint, config, out_safetensors=args.out_safetensors, out_hf=args.out_hf,
                              vocab=args.vocab, do_lower_case=args.do_lower_case)
    except ValueError as e:
        print(f"tf_import: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
