"""Export a training run's checkpoint to a Hugging Face transformers BertForPreTraining directory.

Examples:
  bertpipe export-hf results/tiny hf/tiny                  # the newest checkpoint (checkpoints/latest)
  bertpipe export-hf results/large hf/large-1000 --tag 1000
  bertpipe export-hf results/old hf/old --vocab work/vocab.txt   # a run that recorded no vocab
  python -c "import transformers as t; print(t.pipeline('fill-mask', model='hf/tiny')('the [MASK] of'))"
  bertpipe train --init-checkpoint hf/tiny ...             # start another run from these weights

OUTPUT_DIR is the --output-dir of `bertpipe train` (it holds checkpoints/<tag>/). HF_DIR gets config.json,
model.safetensors, bertpipe_config.json (our model config) and the tokenizer: vocab.txt, tokenizer_config.json
(do_lower_case true unless --no-do-lower-case) and special_tokens_map.json, from the vocab the run recorded
(`bertpipe train --vocab`, path and md5). A run that recorded none, or whose vocab file is gone or changed
since, is refused unless --vocab names the file (which must have the recorded md5, when there is one). Names are transformers', the fused QKV is
split and the vocab padding rows are dropped, so the model gives the same MLM and NSP logits. Under bf16
the weights are the bf16 module weights. Post-LN models only (tiny, base, large): the 1.5b/5b pre-LN variant has
no transformers equivalent. No hub access is needed.
"""

from __future__ import annotations

import argparse

from bertpipe.commands._common import flag


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("output_dir", metavar="OUTPUT_DIR", help="the training run's --output-dir (holds checkpoints/)")
    p.add_argument("hf_dir", metavar="HF_DIR", help="destination directory (created; files in it are replaced)")
    flag(p, "tag", default=None, help="checkpoint tag, i.e. its step (default: the one checkpoints/latest names)")
    flag(p, "vocab", default=None, help="the vocab.txt the run trained on, for the tokenizer (default: the one the "
         "run recorded, `bertpipe train --vocab`; needed for a run that recorded none; must match a record)")
    p.add_argument("--do-lower-case", dest="do_lower_case", action=argparse.BooleanOptionalAction, default=True,
                   help="the tokenizer lower-cases text (an uncased vocab, as MLPerf's) (default: true)")


def run(args: argparse.Namespace) -> int:
    from core.paths import PathCheck

    pc = PathCheck()
    pc.input_dir("OUTPUT_DIR", args.output_dir, "training run folder")
    if args.vocab:
        pc.input_file("--vocab", args.vocab, "vocab.txt")
    pc.output_dir("HF_DIR", args.hf_dir, ["config.json", "model.safetensors", "bertpipe_config.json", "vocab.txt",
                                          "tokenizer_config.json", "special_tokens_map.json"])
    from pretrain.hf_export import export_training_checkpoint

    print(export_training_checkpoint(args.output_dir, args.hf_dir, args.tag, args.vocab, args.do_lower_case))
    return 0
