"""Export our BERT to a Hugging Face `transformers` BertForPreTraining directory (and read one back).

    from pretrain.hf_export import export_to_hf
    export_to_hf(model, "out/hf")            # config.json + model.safetensors
    transformers.BertForPreTraining.from_pretrained("out/hf")

    # or straight from a training run's DeepSpeed checkpoint (newest tag unless --tag), with the tokenizer
    # (vocab.txt, tokenizer_config.json, special_tokens_map.json) of the vocab the run recorded (--vocab):
    bertpipe export-hf OUTPUT_DIR out/hf [--tag 1000]     # (python -m pretrain.hf_export: the same)
    transformers.pipeline("fill-mask", model="out/hf")
    bertpipe train --init-checkpoint out/hf ...           # the directory also starts another run

The mapping is name for name except that our fused QKV projection is split into query/key/value and the
vocabulary padding rows (30522 -> 30528) are dropped, so the exported model has the real vocab_size and gives
the same MLM and NSP logits. Habana's `layer_norm_large_model` variant has no transformers equivalent and is
refused. No hub access is needed: the model is built from its config.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from core.errors import InputError
from pretrain.config import BertConfig

log = logging.getLogger(__name__)

HF_ACT = {"gelu": "gelu", "gelu_new": "gelu_new", "gelu_tanh": "gelu_new", "relu": "relu"}
CONFIG_NAME = "bertpipe_config.json"  # our BertConfig, written beside config.json

# ours -> transformers, per encoder layer (qkv handled separately)
_LAYER_MAP = {
    "attn_out": "attention.output.dense",
    "attn_LayerNorm": "attention.output.LayerNorm",
    "ffn_in": "intermediate.dense",
    "ffn_out": "output.dense",
    "ffn_LayerNorm": "output.LayerNorm",
}
# ours -> transformers, outside the encoder (vocab-sized tensors are sliced/padded separately)
_TOP_MAP = {
    "embeddings.word_embeddings.weight": "bert.embeddings.word_embeddings.weight",
    "embeddings.position_embeddings.weight": "bert.embeddings.position_embeddings.weight",
    "embeddings.token_type_embeddings.weight": "bert.embeddings.token_type_embeddings.weight",
    "embeddings.LayerNorm.weight": "bert.embeddings.LayerNorm.weight",
    "embeddings.LayerNorm.bias": "bert.embeddings.LayerNorm.bias",
    "pooler.weight": "bert.pooler.dense.weight",
    "pooler.bias": "bert.pooler.dense.bias",
    "mlm_head.dense.weight": "cls.predictions.transform.dense.weight",
    "mlm_head.dense.bias": "cls.predictions.transform.dense.bias",
    "mlm_head.LayerNorm.weight": "cls.predictions.transform.LayerNorm.weight",
    "mlm_head.LayerNorm.bias": "cls.predictions.transform.LayerNorm.bias",
    "mlm_head.bias": "cls.predictions.bias",
    "nsp_head.weight": "cls.seq_relationship.weight",
    "nsp_head.bias": "cls.seq_relationship.bias",
}
_VOCAB_SIZED = ("embeddings.word_embeddings.weight", "mlm_head.bias")


def hf_config(config: BertConfig) -> Any:
    """The `transformers.BertConfig` equivalent of ours (real vocab size, post-LN only)."""
    if config.layer_norm_large_model:
        raise InputError(
            "layer_norm_large_model=True (the 1.5B/5B pre-LN variant) has no transformers BertForPreTraining "
            "equivalent; export only post-LN models (tiny/base/large)"
        )
    import transformers

    return transformers.BertConfig(
        vocab_size=config.vocab_size, hidden_size=config.hidden_size,
        num_hidden_layers=config.num_hidden_layers, num_attention_heads=config.num_attention_heads,
        intermediate_size=config.intermediate_size, hidden_act=HF_ACT[config.hidden_act],
        hidden_dropout_prob=config.hidden_dropout_prob,
        attention_probs_dropout_prob=config.attention_probs_dropout_prob,
        max_position_embeddings=config.max_position_embeddings, type_vocab_size=config.type_vocab_size,
        initializer_range=config.initializer_range, layer_norm_eps=config.layer_norm_eps,
        pad_token_id=0, tie_word_embeddings=True, architectures=["BertForPreTraining"],
    )


def _strip_prefix(state: dict[str, Tensor]) -> dict[str, Tensor]:
    """Accept DeepSpeed/DDP-wrapped state dicts ("module." prefixes)."""
    if state and all(k.startswith("module.") for k in state):
        return {k[len("module."):]: v for k, v in state.items()}
    return state


def to_hf_state_dict(state: dict[str, Tensor], config: BertConfig) -> dict[str, Tensor]:
    """Rename/split our state dict into transformers' BertForPreTraining names (decoder tied, vocab unpadded)."""
    state = _strip_prefix(state)
    out: dict[str, Tensor] = {}
    for ours, theirs in _TOP_MAP.items():
        t = state[ours]
        out[theirs] = t[: config.vocab_size] if ours in _VOCAB_SIZED else t
    for i in range(config.num_hidden_layers):
        src, dst = f"encoder.layer.{i}.", f"bert.encoder.layer.{i}."
        for part in ("weight", "bias"):
            q, k, v = state[f"{src}attn_qkv.{part}"].chunk(3, dim=0)
            for name, t in (("query", q), ("key", k), ("value", v)):
                out[f"{dst}attention.self.{name}.{part}"] = t
            for ours, theirs in _LAYER_MAP.items():
                out[f"{dst}{theirs}.{part}"] = state[f"{src}{ours}.{part}"]
    out["cls.predictions.decoder.weight"] = out["bert.embeddings.word_embeddings.weight"]
    out["cls.predictions.decoder.bias"] = out["cls.predictions.bias"]
    return {k: v.detach().contiguous() for k, v in out.items()}


