"""Run a Prefect flow locally: the data DAG (default), pre-training, or both (e2e).

  bertpipe run --work-dir work                                       # built-in sample, learned vocab
  bertpipe run --text-dir results --vocab vocab.txt --work-dir work  # MLCommons' text, MLPerf flags
  bertpipe run --dump enwiki-20200101 --vocab vocab.txt --work-dir work --workers 16
  bertpipe run ... --only hdf5          # one stage; fails naming the missing upstream stage if needed
  bertpipe run ... --force tfrecord     # redo a stage even though its manifests verify
  bertpipe run ... --dask-address tcp://scheduler:8786                # shard tasks on a Dask cluster
  bertpipe run e2e --work-dir work --max-steps 20                     # data, then a short CPU training run

A second run over the same inputs finds every stage done (its manifests verify) and runs nothing.
With --dask-address the work dir must be on a file system that every Dask worker mounts at the same path.
Only one run at a time per work dir: a second one refuses at once (or waits: --wait-lock SECONDS).
Prefect: with no PREFECT_API_URL a temporary local server is started for the run.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from bertpipe.commands._common import bool_flag, flag


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("flow", nargs="?", choices=("data", "pretrain", "e2e"), default="data",
                   help="which flow (default: data)")
    src = p.add_argument_group("source (default: the built-in sample)")
    src.add_argument("--text-dir", "--text_dir", dest="text_dir", help="MLCommons' text: part-*-of-00500 + eval.txt")
    src.add_argument("--link-text", dest="link_text", action="store_true",
                     help="hard-link --text-dir's files into the work dir instead of copying them")
    src.add_argument("--dump", help="a dump path, URL or preset (enwiki-latest, enwiki-20200101)")
    src.add_argument("--dump-md5", "--dump_md5", dest="source_md5", help="expected md5 of --dump")
    src.add_argument("--vocab", "--vocab_file", dest="vocab", help="BERT vocab.txt (default: learn one: vocab stage)")
    flag(src, "vocab_size", type=int, help="size of a learned vocab (default 30522; sample 8000)")
    flag(src, "num_test_articles", type=int, help="eval articles withheld from a dump (default 10000; sample 5)")
    flag(src, "current_time", help="ISO time for {{CURRENTYEAR}} & co. during extraction")
    p.add_argument("--work-dir", "--work_dir", dest="work_dir", default="work", help="work dir (default: work)")
    ref = p.add_argument_group("reference flags (MLPerf defaults)")
    flag(ref, "max_seq_length", type=int, default=512)
    flag(ref, "max_predictions_per_seq", type=int, default=76)
    flag(ref, "dupe_factor", type=int, default=10)
    flag(ref, "masked_lm_prob", type=float, default=0.15)
    flag(ref, "random_seed", type=int, default=12345)
    flag(ref, "short_seq_prob", type=float, default=0.1)
    bool_flag(ref, "do_lower_case", True, "lower-case the text (uncased vocab)")
    flag(ref, "num_examples_to_pick", type=int, default=10000, help="eval_10k size")
    flag(ref, "n_output_shards", type=int, help="shards per length bin (default 2048; sample 8)")
    run = p.add_argument_group("execution")
    run.add_argument("--only", action="append", default=None, metavar="STAGE", help="run only this stage (repeatable)")
    run.add_argument("--force", action="append", default=[], metavar="STAGE", help="redo this stage (repeatable)")
    run.add_argument("--workers", type=int, default=0, help="parallel shard tasks (0: one per CPU; 1: serial)")
    run.add_argument("--runner", choices=("local", "prefect-process", "dask"), default="local",
                     help="local: threads + worker processes (default); prefect-process: Prefect's process pool")
    run.add_argument("--dask-address", "--dask_address", dest="dask_address", help="run shard tasks on this Dask cluster")
    run.add_argument("--no-md5", dest="verify_md5", action="store_false",
                     help="'done' checks sizes only (fast re-runs of huge work dirs; `bertpipe verify` checks md5s)")
    run.add_argument("--wait-lock", dest="wait_lock_s", type=float, default=0.0, metavar="SECONDS",
                     help="wait this long for a work dir in use by another run (default: refuse at once)")
    tr = p.add_argument_group("pre-training (pretrain / e2e)")
    tr.add_argument("--model", default="tiny", help="tiny | large | 1.5b | 5b (default: tiny)")
    tr.add_argument("--max-steps", "--max_steps", dest="max_steps", type=int, default=20)
    tr.add_argument("--nproc", type=int, default=1, help="ranks on this node")
    tr.add_argument("--learning-rate", "--learning_rate", dest="learning_rate", type=float,
                    help="peak learning rate (default: bertpipe train's)")
    tr.add_argument("--train-dir", dest="train_dir", help="pretrain only: 4-bin HDF5 folder")
    tr.add_argument("--eval-file", dest="eval_file", help="pretrain only: eval HDF5")
    tr.add_argument("--output-dir", dest="output_dir", help="training output (default: <work>/pretrain)")


def data_params(args: argparse.Namespace):  # -> DataParams (pydantic imported lazily)
    """The flow parameters of ``args`` (InputError with pydantic's message when one is invalid)."""
    from pydantic import ValidationError

    from flows.params import DataParams
    from preprocessing.errors import InputError

    values = {"work_dir": args.work_dir, "text_dir": args.text_dir, "link_text": args.link_text, "source": args.dump or "sample",
              "source_md5": args.source_md5, "vocab": args.vocab, "vocab_size": args.vocab_size,
              "num_test_articles": args.num_test_articles, "current_time": args.current_time,
              "max_seq_length": args.max_seq_length, "max_predictions_per_seq": args.max_predictions_per_seq,
              "dupe_factor": args.dupe_factor, "masked_lm_prob": args.masked_lm_prob, "random_seed": args.random_seed,
              "short_seq_prob": args.short_seq_prob, "do_lower_case": args.do_lower_case,
              "num_eval_examples": args.num_examples_to_pick, "n_output_shards": args.n_output_shards,
              "workers": args.workers, "runner": args.runner, "dask_address": args.dask_address,
              "stages": args.only, "force": args.force, "verify_md5": args.verify_md5, "wait_lock_s": args.wait_lock_s}
    try:
        return DataParams(**values)
    except ValidationError as exc:
        msgs = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise InputError(f"invalid parameters: {msgs}") from None


def prefect_env(quiet: bool = False) -> None:
    """Before Prefect is imported: forward library loggers to the run logger; quieter console if asked."""
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "preprocessing,pretrain,tasks,flows")
    if quiet:
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    for noisy in ("httpx", "httpcore", "distributed", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


_REAPER = r"""
while kill -0 "$1" 2>/dev/null; do sleep 1; done
for d in /proc/[0-9]*; do
  grep -qz "^BERTPIPE_RUN_TOKEN=$2\$" "$d/environ" 2>/dev/null && kill "${d#/proc/}" 2>/dev/null
done
"""


def start_reaper() -> None:
    """If this process dies without cleaning up (kill -9), stop what it started: Prefect's temporary server,
    worker processes, training ranks (all inherit a per-run token in their environment). Linux (/proc)."""
    import subprocess
    import uuid

    if not Path("/proc/self/environ").exists():
        return
    token = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if k != "BERTPIPE_RUN_TOKEN"}
    subprocess.Popen(["sh", "-c", _REAPER, "bertpipe-reaper", str(os.getpid()), token], env=env,
                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                     start_new_session=True)
    os.environ["BERTPIPE_RUN_TOKEN"] = token


