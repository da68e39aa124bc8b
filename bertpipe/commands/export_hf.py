"""Export a training run's checkpoint to a Hugging Face transformers BertForPreTraining directory.

Examples:
  bertpipe export-hf results/tiny hf/tiny                  # the newest checkpoint (checkpoints/latest)
  bertpipe export-hf results/large hf/large-1000 --tag 1000
  python -c "import transformers as t; t.BertForPreTraining.from_pretrained('hf/tiny')"
  bertpipe train --init-checkpoint hf/tiny ...             # start another run from these weights

OUTPUT_DIR is the --output-dir of `bertpipe train` (it holds checkpoints/<tag>/). HF_DIR gets config.json,
model.safetensors and bertpipe_config.json (our model config). Names are transformers', the fused QKV is
split and the vocab padding rows are dropped, so the model gives the same MLM and NSP logits. Under bf16
the weights are the bf16 module weights. Post-LN models only (tiny, large): the 1.5b/5b pre-LN variant has
no transformers equivalent. No hub access is needed.
"""

from __future__ import annotations

import argparse

from bertpipe.commands._common import flag


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("output_dir", metavar="OUTPUT_DIR", help="the training run's --output-dir (holds checkpoints/)")
    p.add_argument("hf_dir", metavar="HF_DIR", help="destination directory (created; files in it are replaced)")
    flag(p, "tag", default=None, help="checkpoint tag, i.e. its step (default: the one checkpoints/latest names)")


def run(args: argparse.Namespace) -> int:
    from core.paths import PathCheck

    pc = PathCheck()
    pc.input_dir("OUTPUT_DIR", args.output_dir, "training run folder")
    pc.output_dir("HF_DIR", args.hf_dir, ["config.json", "model.safetensors", "bertpipe_config.json", "vocab.txt"])
    from pretrain.hf_export import export_training_checkpoint

    print(export_training_checkpoint(args.output_dir, args.hf_dir, args.tag))
    return 0
