"""Convert padded MLPerf HDF5 into NVIDIA's packed (variable-length) HDF5 (convert_fixed2variable.py).

  bertpipe pack-varlength --input eval_10k.hdf5 --output eval_varlength/part_eval_10k.hdf5
  bertpipe pack-varlength --input 'hdf5_2048_shards_uncompressed/part_*' --output hdf5_2048_shards_varlength/

Lengths are summed in int64, so the result is right under NumPy 2 too (NVIDIA's script truncates there).
"""

from __future__ import annotations

import argparse
import logging

from bertpipe.commands._common import flag, overwrite_flag, positive_int
from bertpipe.commands.tfrecord_to_hdf5 import _nonempty, check_paths

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input", required=True, type=_nonempty, help="a padded HDF5, a glob of them (quote it) or a directory (its *part* files)")
    p.add_argument("--output", required=True, type=_nonempty, help="the packed HDF5 (one input) or a directory")
    flag(p, "max_seq_length", type=positive_int(1 << 16), default=512, help="width of the padded input (default: 512)")
    flag(p, "max_predictions_per_seq", type=positive_int(1 << 16), default=76, help="width of masked_lm_* (default: 76)")
    overwrite_flag(p)


def run(args: argparse.Namespace) -> int:
    from preprocessing.nvidia.varlength import PackConfig, pack_varlength_file, run_pack_varlength

    cfg = PackConfig(max_seq_length=args.max_seq_length, max_predictions_per_seq=args.max_predictions_per_seq)
    inputs, out, as_dir = check_paths(args, "padded HDF5", "pack_varlength", "")
    if not as_dir:
        n = pack_varlength_file(inputs[0], out, cfg)
        log.info("%s -> %s: %d rows", inputs[0], out, n)
    else:
        m = run_pack_varlength(inputs, out, cfg)
        log.info("%d files, %d rows -> %s", m.counters.get("files", 0), m.counters.get("rows", 0), out)
    return 0