def print_summary(summary: dict, out=None) -> None:
    out = out or sys.stdout  # looked up per call, so a redirected/captured stdout is honoured
    print(f"{'stage':<14} {'calls':>5} {'cached':>6} {'files':>6} {'bytes':>14} {'seconds':>8}  dir", file=out)
    for name, s in summary["stages"].items():
        print(f"{name:<14} {s['calls']:>5} {s['cached']:>6} {s['files']:>6} {s['bytes']:>14,} {s['seconds']:>8.2f}  "
              f"{s['dir']}", file=out)
    done = sum(s["calls"] - s["cached"] for s in summary["stages"].values())
    print(f"{'all stages cached' if not done else f'{done} call(s) ran'}; outputs:", file=out)
    for k, v in summary.get("outputs", {}).items():
        print(f"  {k:<10} {v}", file=out)


def run(args: argparse.Namespace) -> int:
    prefect_env(args.quiet)
    params = data_params(args)  # invalid flags fail before Prefect starts
    from tasks.lock import WorkDirLock

    # The work dir is locked for the whole command (Prefect's start-up included); the flow takes the
    # same lock again (re-entrant), so a deployment run is protected too.
    lock_dir = params.work_dir
    if args.flow == "pretrain":
        lock_dir = args.output_dir or str(Path(args.work_dir) / "pretrain")
    with WorkDirLock(lock_dir, wait_s=params.wait_lock_s):
        start_reaper()
        if args.flow == "data":
            from flows.data_flow import data_flow

            summary = data_flow(**params.model_dump())
            print_summary(summary)
            return 0
        from flows.pretrain_flow import run_from_args

        return run_from_args(args)
