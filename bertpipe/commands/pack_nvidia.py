"""NVIDIA's packed MLPerf BERT training set: its four packed_data scripts in one command.

  bertpipe pack-nvidia --input_hdf5 hdf5/ --output_hdf5 packed_data/ --shards_num 4320 --workers 8

= create_per_seqlength_data.py -> gather_per_seqlength_data.py -> generate_packing_strategy.py
(--max_seq_length 512 --max_seq_per_sample 3 --shards_num 4320) -> create_packed_trainset.py
(NVIDIA training_results v2.0-v3.1, input_preprocessing/packed_data/).

--input_hdf5: the training instances in part order: a folder (its files whose name holds "part", sorted), a
glob (quote it; sorted) or one file. Padded MLPerf HDF5 (tfrecord-to-hdf5's part-XXXXX-of-00500.hdf5) or an
unshuffled re-sharding of them, padded or variable-length (chop_hdf5_files.py / chop_hdf5_files_to_varlength.py
shards); not shuffle_samples.py's output.

--output_hdf5 gets shard_list_NNNNN.lst (the packing strategy, JSON, as generate_packing_strategy.py writes it),
part_NNNNN.hdf5 (the packs: what run_pretraining.py --packed_samples reads; --reference_names: part_NNNNN, v3.1
script's names) and _manifest.json (last). The packing report (the "expected speed-up from packing") is logged.
NVIDIA's generate_packing_strategy.py leaves Python's random unseeded; bertpipe seeds it (--seed): the script
with random.seed(SEED) at its top writes the same shard lists. Memory: the largest input file plus ~24 bytes per
sequence; scratch (about the inputs' unpadded size) inside --output_hdf5 while it runs.
"""

from __future__ import annotations

import argparse
import glob
import logging
from pathlib import Path

from bertpipe.commands._common import bool_flag, flag, nonneg_int, number, overwrite_flag, positive_int
from core.errors import InputError

log = logging.getLogger(__name__)


def _nonempty(text: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a path, got an empty string")
    return text


def add_arguments(p: argparse.ArgumentParser) -> None:
    flag(p, "input_hdf5", required=True, type=_nonempty,
         help="the instances in part order: a folder (its *part* files, sorted), a glob (quoted) or a file")
    flag(p, "output_hdf5", required=True, type=_nonempty,
         help="folder for shard_list_NNNNN.lst, part_NNNNN.hdf5 and the manifest")
    flag(p, "max_seq_length", type=number(int, 2, 32767), default=512,
         help="tokens a pack holds at most (default: 512)")
    flag(p, "max_seq_per_sample", type=number(int, 2, 8), default=3,
         help="sequences a pack holds at most (default: 3; at 512, 4 means an NNLS over ~0.9 M strategies)")
    flag(p, "shards_num", type=positive_int(1 << 20), default=4320, help="output shards (default: 4320)")
    flag(p, "seed", type=nonneg_int((1 << 63) - 1), default=12345,
         help="seed of the shuffles (NVIDIA's script: unseeded) (default: 12345)")
    bool_flag(p, "reference_names", False, "name the shards part_NNNNN (no .hdf5) as v3.1's "
              "create_packed_trainset.py does")
    flag(p, "workers", type=nonneg_int(4096), default=0,
         help="processes that read the inputs and write groups of shards; same bytes for any number "
              "(default: 0 = one per CPU)")
    overwrite_flag(p)


def expand_inputs(spec: str) -> list[Path]:
    """A folder (its entries whose name holds "part", sorted), one file, or a glob (sorted matches); every entry
    must be a plain file (or a link to one)."""
    from preprocessing.hdf5_check import check_kinds, folder_entries

    p = Path(spec)
    if p.is_dir():  # an input-like name that is a folder, a FIFO or a broken link is refused, not skipped
        return folder_entries(p, lambda n: "part" in n and not n.startswith("."))
    if p.exists() or not glob.has_magic(spec):
        return [p]
    found = sorted(Path(x) for x in glob.glob(spec))
    check_kinds(found)
    return found


def run(args: argparse.Namespace) -> int:
    from core.paths import PathCheck, is_dir
    from preprocessing.nvidia.pack import InputFile, PackNvidiaConfig, output_names, run_pack_nvidia

    pc = PathCheck(overwrite=args.overwrite)
    if is_dir("--input_hdf5", Path(args.input_hdf5)):
        pc.input_dir("--input_hdf5", args.input_hdf5)
    files = expand_inputs(args.input_hdf5)
    if not files:
        raise InputError(f"--input_hdf5 {args.input_hdf5!r} names no HDF5 file (a folder needs files named "
                         "part*, e.g. part-00000-of-00500.hdf5)")
    files = pc.input_files("--input_hdf5", files, "HDF5 file")
    cfg = PackNvidiaConfig(max_seq_length=args.max_seq_length, max_seq_per_sample=args.max_seq_per_sample,
                           shards_num=args.shards_num, seed=args.seed, reference_names=args.reference_names)
    out = pc.output_dir("--output_hdf5", args.output_hdf5, stage="pack_nvidia")
    present = [n for n in output_names(cfg) if (out / n).exists()] if out.is_dir() else []
    if present:  # an input hard-linked (or the same file) under an output's name would be replaced
        pc.output_dir("--output_hdf5", out, present, stage="pack_nvidia")
    for f in files:  # every input's layout, before anything is written
        try:
            InputFile(f).close()
        except InputError as exc:
            raise InputError(f"--input_hdf5: {exc}") from None
    from core.pools import default_workers

    try:
        m = run_pack_nvidia(files, out, cfg, workers=args.workers or default_workers())
    except BaseException:  # Ctrl-C, SIGTERM, an error: the pool's workers are stopped; sweep their temp files
        from core.manifest import remove_debris

        if out.is_dir():
            remove_debris(out)
        raise
    c = m.counters
    log.info("%d sequences -> %d packs (expected speed-up from packing %.3f), %d shards (%d empty) in %s",
             c["sequences"], c["packs"], c["speedup"], c["shards"], c["empty_shards"], out)
    return 0
