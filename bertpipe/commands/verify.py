"""Re-check every md5 of a work dir against its manifests (every stage, every shard).

  bertpipe verify --work-dir work

Exit status 0 when every manifest verifies, 1 otherwise: a file that differs (named with the expected and
actual md5), a damaged manifest, a folder trainers read holding a file bertpipe did not write, or an output the
last run made (work/last_run.json) that is gone; the next `bertpipe run` redoes exactly those stages or shards.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from core.paths import path_arg


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--work-dir", "--work_dir", dest="work_dir", type=path_arg, default=Path("work"))


def run(args: argparse.Namespace) -> int:
    from core.errors import InputError
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
