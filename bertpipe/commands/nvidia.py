"""NVIDIA's MLPerf BERT data scripts (training_results v1.1 .. v3.1, input_preprocessing/), one command each.

  bertpipe chop-hdf5 --input_hdf5_dir hdf5/training --output_hdf5_dir hdf5/training-4320 --num_shards 4320
  bertpipe chop-hdf5 --varlength ...            # chop_hdf5_files_to_varlength.py: the shards in the packed form
  bertpipe chop-hdf5 --rule v1.1 ...            # v1.1's chop rule (the 2,048 list, v1.1's 4,320 list)
  bertpipe shuffle-samples --input_hdf5 training-4320/hdf5_4320_shards_varlength \\
      --output_hdf5 training-4320/hdf5_4320_shards_varlength_shuffled
  bertpipe pick-eval-samples-varlength --input_hdf5_file eval/eval_all.hdf5 \\
      --output_hdf5_file eval_varlength/part_eval_10k --num_examples_to_pick 10000

Each takes the script's flags (and the dashed spelling: --num-shards). chop-hdf5 --rule names the round whose
chop_hdf5_files.py it follows: v3.1 (default; the first `excess` shards one row short, every row kept) or v1.1
(every shard one row short, the rows past the last shard dropped). Where the script crashes, bertpipe refuses in one
line, except where v3.1's rows fill the shards evenly: there every shard gets `nominal` rows (on purpose; the script
dies on the last row). Where it silently drops rows (v1.1), bertpipe drops the same rows and says so. Check the result against NVIDIA's published
checksums with `bertpipe verify --against LIST --dir <shards folder>`: nvidia-4320 (4,320 shards, rule v3.1),
nvidia-4320-v1.1 (4,320, rule v1.1), nvidia-2048 (2,048, rule v1.1), nvidia-4320-shuffled (the output of
shuffle-samples on the v3.1 4,320 shards).
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from bertpipe.commands._common import flag, nonneg_int, overwrite_flag, positive_int
from core.errors import InputError
from core.paths import path_arg

log = logging.getLogger(__name__)

_HELP = {
    "chop-hdf5": "chop_hdf5_files.py (--rule: v3.1's or v1.1's): the padded part files resharded into N shards "
                 "(--varlength: "
                 "chop_hdf5_files_to_varlength.py); inputs sorted <input_hdf5_dir>/part-00???-of-00500.hdf5, outputs "
                 "<output_hdf5_dir>/hdf5_<N>_shards_uncompressed/ (or _varlength/) part_<k:05d>_of_<N:05d>.hdf5",
    "shuffle-samples": "shuffle_samples.py (v3.x, both steps): the rows of <input_hdf5>/part_0*.hdf5 shuffled across "
                       "the shards with random.Random(24), each shard keeping its row count",
    "pick-eval-samples-varlength": "pick_eval_samples_varlength.py: evenly spaced rows of a padded HDF5, in the "
                                   "packed form",
}


def _widths(p: argparse.ArgumentParser) -> None:
    flag(p, "max_seq_length", type=positive_int(1 << 16), default=512, help="width of the padded input (default: 512)")
    flag(p, "max_predictions_per_seq", type=positive_int(1 << 16), default=76,
         help="width of masked_lm_* (default: 76)")


def _workers(p: argparse.ArgumentParser) -> None:
    flag(p, "workers", type=nonneg_int(4096), default=0,
         help="processes; the bytes do not depend on it (default: 0 = one per CPU)")


def add_arguments_for(command: str, p: argparse.ArgumentParser) -> None:
    if command == "chop-hdf5":
        flag(p, "input_hdf5_dir", required=True, type=path_arg, help="folder of padded part-00???-of-00500.hdf5")
        flag(p, "output_hdf5_dir", required=True, type=path_arg,
             help="folder to write hdf5_<N>_shards_uncompressed/ (or _varlength/) into")
        flag(p, "num_shards", type=positive_int(1 << 20), default=2048, help="output shards (default: 2048; "
             "NVIDIA's prepare_data.sh: 4320, or 2048 below 256 nodes)")
        _widths(p)
        flag(p, "rule", choices=("v3.1", "v1.1"), default="v3.1",  # preprocessing.nvidia.chop.RULES (--help stays light)
             help="whose chop_hdf5_files.py: v3.1 (default: the first `excess` shards hold nominal-1 rows, the "
                  "others nominal, no row dropped; NVIDIA's current 4,320 lists) or v1.1 (every shard nominal-1 rows, "
                  "the rest dropped; the 2,048 list and v1.1's 4,320 list)")
        p.add_argument("--varlength", action="store_true",
                       help="write the shards in NVIDIA's packed form (chop_hdf5_files_to_varlength.py; the "
                            "folder is hdf5_<N>_shards_varlength)")
        _workers(p)
        overwrite_flag(p, "a shards folder that holds another data set")
    elif command == "shuffle-samples":
        flag(p, "input_hdf5", required=True, type=path_arg, help="folder of variable-length part_0*.hdf5 shards")
        flag(p, "output_hdf5", required=True, type=path_arg, help="folder to write the shuffled shards into")
        flag(p, "seed", type=nonneg_int((1 << 63) - 1), default=24,
             help="random.Random seed (default: 24, fixed in the reference)")
        p.add_argument("--index-lists", "--index_lists", dest="index_lists", action="store_true",
                       help="also write the reference's shard_indices_<k>.lst (JSON [[file, row], ...]; ~14 bytes "
                            "per row)")
        _workers(p)
        overwrite_flag(p)
    elif command == "pick-eval-samples-varlength":
        flag(p, "input_hdf5_file", required=True, type=path_arg, help="the padded HDF5 to pick from (eval_all.hdf5)")
        flag(p, "output_hdf5_file", required=True, type=path_arg,
             help="the packed HDF5 to write; .hdf5 is appended to a new name without a suffix, as the "
                  "reference appends it (part_eval_10k -> part_eval_10k.hdf5)")
        flag(p, "num_examples_to_pick", type=positive_int(), default=10000, help="rows to keep (default: 10000)")
        _widths(p)
    else:  # pragma: no cover - cli.COMMANDS names only the above
        raise ValueError(command)
    p.description = (p.description or "") + f"\n\n{_HELP[command]}."


def run_for(command: str, args: argparse.Namespace) -> int:
    return {"chop-hdf5": _chop, "shuffle-samples": _shuffle, "pick-eval-samples-varlength": _pick}[command](args)


def _workers_of(args: argparse.Namespace) -> int:
    from core.pools import default_workers

    return args.workers or default_workers()


def _foreign(folder: Path, expected: set[str], flag_name: str) -> None:
    """Refuse a folder holding files this command would not write (a trainer would read them as shards)."""
    if not folder.is_dir():
        return
    other = sorted(p.name for p in folder.iterdir() if p.name not in expected and ".tmp-" not in p.name)
    if other:
        more = f" and {len(other) - 3} more" if len(other) > 3 else ""
        raise InputError(f"{flag_name} {folder} already holds files this command does not write ({', '.join(other[:3])}"
                         f"{more}); a trainer would read them too: choose an empty or new folder")


def _chop(args: argparse.Namespace) -> int:
    from core.manifest import MANIFEST_NAME, remove_debris
    from core.paths import PathCheck
    from preprocessing.nvidia.chop import (
        INPUT_GLOB,
        ChopConfig,
        chop_layout,
        count_rows,
        input_files,
        run_nvidia_chop,
        shard_name,
        shards_folder,
    )

    cfg = ChopConfig(num_shards=args.num_shards, max_seq_length=args.max_seq_length, rule=args.rule,
                     max_predictions_per_seq=args.max_predictions_per_seq, varlength=args.varlength)
    pc = PathCheck(overwrite=args.overwrite)
    in_dir = pc.input_dir("--input_hdf5_dir", args.input_hdf5_dir)
    pc.output_dir("--output_hdf5_dir", args.output_hdf5_dir)
    out = pc.output_dir("--output_hdf5_dir", Path(args.output_hdf5_dir) / shards_folder(cfg), stage="nvidia_chop")
    files = pc.input_files("--input_hdf5_dir", input_files(in_dir), "padded HDF5")
    if not files:
        raise InputError(f"--input_hdf5_dir {in_dir} has no files named {INPUT_GLOB} (the reference's inputs: "
                         "NVIDIA's 500 part files, e.g. part-00000-of-00500.hdf5)")
    expected = {shard_name(k, cfg.num_shards) for k in range(cfg.num_shards)} | {MANIFEST_NAME}
    _foreign(out, expected, "--output_hdf5_dir")
    chop_layout(sum(count_rows(p, cfg) for p in files), cfg.num_shards, cfg.rule)  # the reference's crash cases, before writing
    try:
        m = run_nvidia_chop(files, out, cfg, workers=_workers_of(args))
    except BaseException:
        if out.is_dir():
            remove_debris(out)
        raise
    c = m.counters
    log.info("%d of %d rows -> %d shards in %s%s", c["rows"], c["rows_in"], c["files"], out,
             f" ({c['rows_dropped']} left out, as v1.1's script does)" if c["rows_dropped"] else "")
    return 0


def _shuffle(args: argparse.Namespace) -> int:
    import shutil

    from core.manifest import MANIFEST_NAME, remove_debris
    from core.paths import PathCheck
    from preprocessing.nvidia.shuffle import (
        INPUT_GLOB,
        SCRATCH,
        ShuffleConfig,
        input_files,
        list_name,
        run_nvidia_shuffle,
        shard_name,
    )

    pc = PathCheck(overwrite=args.overwrite)
    in_dir = pc.input_dir("--input_hdf5", args.input_hdf5)
    out = pc.output_dir("--output_hdf5", args.output_hdf5, stage="nvidia_shuffle")
    files = pc.input_files("--input_hdf5", input_files(in_dir), "variable-length HDF5")
    if not files:
        raise InputError(f"--input_hdf5 {in_dir} has no files named {INPUT_GLOB} (NVIDIA's variable-length shards, "
                         "e.g. part_00000_of_04320.hdf5: make them with chop-hdf5 --varlength)")
    n = len(files)
    expected = ({shard_name(k, n) for k in range(n)} | {list_name(k) for k in range(n)} | {MANIFEST_NAME, SCRATCH})
    _foreign(out, expected, "--output_hdf5")
    cfg = ShuffleConfig(seed=args.seed, index_lists=args.index_lists)
    try:
        m = run_nvidia_shuffle(files, out, cfg, workers=_workers_of(args))
    except BaseException:
        if out.is_dir():
            shutil.rmtree(out / SCRATCH, ignore_errors=True)
            remove_debris(out)
        raise
    log.info("%d rows shuffled across %d shards (random.Random(%d)) -> %s", m.counters["rows"], n, args.seed, out)
    return 0


def _pick(args: argparse.Namespace) -> int:
    from core.paths import PathCheck
    from preprocessing.nvidia.eval_pick import PickVarlenConfig, pick_eval_varlength_file

    pc = PathCheck()
    src = pc.input_file("--input_hdf5_file", args.input_hdf5_file, "padded HDF5")
    given = Path(args.output_hdf5_file)
    try:
        as_given = bool(given.suffix) or given.exists() or given.is_symlink() or str(given).endswith("/")
    except OSError:  # a name too long, a loop: PathCheck names the flag
        as_given = True
    dst = pc.output_file("--output_hdf5_file", given if as_given else given.with_name(given.name + ".hdf5"))
    cfg = PickVarlenConfig(num_examples_to_pick=args.num_examples_to_pick, max_seq_length=args.max_seq_length,
                           max_predictions_per_seq=args.max_predictions_per_seq)
    c = pick_eval_varlength_file(src, dst, cfg)
    log.info("picked %d of %d rows -> %s", c["picked"], c["rows_in"], dst)
    return 0
