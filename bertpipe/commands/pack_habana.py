"""Pack padded HDF5 for Habana's BERT trainer (HabanaAI Model-References ``pack_pretraining_data_pytorch.py``).

  bertpipe pack-habana --input_dir hdf5/ --output_dir packed/ --max_predictions_per_sequence 76

Inputs: the files of --input_dir whose name contains "training" (the script's rule), taken in sorted order
(the script takes os.listdir's order: with a sorted listing it writes the same packs). Output: --output_dir
holds mixed_strategies_part_<i>.hdf5 (4,480 packs each) and nothing else, for Habana's run_pretraining.py
--input_dir (packed mode, its default, reads every file there); <output_dir>_metadata.json beside it
(avg_seq_per_sample for the trainer); bertpipe's manifest beside it too, <output_dir>.manifest.json.

The script drops the packs after its last whole file of 4,480; bertpipe writes them as one more file
(--keep_partial_last=False: the script's files exactly). --local_rank defaults to $LOCAL_RANK, else -1, as in
the script: the seed used is --seed + --local_rank (41 by default). Needs SciPy (scipy.optimize.nnls).

--compression none writes the same files uncompressed (the script gzips every dataset at level 4, zlib's deflate,
nearly all of its CPU): the same datasets, dtypes, shapes and values, which Habana's trainer reads alike, in ~5.7x
the bytes. Its files are not the script's bytes; its manifest says compression "none". With --dtypes narrow
(the habana-packed-narrow target) each dataset is stored in its narrowest integer type (int16 token ids and
positions, int8 sequence numbers and flags): the same values, which the trainer casts to int64 as it reads them,
in ~46% of the uncompressed bytes; its manifest says dtypes "narrow".
"""

from __future__ import annotations

import argparse
import logging
import os
from pathlib import Path

from bertpipe.commands._common import bool_flag, flag, nonneg_int, number, overwrite_flag, positive_int
from core.errors import InputError

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    flag(p, "input_dir", required=True, help="folder of padded MLPerf HDF5; its files named *training* are read")
    flag(p, "output_dir", required=True, help="folder for mixed_strategies_part_<i>.hdf5 (only those: Habana's "
                                               "trainer reads every file of it)")
    flag(p, "max_sequence_length", type=number(int, 2, 1 << 15), default=512,
         help="pack length; every sequence must fit (default: 512)")
    p.add_argument("--max-predictions-per-sequence", "--max_predictions_per_sequence", "--max_predictions_per_seq",
                   dest="max_predictions_per_sequence", type=positive_int(1 << 15), default=80,
                   help="a pack holds up to this + max_sequences_per_pack masked positions (default: 80, the "
                        "script's; MLPerf data: 76)")
    flag(p, "max_sequences_per_pack", type=number(int, 2, 4), default=3,
         help="sequences in a pack, at most (default: 3)")
    flag(p, "seed", type=number(int, 0, (1 << 32) - 1), default=42, help="random seed (default: 42)")
    flag(p, "local_rank", type=number(int, -1, 1 << 20), default=os.environ.get("LOCAL_RANK", "-1"),
         help="added to the seed, as in the script (default: $LOCAL_RANK, else -1)")
    flag(p, "train_batch_size", type=positive_int(), default=8, help="accepted and unused, as in the script")
    flag(p, "disable_progress_bar", action="store_true", help="accepted (bertpipe shows no progress bar here)")
    flag(p, "workers", type=nonneg_int(4096), default=0,
         help="processes that write groups of files; same bytes for any number (default: 0 = one per CPU)")
    flag(p, "compression", choices=("gzip", "none"), default="gzip",
         help="gzip: the script's files (gzip level 4); none: the same datasets uncompressed, which Habana's trainer "
              "reads alike, for none of the deflate's CPU and ~5.7x the bytes (default: gzip)")
    flag(p, "dtypes", choices=("script", "narrow"), default="script",
         help="script: the script's dtypes (int32, int8 for segment ids and labels); narrow: each dataset in its "
              "narrowest integer type (int16 token ids and positions, int8 the rest), the same values, which "
              "Habana's trainer casts to int64 as it reads them: the same tensors from ~46%% of the bytes "
              "(default: script)")
    bool_flag(p, "keep_partial_last", True, "write the packs after the last whole file of 4,480 as one more file "
                                            "(the script drops them)")
    overwrite_flag(p)


def run(args: argparse.Namespace) -> int:
    from core.paths import PathCheck
    from preprocessing.habana.pack import (
        PART_RE,
        HabanaPackConfig,
        check_config,
        run_pack_habana,
        training_files,
    )

    pc = PathCheck(overwrite=args.overwrite)
    in_dir = pc.input_dir("--input_dir", args.input_dir)
    pc.output_dir("--output_dir", args.output_dir, stage="pack_habana")
    out = Path(args.output_dir).resolve()
    if not out.name or out.parent == out:
        raise InputError(f"--output_dir {args.output_dir} is the root folder; give a folder for the packed files")
    cfg = HabanaPackConfig(max_sequence_length=args.max_sequence_length,
                           max_predictions_per_sequence=args.max_predictions_per_sequence,
                           max_sequences_per_pack=args.max_sequences_per_pack, seed=args.seed,
                           local_rank=args.local_rank, keep_partial_last=args.keep_partial_last,
                           compression=args.compression, dtypes=args.dtypes)
    check_config(cfg)  # its messages name the flag
    files = training_files(in_dir)
    if not files:
        raise InputError(f"--input_dir {in_dir} has no file whose name contains 'training' (Habana's packer reads "
                         "only those, e.g. wikicorpus_en_training_0.hdf5); MLPerf's part-*.hdf5 are not named so: "
                         "link them under such names")
    files = pc.input_files("--input_dir", files, "padded HDF5")
    if out.is_dir():
        foreign = sorted(e.name for e in os.scandir(out) if not PART_RE.match(e.name) and ".tmp-" not in e.name)
        if foreign:
            raise InputError(f"--output_dir {out} holds {', '.join(foreign[:3])}{' ...' if len(foreign) > 3 else ''}; "
                             "Habana's trainer reads every file of its --input_dir as packed data: choose an empty "
                             "or new folder")
    from core.pools import default_workers

    try:
        m = run_pack_habana(files, out, cfg, manifest_name=f"../{out.name}.manifest.json",
                            workers=args.workers or default_workers())
    except BaseException:  # Ctrl-C, SIGTERM, an error: the pool's workers are stopped; sweep their temp files
        from core.manifest import remove_debris

        if out.is_dir():
            remove_debris(out)
        raise
    c = m.counters
    log.info("%d sequences -> %d packs (%.4f sequences a pack) in %d file(s) in %s%s", c["sequences"], c["packs"],
             c["avg_seq_per_sample"], c["files"], out,
             f"; {c['dropped_packs']} packs dropped (--keep_partial_last=False)" if c["dropped_packs"] else "")
    log.info("metadata: %s; manifest: %s; train with Habana's run_pretraining.py --input_dir %s",
             out.with_name(f"{out.name}_metadata.json"), out.with_name(f"{out.name}.manifest.json"), out)
    return 0
