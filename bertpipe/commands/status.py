"""Show the stages of a work dir: keys, done / corrupt / incomplete / missing, sizes.

  bertpipe status --work-dir work           # sizes; md5s of files changed since they were checked
  bertpipe status --work-dir work --md5     # every md5 re-hashed (as `bertpipe verify`)

Every file's size, mtime, ctime and inode are recorded when its md5 is known to hold; by default only
files whose record changed are re-hashed, so a corrupted file is never called done (a same-size edit
changes the mtime and ctime). "current" marks the keys of the last `bertpipe run` (work/last_run.json):
only those count as "not done" (exit 1); other keys are outputs of runs with other inputs or parameters,
or debris of interrupted ones, kept until you delete them.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path

from core.paths import path_arg


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--work-dir", "--work_dir", dest="work_dir", type=path_arg, default=Path("work"))
    p.add_argument("--md5", action="store_true", help="re-hash every file (default: only files whose size, mtime "
                   "or inode changed since their md5 was last checked)")
    p.add_argument("--shards", action="store_true", help="one line per shard instead of per stage/key")


def run(args: argparse.Namespace) -> int:
    from core.errors import InputError
    from core.paths import PathCheck
    from tasks.workdir import current_keys, last_run, scan

    if not args.work_dir.exists():
        raise InputError(f"--work-dir {args.work_dir} does not exist; run `bertpipe run --work-dir {args.work_dir}`")
    PathCheck().input_dir("--work-dir", args.work_dir, "work dir")
    summary = last_run(args.work_dir)  # read once: a damaged last_run.json is one warning
    entries = scan(args.work_dir, check_md5=True, trust_stat=not args.md5, summary=summary)
    current = current_keys(args.work_dir, summary)
    groups: dict[tuple[str, str], list] = {}
    for e in entries:  # scan() lists stages in the registry's (DAG) order
        groups.setdefault((e.stage, e.key), []).append(e)
    w = max([14, *(len(e.stage) for e in entries)])  # nvidia_4320_shuffled and the like are longer
    print(f"{'stage':<{w}} {'key':<16} {'state':<22} {'files':>6} {'bytes':>14}  run")
    bad = stale = 0
    for (stage, key), es in groups.items():
        states = Counter(e.state for e in es)
        is_current = not current or current.get(stage) == key or (not key and stage in current)  # "": the stage
        # folder itself (a link out of the work dir, not looked into)
        n_bad = sum(n for st, n in states.items() if st not in ("done", "dropped"))
        bad += n_bad if is_current else 0
        stale += n_bad if not is_current else 0
        label = ", ".join(f"{n} {st}" if len(es) > 1 else st for st, n in sorted(states.items()))
        mark = "current" if current and is_current else ("old" if current else "")
        print(f"{stage:<{w}} {key:<16} {label:<22} {sum(e.files for e in es):>6} {sum(e.bytes for e in es):>14,}  "
              f"{mark}")
        for e in es:
            if args.shards or e.state not in ("done", "dropped"):
                print(f"    {e.shard or '-':<30} {e.state:<10} {e.detail}")
        dropped = [e for e in es if e.state == "dropped"]
        if dropped and not args.shards:
            print(f"    {len(dropped)} dropped: {dropped[0].detail}" if len(dropped) == 1 else
                  f"    {len(dropped)} shards dropped by --keep training (manifests kept; rebuilt by a run that "
                  f"needs them), e.g. {dropped[0].shard}: {dropped[0].detail}")
    if not entries:
        print("no stage outputs yet")
    else:
        how = "md5s re-checked" if args.md5 else "sizes checked; files whose size, mtime or inode changed re-hashed"
        print(f"{len(entries)} outputs ({how}): {bad} of the current data set not done"
              + (f"; {stale} in older runs' outputs (not used; safe to delete)" if stale else ""))
    _training_line(args.work_dir / "pretrain")
    return 1 if bad else 0


def _training_line(train: Path) -> None:
    """The e2e flow's training run (DeepSpeed checkpoints, not a manifest stage)."""
    if not train.is_dir():
        return
    import json

    summary = train / "summary.json"
    if summary.is_file():
        s = json.loads(summary.read_text(encoding="utf-8"))
        print(f"training run {train}/: {s.get('steps')} steps ({s.get('stopped_by')}), final loss "
              f"{s.get('final_loss')}, eval MLM accuracy {s.get('final_eval_mlm_accuracy')}")
    else:
        print(f"training run {train}/: no summary.json yet (running, or stopped before the end; --resume continues)")