def from_hf_state_dict(hf_state: dict[str, Tensor], config: BertConfig) -> dict[str, Tensor]:
    """The inverse of to_hf_state_dict: transformers names -> ours, vocab rows zero-padded."""
    out: dict[str, Tensor] = {}
    for ours, theirs in _TOP_MAP.items():
        t = hf_state[theirs]
        out[ours] = pad_vocab(t, config, theirs) if ours in _VOCAB_SIZED else t
    for i in range(config.num_hidden_layers):
        src, dst = f"bert.encoder.layer.{i}.", f"encoder.layer.{i}."
        for part in ("weight", "bias"):
            out[f"{dst}attn_qkv.{part}"] = torch.cat(
                [hf_state[f"{src}attention.self.{n}.{part}"] for n in ("query", "key", "value")], dim=0
            )
            for ours, theirs in _LAYER_MAP.items():
                out[f"{dst}{ours}.{part}"] = hf_state[f"{src}{theirs}.{part}"]
    return out


def pad_vocab(t: Tensor, config: BertConfig, name: str = "vocab-sized tensor") -> Tensor:
    """Zero-pad the first dimension of a vocab-sized tensor from vocab_size to padded_vocab_size rows."""
    if t.shape[0] != config.vocab_size:
        raise InputError(f"{name} has shape {tuple(t.shape)} but the model expects "
                         f"{(config.vocab_size, *t.shape[1:])}: {t.shape[0]} vocab ids in the checkpoint, "
                         f"vocab_size={config.vocab_size} in the config")
    pad = t.new_zeros((config.padded_vocab_size - t.shape[0], *t.shape[1:]))
    return torch.cat([t, pad], dim=0)


