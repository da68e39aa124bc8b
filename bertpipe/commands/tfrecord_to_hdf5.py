"""Convert MLPerf TFRecords to padded HDF5 in the Samsung MLPerf layout, one HDF5 per TFRecord.

  bertpipe tfrecord-to-hdf5 --input eval_10k --output eval_10k.hdf5
  bertpipe tfrecord-to-hdf5 --input 'tfrecords/part-*' --output hdf5/     # hdf5/<name>.hdf5 + _manifest.json

A single input file goes to --output as a file unless --output is an existing directory (or ends
in '/'); a glob or a directory (its files named *part*) goes into the --output directory as
<name>.hdf5, with a manifest.
"""

from __future__ import annotations

import argparse
import glob
import logging
from pathlib import Path

from bertpipe.commands._common import flag, overwrite_flag, positive_int
from core.errors import InputError

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True, type=_nonempty, help="a TFRecord, a glob of TFRecords (quote it) or a directory (its *part* files)")
    p.add_argument("--output", required=True, type=_nonempty, help="the HDF5 file (one input) or a directory")
    flag(p, "max_seq_length", type=positive_int(1 << 16), default=512, help="values per input_ids row (default: 512)")
    flag(p, "max_predictions_per_seq", type=positive_int(1 << 16), default=76, help="values per masked_lm_* row (default: 76)")
    overwrite_flag(p)


def _nonempty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return text


def expand_inputs(spec: str) -> list[Path]:
    """A file, a directory (its files whose name contains "part", sorted, as Samsung's
    run_trans_tfrecord_to_hdf5.sh) or a glob (sorted matches)."""
    p = Path(spec)
    if p.is_dir():
        files = sorted(x for x in p.iterdir() if x.is_file() and "part" in x.name and not x.name.startswith("."))
    elif p.is_file():
        files = [p]
    else:
        files = sorted(Path(x) for x in glob.glob(spec) if Path(x).is_file())
    if not files:
        raise InputError(f"no TFRecord file matches --input {spec!r}")
    return files


def check_paths(args: argparse.Namespace, what: str, stage: str, suffix: str) -> tuple[list[Path], Path, bool]:
    """(inputs, output, whether the output is a folder), every path checked (core.paths) first: an
    output that is an input (by any spelling, or in its folder) is refused, and a folder holding another
    data set needs --overwrite."""
    from core.paths import PathCheck, is_dir

    pc = PathCheck(overwrite=args.overwrite)
    p = Path(args.input)
    if is_dir("--input", p):
        pc.input_dir("--input", p)
    elif not glob.has_magic(args.input):
        pc.input_file("--input", p, what)
    inputs = pc.input_files("--input", expand_inputs(args.input), what)
    out = Path(args.output)
    as_dir = is_dir("--output", out) or args.output.endswith(("/", "\\")) or not Path(args.input).is_file()
    if len(inputs) == 1 and not as_dir:
        return inputs, pc.output_file("--output", out), False
    if out.exists() and not out.is_dir():
        raise InputError(f"--output {out} is a file, but {len(inputs)} inputs need a directory")
    names = [x.name + suffix for x in inputs] + ["_manifest.json"]
    return inputs, pc.output_dir("--output", out, names, stage=stage), True


def run(args: argparse.Namespace) -> int:
    from preprocessing.mlperf.tfrecord_to_hdf5 import (
        HDF5Config,
        run_tfrecord_to_hdf5_many,
        tfrecord_to_hdf5_file,
    )

    cfg = HDF5Config(max_seq_length=args.max_seq_length, max_predictions_per_seq=args.max_predictions_per_seq)
    inputs, out, as_dir = check_paths(args, "TFRecord", "tfrecord_to_hdf5", ".hdf5")
    if not as_dir:
        n = tfrecord_to_hdf5_file(inputs[0], out, cfg)
        log.info("%s -> %s: %d records", inputs[0], out, n)
    else:
        m = run_tfrecord_to_hdf5_many(inputs, out, cfg)
        log.info("%d files, %d records -> %s", m.counters.get("files", 0), m.counters.get("records", 0), out)
    return 0
