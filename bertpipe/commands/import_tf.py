"""Convert a TF1 BERT checkpoint (Google / MLPerf variable names) to our weights and/or transformers.

Examples:
  # MLPerf's initial checkpoint (BERT-Large) and its bert_config.json
  bertpipe import-tf tf1_ckpt/model.ckpt-28252 --config tf1_ckpt/bert_config.json \\
      --out-safetensors init.safetensors --out-hf hf/mlperf-init --vocab tf1_ckpt/vocab.txt
  bertpipe train --model large --init-checkpoint init.safetensors ...    # start pre-training from it
  bertpipe import-tf tf1_ckpt --model tiny --out-safetensors tiny.safetensors  # directory; a preset config

TF_CHECKPOINT is the prefix (model.ckpt-28252: the files model.ckpt-28252.index and .data-*), one of those
files, or their directory. The model config is --config (a bert_config.json) or a --model preset (default:
large). Every variable's shape is checked against it before anything is read or built; a mismatch is one
line naming the TF variable, our tensor and both shapes. Optimizer slots (adam_m/adam_v) and global_step
are skipped. --out-safetensors holds our tensor names (vocab padded, float32; the config in its metadata);
--out-hf is a transformers BertForPreTraining directory with the tokenizer of --vocab (the checkpoint's
vocab.txt: vocab.txt, tokenizer_config.json with do_lower_case, special_tokens_map.json, as export-hf writes
them), so `transformers.pipeline("fill-mask", model=DIR)` works; --out-hf without --vocab is refused. Every
file written gets the mode of a new file (0644 under umask 022). Needs TensorFlow (the `tf` extra).
"""

from __future__ import annotations

import argparse

from bertpipe.commands._common import flag

PRESETS = ("tiny", "base", "large", "1.5b", "5b")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("tf_checkpoint", metavar="TF_CHECKPOINT",
                   help="checkpoint prefix (model.ckpt-28252), one of its files, or its directory")
    g = p.add_mutually_exclusive_group()
    flag(g, "config", default=None, metavar="BERT_CONFIG_JSON",
         help="the checkpoint's bert_config.json (Google's field names)")
    flag(g, "model", choices=PRESETS, default=None, help="a preset config instead (default: large)")
    flag(p, "out_safetensors", default=None, metavar="FILE",
         help="write our state dict here (for `bertpipe train --init-checkpoint FILE`)")
    flag(p, "out_hf", default=None, metavar="DIR",
         help="write a transformers BertForPreTraining directory here, with the tokenizer of --vocab")
    flag(p, "vocab", default=None, metavar="FILE",
         help="the checkpoint's vocab.txt (MLPerf's, beside model.ckpt-28252): the tokenizer of --out-hf (required "
         "with --out-hf)")
    p.add_argument("--do-lower-case", dest="do_lower_case", action=argparse.BooleanOptionalAction, default=True,
                   help="the --out-hf tokenizer lower-cases text (an uncased vocab, as MLPerf's) (default: true)")


def run(args: argparse.Namespace) -> int:
    from core.errors import BertpipeError, InputError

    if not (args.out_safetensors or args.out_hf):
        raise InputError("nothing to write: give --out-safetensors FILE and/or --out-hf DIR")
    from pathlib import Path

    from core.paths import PathCheck
    from pretrain.vocab_file import out_hf_needs_vocab

    if args.out_hf and not args.vocab:
        raise InputError(out_hf_needs_vocab(args.out_hf))

    pc = PathCheck()
    src = Path(args.tf_checkpoint)
    if src.is_dir():
        pc.input_dir("TF_CHECKPOINT", args.tf_checkpoint, "checkpoint folder")
    elif src.exists():
        pc.input_file("TF_CHECKPOINT", src, "checkpoint file")
    else:
        index = src.with_name(src.name + ".index")
        if not index.exists():
            raise InputError(f"TF_CHECKPOINT {src}: no such checkpoint ({index.name} is missing too); give the "
                             "prefix (model.ckpt-28252), one of its files or its folder")
        pc.input_file("TF_CHECKPOINT", index, "checkpoint index")
        for data in src.parent.glob(src.name + ".data-*"):
            pc.input_file("TF_CHECKPOINT", data, "checkpoint data file")
    if src.is_dir():
        pc.input_dir_files("TF_CHECKPOINT", src, [p.name for p in src.iterdir()])
    if args.config is not None:
        pc.input_file("--config", args.config, "bert_config.json")
    if args.vocab:
        pc.input_file("--vocab", args.vocab, "vocab.txt")
    if args.out_safetensors:
        pc.output_file("--out-safetensors", args.out_safetensors)
    if args.out_hf:
        pc.output_dir("--out-hf", args.out_hf, ["config.json", "model.safetensors", "bertpipe_config.json", "vocab.txt",
                                                "tokenizer_config.json", "special_tokens_map.json"])
    from pretrain.config import BertConfig, model_config
    from pretrain.tf_import import convert_tf_checkpoint

    try:
        config = BertConfig.from_json_file(args.config) if args.config else model_config(args.model or "large")
    except ValueError as e:
        raise InputError(f"--config: {e}") from e
    try:
        convert_tf_checkpoint(args.tf_checkpoint, config, out_safetensors=args.out_safetensors, out_hf=args.out_hf,
                              vocab=args.vocab, do_lower_case=args.do_lower_case)
    except ImportError as e:
        raise BertpipeError(str(e)) from e
    for out in (args.out_safetensors, args.out_hf):
        if out:
            print(out)
    return 0
