"""Re-check every md5 of a work dir against its manifests (every stage, every shard).

  bertpipe verify --work-dir work

Exit status 0 when every manifest verifies, 1 otherwise (each bad file is named with the expected and
actual md5; the next `bertpipe run` redoes exactly those stages or shards).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--work-dir", "--work_dir", dest="work_dir", type=Path, default=Path("work"))


def run(args: argparse.Namespace) -> int:
    from preprocessing.errors import InputError
    from preprocessing.manifest import MANIFEST_NAME
    from tasks.workdir import SKIP, check_dir

    if not args.work_dir.is_dir():
        raise InputError(f"work dir {args.work_dir} does not exist")
    t0, n, nbytes, bad = time.perf_counter(), 0, 0, 0
    for mf in sorted(args.work_dir.rglob(MANIFEST_NAME)):
        rel = mf.parent.relative_to(args.work_dir)
        if rel.parts and rel.parts[0] in SKIP:
            continue
        state, files, size, detail = check_dir(mf.parent, check_md5=True)
        n, nbytes = n + 1, nbytes + size
        if state != "done":
            bad += 1
            print(f"BAD  {rel}: {detail}")
        else:
            print(f"ok   {rel}: {files} files, {size:,} bytes")
    dt = time.perf_counter() - t0
    print(f"{n} manifests, {nbytes:,} bytes re-hashed in {dt:.1f} s ({nbytes / 1e6 / max(dt, 1e-9):.0f} MB/s): "
          f"{'all verify' if not bad else f'{bad} do not verify'}", file=sys.stderr)
    return 1 if bad else 0
