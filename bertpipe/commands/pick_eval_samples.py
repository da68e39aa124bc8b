"""Pick the evenly spaced eval subset of a TFRecord, records unchanged (MLCommons pick_eval_samples.py).

  bertpipe pick-eval-samples --input_tfrecord=eval_intermediate --output_tfrecord=eval_10k \\
      --num_examples_to_pick=10000

More picks than records is refused (the reference would silently repeat records).
"""

from __future__ import annotations

import argparse
import logging

from bertpipe.commands._common import flag, positive_int

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    flag(p, "input_tfrecord", required=True, help="the TFRecord to pick from (eval_intermediate)")
    flag(p, "output_tfrecord", required=True, help="the TFRecord to write (eval_10k)")
    flag(p, "num_examples_to_pick", type=positive_int(), default=10000, help="number of records to keep (default: 10000)")
    flag(p, "max_seq_length", type=positive_int(1 << 16), default=512, help="expected record length (default: 512)")
    flag(p, "max_predictions_per_seq", type=positive_int(1 << 16), default=76, help="expected predictions per record (default: 76)")


def run(args: argparse.Namespace) -> int:
    from core.paths import PathCheck
    from preprocessing.mlperf.pick_eval_samples import PickEvalConfig, pick_eval_samples_file

    pc = PathCheck()
    src = pc.input_file("--input_tfrecord", args.input_tfrecord, "TFRecord")
    dst = pc.output_file("--output_tfrecord", args.output_tfrecord)

    cfg = PickEvalConfig(num_examples_to_pick=args.num_examples_to_pick, allow_fewer=False,
                         max_seq_length=args.max_seq_length, max_predictions_per_seq=args.max_predictions_per_seq)
    c = pick_eval_samples_file(src, dst, cfg)
    log.info("picked %d of %d records -> %s", c["picked"], c["records_in"], args.output_tfrecord)
    return 0