def export_to_hf(model_or_state: torch.nn.Module | dict[str, Tensor], out_dir: str | Path,
                 config: BertConfig | None = None) -> Path:
    """Write a transformers BertForPreTraining directory (config.json, model.safetensors, our config).

    Args:
        model_or_state: our BertForPreTraining, or its state dict (DeepSpeed "module." prefixes allowed).
        out_dir: destination directory (created).
        config: required when a state dict is given; defaults to the model's config.
    """
    import transformers

    if isinstance(model_or_state, torch.nn.Module):
        config = config or model_or_state.config
        state = model_or_state.state_dict()
    else:
        state = model_or_state
    if config is None:
        raise InputError("export_to_hf: pass config= with a bare state dict")
    hf_model = transformers.BertForPreTraining(hf_config(config))
    hf_state = to_hf_state_dict(state, config)
    missing, unexpected = hf_model.load_state_dict({k: v.float() for k, v in hf_state.items()}, strict=False)
    if missing or unexpected:
        raise InputError(f"state dict does not match transformers BertForPreTraining: missing {missing}, "
                         f"unexpected {unexpected}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    from transformers.utils import logging as hf_logging

    bar = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # one file: its "Writing model shards" bar is noise on stderr
    try:
        hf_model.save_pretrained(out_dir)
    finally:
        if bar:
            hf_logging.enable_progress_bar()
    (out_dir / CONFIG_NAME).write_text(json.dumps(config.to_dict(), indent=2, sort_keys=True) + "\n")
    make_readable(out_dir / n for n in ("config.json", "model.safetensors", CONFIG_NAME))
    log.info("exported %d tensors to %s", len(hf_state), out_dir)
    return out_dir


def file_mode() -> int:
    """The mode a plain new file gets here (0o666 less the umask: 0644 under the usual umask 022)."""
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def make_readable(paths) -> None:  # noqa: ANN001 - an iterable of Paths
    """Give exported files the mode of any other new file (safetensors writes model.safetensors 0600)."""
    mode = file_mode()
    for p in paths:
        if Path(p).is_file():
            os.chmod(p, mode)


def _tag_order(tag: str) -> tuple:
    return (0, int(tag), "") if tag.isdigit() else (1, 0, tag)


def load_training_checkpoint(output_dir: str | Path, tag: str | None = None) -> tuple[dict[str, Tensor], BertConfig]:
    """Module weights and model config of a `pretrain/train.py` checkpoint (OUTPUT_DIR/checkpoints/<tag>/).

    Reads DeepSpeed's `mp_rank_00_model_states.pt` with `torch.load(weights_only=True)`. Under bf16 these are
    the bf16 weights (the fp32 master copy lives in the ZeRO optimizer partitions and differs by bf16
    rounding only).

    Raises:
        InputError: no such run directory or tag, or an incomplete checkpoint (the message says which).
    """
    from pretrain import checkpoint as ckpt

    root = ckpt.checkpoint_dir(output_dir)
    if not Path(output_dir).is_dir():
        raise InputError(f"training run directory {output_dir} does not exist (give the --output-dir of "
                         "`bertpipe train`, which holds checkpoints/)")
    tags = sorted((d.name for d in root.iterdir() if d.is_dir()), key=_tag_order) if root.is_dir() else []
    tag = tag or ckpt.latest_tag(output_dir)  # (None when `latest` is missing, empty or not a plain tag name)
    if tag is None:
        raise InputError(f"{root}: no 'latest' file" + (f"; pass --tag, one of {', '.join(tags)}" if tags else
                                                       " and no checkpoint: the run saved none yet"))
    d = ckpt.tag_dir(output_dir, tag)  # a --tag that is a path (../x) or a link out of checkpoints/ is refused
    if not d.is_dir():
        raise InputError(f"{root} has no checkpoint {tag!r}" + (f"; there are: {', '.join(tags)}" if tags else ""))
    try:
        config = BertConfig.from_dict(json.loads((d / ckpt.CONFIG_NAME).read_text())["model"])
        states = ckpt.weights_only_load(d / "mp_rank_00_model_states.pt", map_location="cpu")
    except (OSError, ValueError, KeyError) as e:
        raise InputError(f"{d}: not a complete bertpipe training checkpoint ({e})") from e
    return states["module"], config


SPECIAL_TOKENS = {"unk_token": "[UNK]", "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]",
                  "mask_token": "[MASK]"}
TOKENIZER_FILES = ("vocab.txt", "tokenizer_config.json", "special_tokens_map.json")


def recorded_vocab(output_dir: str | Path, tag: str | None = None) -> dict | None:
    """The vocab record ({"path", "md5", "entries"}) of a run: the checkpoint's, else OUTPUT_DIR/config.json's."""
    from pretrain import checkpoint as ckpt

    tag = tag or ckpt.latest_tag(output_dir)
    for f in ([ckpt.checkpoint_dir(output_dir) / tag / ckpt.CONFIG_NAME] if tag else []) + [
            Path(output_dir) / "config.json"]:
        try:
            doc = json.loads(f.read_text())
        except (OSError, ValueError):
            continue
        record = (doc.get("run") or {}).get("vocab") if "run" in doc else doc.get("vocab")
        if record:
            return record
    return None


def resolve_vocab(output_dir: str | Path, tag: str | None = None, vocab: str | Path | None = None) -> Path:
    """The vocab.txt to export with a run: ``vocab`` if given (it must match the run's record, when there is
    one), else the recorded file, which must still have the recorded md5.

    Raises:
        InputError: one line naming the run, the file and the flag to pass (--vocab).
    """
    from pretrain.vocab_file import vocab_record

    record = recorded_vocab(output_dir, tag)
    if vocab:
        given = vocab_record(vocab)
        if record and given["md5"] != record["md5"]:
            raise InputError(f"--vocab {vocab} (md5 {given['md5']}) is not the vocab run {output_dir} trained on "
                             f"({record['path']}, md5 {record['md5']}); pass that file or a copy of it")
        return Path(vocab)
    if not record:
        raise InputError(f"run {output_dir} records no vocab (trained without --vocab), so its tokenizer is unknown; "
                         "pass --vocab FILE, the vocab.txt its training data was made with")
    path = Path(record["path"])
    if not path.is_file():
        raise InputError(f"vocab {path} that run {output_dir} trained on is missing; pass --vocab FILE with a copy "
                         f"of it (md5 {record['md5']})")
    now = vocab_record(path)
    if now["md5"] != record["md5"]:
        raise InputError(f"vocab {path} has changed since run {output_dir} trained on it (md5 {now['md5']}, "
                         f"recorded {record['md5']}); pass --vocab FILE with the original (md5 {record['md5']})")
    return path


def export_tokenizer(vocab: str | Path, hf_dir: str | Path, config: BertConfig, do_lower_case: bool = True) -> Path:
    """vocab.txt, tokenizer_config.json and special_tokens_map.json: a BertTokenizer(Fast)-loadable set.

    Raises:
        InputError: the vocab lacks a special token, or has more entries than the model's vocab_size.
    """
    hf_dir = Path(hf_dir)
    for name, content in tokenizer_files(vocab, config, do_lower_case).items():
        tmp = hf_dir / f".{name}.tmp"
        tmp.write_bytes(content)
        tmp.replace(hf_dir / name)
    make_readable(hf_dir / n for n in TOKENIZER_FILES)
    return hf_dir


def tokenizer_files(vocab: str | Path, config: BertConfig, do_lower_case: bool = True) -> dict[str, bytes]:
    """The tokenizer's files (name -> bytes) for ``vocab``, checked against the model (call it before any work).

    Raises:
        InputError: the vocab cannot be read, lacks a special token, or has more entries than the model's
            vocab_size (one line naming the file and the flag, --vocab).
    """
    try:
        data = Path(vocab).read_bytes()
    except OSError as exc:
        raise InputError(f"--vocab {vocab}: cannot read it ({exc.strerror or exc}); pass the vocab.txt the "
                         "model was trained with") from exc
    try:
        tokens = data.decode("utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise InputError(f"vocab {vocab} is not UTF-8 text ({exc.reason} at byte {exc.start}): not a BERT WordPiece "
                         "vocab; pass --vocab FILE with the vocab.txt the model was trained with") from exc
    missing = [t for t in SPECIAL_TOKENS.values() if t not in tokens]
    if missing:
        raise InputError(f"vocab {vocab} has no {', '.join(missing)} entry: not a BERT WordPiece vocab; pass "
                         "--vocab FILE with the vocab.txt the training data was made with")
    if len(tokens) > config.vocab_size:
        raise InputError(f"vocab {vocab} has {len(tokens)} entries but the model's vocab_size is {config.vocab_size}: "
                         "not the vocab it was trained with; pass --vocab FILE with that one")
    if len(tokens) < config.vocab_size:
        log.warning("vocab %s has %d entries, the model %d: ids %d.. have no token", vocab, len(tokens),
                    config.vocab_size, len(tokens))
    tok_config = {"tokenizer_class": "BertTokenizer", "do_lower_case": do_lower_case, "do_basic_tokenize": True,
                  "tokenize_chinese_chars": True, "strip_accents": None, **SPECIAL_TOKENS,
                  "model_max_length": config.max_position_embeddings, "clean_up_tokenization_spaces": True}
    return {"vocab.txt": data, "tokenizer_config.json": _json_bytes(tok_config),
            "special_tokens_map.json": _json_bytes(SPECIAL_TOKENS)}


def _json_bytes(doc: dict) -> bytes:
    return (json.dumps(doc, indent=2) + "\n").encode("utf-8")


def export_training_checkpoint(output_dir: str | Path, hf_dir: str | Path, tag: str | None = None,
                               vocab: str | Path | None = None, do_lower_case: bool = True) -> Path:
    """`bertpipe export-hf`: a training run's checkpoint (newest unless `tag`) -> transformers directory with
    the tokenizer of the vocab the run trained on (its record, see :func:`resolve_vocab`, or ``vocab``)."""
    state, config = load_training_checkpoint(output_dir, tag)
    vocab_path = resolve_vocab(output_dir, tag, vocab)  # refused before anything is written
    out = export_to_hf(state, hf_dir, config)
    export_tokenizer(vocab_path, out, config, do_lower_case)
    return out


def main(argv: list[str] | None = None) -> int:
    """`python -m pretrain.hf_export`: the same as `bertpipe export-hf` (see bertpipe/commands/export_hf.py)."""
    import argparse

    p = argparse.ArgumentParser(description="Export a bertpipe training checkpoint to a transformers directory.")
    p.add_argument("output_dir", help="the training run's --output-dir (holds checkpoints/)")
    p.add_argument("hf_dir", help="destination directory")
    p.add_argument("--tag", help="checkpoint tag (default: checkpoints/latest)")
    p.add_argument("--vocab", help="the vocab.txt the run trained on (default: the one the run recorded)")
    p.add_argument("--do-lower-case", action=argparse.BooleanOptionalAction, default=True,
                   help="the tokenizer lower-cases (uncased vocab, as MLPerf's) (default: true)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
    try:
        export_training_checkpoint(args.output_dir, args.hf_dir, args.tag, args.vocab, args.do_lower_case)
    except ValueError as e:
        print(f"hf_export: error: {e}", file=sys.stderr)
        return 2
    print(args.hf_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
