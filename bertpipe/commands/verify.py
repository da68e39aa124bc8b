"""Re-check every md5 of a work dir against its manifests (every stage, every shard).

  bertpipe verify --work-dir work

Exit status 0 when every manifest verifies, 1 otherwise: a file that differs (named with the expected and
actual md5), a damaged manifest, a folder trainers read holding a file bertpipe did not write, or an output the
last run made (work/last_run.json) that is gone; the next `bertpipe run` redoes exactly those stages or shards.

  bertpipe verify --against nvidia-4320 --dir hdf5/training-4320/hdf5_4320_shards_varlength

checks a folder of NVIDIA-format shards, shard by shard, against NVIDIA's published checksums (hdf5_md5.py digests).
The lists that ship with bertpipe, each named with the chop rule that made it: nvidia-4320 (v3.1's list, rule v3.1:
hdf5_4320_shards_varlength, --target nvidia-varlength), nvidia-4320-shuffled (v3.1's shuffled list:
hdf5_4320_shards_varlength_shuffled, --target nvidia-4320), nvidia-4320-v1.1 (v1.1's list, rule v1.1: --target
nvidia-4320-v1.1), nvidia-2048 (rule v1.1, the same list in both rounds: --target nvidia-2048-varlength) and
nvidia-eval (part_eval_10k.hdf5); or give the path of any .chk list. Exit 1 if a shard differs or is missing.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from core.paths import path_arg


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--work-dir", "--work_dir", dest="work_dir", type=path_arg, default=Path("work"))
    p.add_argument("--against", metavar="LIST",
                   help="check the shards of --dir against NVIDIA's published checksums instead: nvidia-4320 "
                        "(hdf5_4320_shards_varlength, chop rule v3.1), nvidia-4320-shuffled "
                        "(hdf5_4320_shards_varlength_shuffled), nvidia-4320-v1.1 (4,320 shards, rule v1.1), "
                        "nvidia-2048 (2,048 shards, rule v1.1) or nvidia-eval, the lists that ship with bertpipe "
                        "(preprocessing/nvidia/nvidia_chk/README.md), or the path of any .chk file")
    p.add_argument("--dir", dest="shard_dir", type=path_arg, metavar="DIR",
                   help="with --against: the folder of shards to check (e.g. hdf5_4320_shards_varlength)")


def run(args: argparse.Namespace) -> int:
    from core.errors import InputError

    if args.against is not None or args.shard_dir is not None:
        return _against(args)
    from core.paths import PathCheck
    from tasks.workdir import scan

    PathCheck().input_dir("--work-dir", args.work_dir, "work dir (of a `bertpipe run`)")
    t0 = time.perf_counter()
    entries = scan(args.work_dir, check_md5=True)
    if not entries:
        raise InputError(f"--work-dir {args.work_dir} holds no stage outputs (no <stage>/<key>/_manifest.json); "
                         "is it the work dir of a `bertpipe run`?")
    nbytes = sum(e.bytes for e in entries)
    bad = [e for e in entries if e.state not in ("done", "dropped")]
    for e in entries:
        if e.state == "done":
            print(f"ok   {e.path}: {e.files} files, {e.bytes:,} bytes")
        elif e.state == "dropped":
            print(f"drop {e.path}: {e.detail}")
        elif e.state == "missing":
            print(f"BAD  {e.path}: missing: {e.detail}; the next `bertpipe run` makes it again")
        else:
            print(f"BAD  {e.path}: {e.state}: {e.detail}")
    dt = time.perf_counter() - t0
    print(f"{len(entries)} outputs, {nbytes:,} bytes re-hashed in {dt:.1f} s ({nbytes / 1e6 / max(dt, 1e-9):.0f} "
          f"MB/s): {'all verify' if not bad else f'{len(bad)} do not verify'}", file=sys.stderr)
    return 1 if bad else 0


#: mismatches printed one a line (and names in a summary) without -v
SHOWN = 10


def _names(names: list[str], shown: int | None) -> str:
    first = names if shown is None else names[:3]
    return ", ".join(first) + (f", ... ({len(names) - len(first):,} more; -v lists all)" if len(names) > len(first)
                               else "")


def _against(args: argparse.Namespace) -> int:
    """``--against LIST --dir DIR``: NVIDIA's hdf5_md5 digest of every listed shard, compared (issue 20)."""
    from core.errors import InputError
    from core.paths import PathCheck
    from core.pools import default_workers
    from preprocessing.nvidia.md5 import read_chk, resolve_chk, unlisted, verify_against

    if args.against is None or args.shard_dir is None:
        raise InputError("--against and --dir go together: --against nvidia-4320 --dir <folder of shards>")
    folder = PathCheck().input_dir("--dir", args.shard_dir, "folder of shards")
    chk_path = resolve_chk(args.against)
    expected = read_chk(chk_path)
    t0 = time.perf_counter()
    results = verify_against(folder, expected, workers=default_workers())
    shown = None if args.verbose else SHOWN
    wrong = [r for r in results if r.actual and not r.ok]
    odd = [r for r in results if r.problem]
    missing = [r.name for r in results if not r.actual and not r.problem]
    for r in wrong[:shown]:
        print(f"BAD  {r.name}: hdf5_md5 {r.actual}, {chk_path.name} lists {r.expected}")
    for r in odd[:shown]:
        print(f"BAD  {r.name}: {r.problem}")
    if missing:
        print(f"BAD  {len(missing):,} listed shard(s) missing from {folder}: {_names(missing, shown)}")
    extra = unlisted(folder, expected)
    if extra:
        print(f"BAD  {len(extra):,} entr{'y' if len(extra) == 1 else 'ies'} of {folder} not in {chk_path.name} (a "
              f"trainer reading the folder would take them for data): {_names(extra, shown)}")
    if args.verbose:
        for r in results:
            if r.ok:
                print(f"ok   {r.name}")
    elif len(wrong) + len(odd) > SHOWN:
        print(f"...  {len(wrong) + len(odd) - SHOWN:,} more mismatch(es): -v lists every one")
    dt = time.perf_counter() - t0
    parts = [f"{n:,} {what}" for n, what in ((len(wrong), "differ"), (len(odd), "no plain file"),
                                              (len(missing), "missing"), (len(extra), "unlisted")) if n]
    bad = parts
    print(f"{len(results):,} shards of {chk_path.name} checked in {dt:.1f} s ({sum(r.ok for r in results):,} "
          f"match): {'all match' if not bad else ', '.join(parts)}", file=sys.stderr)
    return 1 if bad else 0
