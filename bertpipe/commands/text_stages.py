"""One text stage at a time, on the reference's file layout (<dir>/AA/wiki_00<suffix>):

  bertpipe clean --extracted text --out work/clean            # wiki_00 -> wiki_00.2 (.1 with --keep-cleanup-output)
  bertpipe segment --input work/clean --out work/segment      # .2 -> .3
  bertpipe split-eval --input work/segment --out work/split --num_test_articles=10000   # .3 -> .4, eval.*
  bertpipe gather --input work/split --extracted text --out results --block_size=26.92  # .4 -> part-*

`bertpipe text` runs all four in one pass without the intermediate files.
"""

from __future__ import annotations

import argparse
import time

from bertpipe.commands._common import flag, nonneg_int, number, overwrite_flag, positive_int
from core.paths import path_arg


def block_size_flag(p: argparse.ArgumentParser) -> None:
    """``--block-size-mb`` (also ``--block_size_mb`` and do_gather's own ``--block_size``)."""
    p.add_argument("--block-size-mb", "--block_size_mb", "--block_size", dest="block_size_mb",
                   type=number(float, 0, 1e7, lo_open=True),
                   default=26.92, metavar="MB", help="part size limit, MiB of raw extractor input (default: 26.92)")


def _workers(p: argparse.ArgumentParser) -> None:
    p.add_argument("--workers", type=nonneg_int(4096), default=0, metavar="N", help="worker processes (default: one per CPU; "
                   "the output does not depend on it)")


def add_arguments_for(command: str, p: argparse.ArgumentParser) -> None:
    if command == "clean":
        p.add_argument("--extracted", type=path_arg, required=True, metavar="DIR", help="WikiExtractor output folder (AA/wiki_00, ...)")
        p.add_argument("--out", type=path_arg, required=True, metavar="DIR", help="folder for AA/wiki_00.2, ...")
        flag(p, "keep_cleanup_output", action="store_true", help="also write cleanup_file.py's .1 files")
    else:
        suffix = {"segment": ".2", "split-eval": ".3", "gather": ".4"}[command]
        p.add_argument("--input", type=path_arg, required=True, metavar="DIR", help=f"folder holding AA/wiki_00{suffix}, ...")
        p.add_argument("--out", type=path_arg, required=True, metavar="DIR", help="output folder")
    if command == "split-eval":
        flag(p, "num_test_articles", type=positive_int(), default=10000, metavar="N", help="articles withheld for eval (default: 10000)")
        flag(p, "seed", type=number(int, -(2**63), 2**63 - 1), default=12345, metavar="N", help="selection seed (default: 12345)")
    if command == "gather":
        p.add_argument("--extracted", type=path_arg, default=None, metavar="DIR",
                       help="WikiExtractor output folder: parts are sized by its raw files (default: --input)")
        block_size_flag(p)
        flag(p, "num_outputs", type=positive_int(99999), default=500, metavar="N", help="the N in part-XXXXX-of-N (default: 500)")
    if command != "gather":
        _workers(p)
    overwrite_flag(p)


STAGES = {"clean": "clean", "segment": "segment", "split-eval": "split_eval", "gather": "gather"}


def check_paths(command: str, args: argparse.Namespace) -> None:
    """Inputs are folders that exist; --out is not an input folder, nor a folder holding another data set."""
    from core.paths import PathCheck

    pc = PathCheck(overwrite=args.overwrite)
    if command == "clean":
        pc.input_dir("--extracted", args.extracted, "WikiExtractor output folder")
    else:
        pc.input_dir("--input", args.input)
    if command == "gather" and args.extracted is not None:
        pc.input_dir("--extracted", args.extracted, "WikiExtractor output folder")
    pc.output_dir("--out", args.out, ["_manifest.json", "eval.txt", "eval.md5"], stage=STAGES[command])


def run_for(command: str, args: argparse.Namespace) -> int:
    t0 = time.perf_counter()
    check_paths(command, args)
    if command == "clean":
        from preprocessing.text.clean import CleanConfig, run_clean

        m = run_clean(args.extracted, args.out, CleanConfig(keep_cleanup_output=args.keep_cleanup_output,
                                                            workers=args.workers))
    elif command == "segment":
        from preprocessing.text.segment import SegmentConfig, run_segment

        m = run_segment(args.input, args.out, SegmentConfig(workers=args.workers))
    elif command == "split-eval":
        from preprocessing.text.split_eval import SplitEvalConfig, run_split_eval

        m = run_split_eval(args.input, args.out, SplitEvalConfig(
            num_test_articles=args.num_test_articles, seed=args.seed, workers=args.workers))
    else:
        from preprocessing.text.gather import GatherConfig, run_gather

        m = run_gather(args.input, args.out, GatherConfig(block_size_mb=args.block_size_mb,
                                                          num_outputs=args.num_outputs), raw_dir=args.extracted)
    mb = sum(f.bytes for f in m.files) / 1e6
    extra = ", ".join(f"{k} {v}" for k, v in m.counters.items() if k != "files")
    print(f"{command}: {m.counters.get('files', 0)} files -> {args.out} ({len(m.files)} outputs, {mb:.2f} MB"
          f"{', ' + extra if extra else ''}), {time.perf_counter() - t0:.1f} s")
    return 0
