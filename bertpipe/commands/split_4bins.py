"""Split padded MLPerf HDF5 files into 4 sequence-length bins x N shards (Samsung MLPerf v1.1).

  bertpipe split-4bins --input_dir hdf5/ --output_dir 4bins/ --n_output_shards 2048 --workers 8

--workers processes count the inputs, then write groups of shards (the bytes do not depend on it).

Inputs are sorted(<input_dir>/part*), as in the reference; outputs <output_dir>/{128,256,384,512}/
part_<k>_of_<N>.hdf5 and nothing else (Samsung's trainer takes every entry of that folder as a bin and
sorts them by int(name)); the manifest goes beside the folder, <output_dir>.manifest.json. An output
folder holding other files is refused. A bin with fewer rows than shards (where the reference crashes)
gets its 0-row shards first, holding the six datasets with zero rows.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

from bertpipe.commands._common import flag, nonneg_int, overwrite_flag, positive_int
from core.errors import InputError

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    flag(p, "input_dir", required=True, help="directory of padded HDF5 files named part*")
    flag(p, "output_dir", required=True, help="directory to write 128/ 256/ 384/ 512/ into")
    flag(p, "n_output_shards", type=positive_int(1 << 20), default=2048, help="shards per bin (default: 2048)")
    flag(p, "workers", type=nonneg_int(4096), default=0,
         help="processes that count the inputs and write groups of shards; same bytes for any number "
              "(default: 0 = one per CPU)")
    overwrite_flag(p)


def run(args: argparse.Namespace) -> int:
    from core.paths import PathCheck
    from preprocessing.mlperf.split_4bins import Split4BinsConfig, run_split_4bins

    pc = PathCheck(overwrite=args.overwrite)
    in_dir = pc.input_dir("--input_dir", args.input_dir)
    files = sorted(p for p in in_dir.glob("part*") if not p.is_dir())
    if not files:
        raise InputError(f"--input_dir {in_dir} has no files named part* (e.g. part-00000-of-00500.hdf5)")
    files = pc.input_files("--input_dir", files, "padded HDF5")
    pc.output_dir("--output_dir", args.output_dir, stage="split_4bins")
    out = Path(args.output_dir).resolve()  # the manifest goes beside it: "../<name>.manifest.json" from inside
    if not out.name:
        raise InputError(f"--output_dir {args.output_dir} is the root folder; give a folder to write the bins into")
    _drop_inner_manifest(out)
    from core.pools import default_workers

    try:
        m = run_split_4bins(files, out, Split4BinsConfig(n_output_shards=args.n_output_shards),
                            workers=args.workers or default_workers(), manifest_name=f"../{out.name}.manifest.json")
    except BaseException:  # Ctrl-C, SIGTERM, an error: the pool's workers are stopped; sweep their temp files
        from core.manifest import remove_debris

        if out.is_dir():
            remove_debris(out)
        raise
    c = m.counters
    log.info("%d rows -> 128: %d, 256: %d, 384: %d, 512: %d (%d empty shards) in %s", c["rows"], c["rows_128"],
             c["rows_256"], c["rows_384"], c["rows_512"], c["empty_shards"], args.output_dir)
    log.info("manifest: %s", out.with_name(f"{out.name}.manifest.json"))
    return 0


def _drop_inner_manifest(out: Path) -> None:
    """An older bertpipe kept the manifest inside the output folder, where Samsung's trainer trips on it."""
    import json

    from core.manifest import MANIFEST_NAME

    inner = out / MANIFEST_NAME
    try:
        stage = json.loads(inner.read_text(encoding="utf-8")).get("stage")
    except (OSError, ValueError, AttributeError):
        return
    if stage == "split_4bins":
        inner.unlink()
