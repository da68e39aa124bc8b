"""Tokenize, build next-sentence pairs, mask and write TFRecords, byte-exact to the MLPerf reference.

The reference's flags work in both spellings (``--max_seq_length=512`` or ``--max-seq-length 512``)
and with its defaults (max_seq_length 128, max_predictions_per_seq 20, dupe_factor 10, ...).

MLPerf training data, one part file (what the reference's README runs for each of the 500 parts):
  bertpipe create-pretraining-data --input_file=results/part-00000-of-00500 \\
      --output_file=tfrecord/part-00000-of-00500 --vocab_file=vocab.txt --do_lower_case=True \\
      --max_seq_length=512 --max_predictions_per_seq=76 --masked_lm_prob=0.15 --random_seed=12345 \\
      --dupe_factor=10

All part files, one output per input, 8 processes (each file gets its own random.Random(12345), so
the bytes do not depend on --workers):
  bertpipe create-pretraining-data --input_file='results/part-*' --output-dir tfrecord --workers 8 \\
      --vocab_file=vocab.txt --max_seq_length=512 --max_predictions_per_seq=76

--impl picks the implementation: auto (the C fast path when it is built, else plain Python), fast
(fail if it is not built) or plain. Both write the same bytes.
"""

from __future__ import annotations

import argparse
import glob
import logging
import time
from pathlib import Path

from bertpipe.commands._common import bool_flag, flag, nonneg_int, number, positive_int

log = logging.getLogger("bertpipe.create_pretraining_data")


def add_arguments(p: argparse.ArgumentParser) -> None:
    flag(p, "input_file", required=True, metavar="GLOBS",
         help="input text (one sentence per line, blank line between documents); comma-separated globs")
    out = p.add_mutually_exclusive_group(required=True)
    flag(out, "output_file", metavar="FILES",
         help="output TFRecord(s); comma-separated: instances are written round-robin, as the reference does")
    flag(out, "output_dir", metavar="DIR",
         help="one output per input file (DIR/<input name><suffix>), each its own invocation, in parallel "
         "(--workers); only the first logs its examples")
    flag(p, "output_suffix", default=".tfrecord", help="suffix of --output_dir outputs (default: .tfrecord)")
    flag(p, "vocab_file", required=True, help="BERT vocab.txt (the MLPerf vocab for MLPerf data)")
    bool_flag(p, "do_lower_case", True, "lower-case and strip accents (uncased vocab)")
    flag(p, "max_seq_length", type=number(int, 5, 1 << 16), default=128, help="maximum sequence length (default: 128; MLPerf: 512)")
    flag(p, "max_predictions_per_seq", type=positive_int(1 << 16), default=20,
         help="maximum masked LM predictions per sequence (default: 20; MLPerf: 76)")
    flag(p, "random_seed", type=number(int, -(2**63), 2**63 - 1), default=12345, help="random seed (default: 12345)")
    flag(p, "dupe_factor", type=positive_int(100_000), default=10, help="passes over the input, each with other masks (default: 10)")
    flag(p, "masked_lm_prob", type=number(float, 0, 1, lo_open=True, hi_open=True), default=0.15, help="masked LM probability (default: 0.15)")
    flag(p, "short_seq_prob", type=number(float, 0, 1), default=0.1,
         help="probability of a shorter target sequence length (default: 0.1)")
    flag(p, "impl", choices=("auto", "fast", "plain"), default="auto",
         help="implementation: auto (fast when built), fast, plain; same bytes (default: auto)")
    flag(p, "workers", type=nonneg_int(4096), default=0,
         help="processes for --output_dir (default: 0 = one per CPU, at most one per input file)")
    flag(p, "skip_invalid_utf8", action="store_true",
         help="skip lines that are not valid UTF-8 (counted in the summary) instead of stopping with an error")


def _config(args: argparse.Namespace):
    from preprocessing.mlperf.create_pretraining_data import CreatePretrainingDataConfig

    return CreatePretrainingDataConfig(
        vocab_file=args.vocab_file, do_lower_case=args.do_lower_case, max_seq_length=args.max_seq_length,
        max_predictions_per_seq=args.max_predictions_per_seq, random_seed=args.random_seed,
        dupe_factor=args.dupe_factor, masked_lm_prob=args.masked_lm_prob, short_seq_prob=args.short_seq_prob,
        skip_invalid_utf8=args.skip_invalid_utf8, impl=args.impl)


def plan_jobs(args: argparse.Namespace) -> tuple[list, list[Path]]:
    """The invocations, after every input and output path was checked (core.paths): no output may be
    an input (the text, the vocab) by any spelling, and --output_suffix cannot leave --output_dir."""
    from core.errors import InputError
    from core.paths import PathCheck, check_suffix
    from preprocessing.mlperf.cpd_run import Job, expand_inputs

    pc = PathCheck()
    for pattern in (x.strip() for x in args.input_file.split(",")):
        if pattern and not glob.has_magic(pattern):
            pc.input_file("--input_file", pattern)  # a precise reason: a folder, a FIFO, unreadable ...
    inputs = pc.input_files("--input_file", expand_inputs(args.input_file))
    pc.input_file("--vocab_file", args.vocab_file, "vocab file")
    if args.output_dir:
        check_suffix("--output_suffix", args.output_suffix)
        names = [p.name for p in inputs]
        if len(set(names)) != len(names):
            raise InputError("--output_dir needs input files with distinct names; use --output_file instead")
        out_dir = pc.output_dir("--output_dir", args.output_dir, [f"{n}{args.output_suffix}" for n in names])
        return [Job((p,), (out_dir / f"{p.name}{args.output_suffix}",)) for p in inputs], inputs
    outs = [o.strip() for o in args.output_file.split(",") if o.strip()]
    if not outs:
        raise InputError(f"--output_file {args.output_file!r} names no file; give the TFRecord path(s)")
    for i, o in enumerate(outs):
        if any(_same(o, o2) for o2 in outs[:i]):
            raise InputError(f"--output_file names {o} twice; give distinct output files")
    return [Job(tuple(inputs), tuple(pc.output_file("--output_file", o) for o in outs))], inputs


def _same(a: str, b: str) -> bool:
    from core.paths import same_file

    return same_file(a, b)


def run(args: argparse.Namespace) -> int:
    from preprocessing.mlperf.cpd_run import summary, timed_jobs

    t0 = time.perf_counter()
    cfg = _config(args)
    cfg.validate()
    jobs, inputs = plan_jobs(args)
    log.info("*** Reading from input files ***")
    for p in inputs:
        log.info("  %s", p)
    log.info("*** Writing to output files ***")
    for job in jobs:
        for o in job.outputs:
            log.info("  %s", o)
    stats, _ = timed_jobs(jobs, cfg, args.workers)
    log.info("Wrote %d total instances", sum(s.instances for s in stats))
    log.info("%s", summary(stats, time.perf_counter() - t0))
    return 0
