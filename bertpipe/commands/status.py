"""Show the stages of a work dir: keys, done / corrupt / incomplete / missing, sizes.

  bertpipe status --work-dir work           # sizes checked (fast)
  bertpipe status --work-dir work --md5     # md5s re-checked too (as `bertpipe verify`)

"current" marks the keys of the last `bertpipe run` (work/last_run.json); other keys are outputs of runs
with other inputs or parameters, kept until you delete them.
"""

from __future__ import annotations

import argparse
from collections import Counter
from pathlib import Path


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--work-dir", "--work_dir", dest="work_dir", type=Path, default=Path("work"))
    p.add_argument("--md5", action="store_true", help="re-check md5s too (slower)")
    p.add_argument("--shards", action="store_true", help="one line per shard instead of per stage/key")


def run(args: argparse.Namespace) -> int:
    from preprocessing.errors import InputError
    from tasks.workdir import current_keys, scan

    if not args.work_dir.is_dir():
        raise InputError(f"work dir {args.work_dir} does not exist; run `bertpipe run --work-dir {args.work_dir}`")
    entries = scan(args.work_dir, check_md5=args.md5)
    current = current_keys(args.work_dir)
    groups: dict[tuple[str, str], list] = {}
    for e in entries:
        groups.setdefault((e.stage, e.key), []).append(e)
    print(f"{'stage':<14} {'key':<16} {'state':<22} {'files':>6} {'bytes':>14}  run")
    bad = 0
    for (stage, key), es in groups.items():
        states = Counter(e.state for e in es)
        bad += sum(n for s, n in states.items() if s != "done")
        label = ", ".join(f"{n} {s}" if len(es) > 1 else s for s, n in sorted(states.items()))
        mark = "current" if current.get(stage) == key else ("old" if current else "")
        print(f"{stage:<14} {key:<16} {label:<22} {sum(e.files for e in es):>6} {sum(e.bytes for e in es):>14,}  "
              f"{mark}")
        for e in es:
            if args.shards or e.state != "done":
                print(f"    {e.shard or '-':<30} {e.state:<10} {e.detail}")
    print(f"{len(entries)} outputs, {bad} not done" if entries else "no stage outputs yet")
    train = args.work_dir / "pretrain"
    if train.is_dir():  # the e2e flow's training run (DeepSpeed checkpoints, not a manifest stage)
        import json

        summary = train / "summary.json"
        if summary.is_file():
            s = json.loads(summary.read_text(encoding="utf-8"))
            print(f"training run {train}/: {s.get('steps')} steps ({s.get('stopped_by')}), final loss "
                  f"{s.get('final_loss')}, eval MLM accuracy {s.get('final_eval_mlm_accuracy')}")
        else:
            print(f"training run {train}/: no summary.json yet (running, or stopped before the end; --resume continues)")
    return 1 if bad else 0
