"""Run bertpipe end to end on its built-in sample: the whole data DAG, then a short CPU training run.

  bertpipe demo                               # into work/demo: data DAG + 40 steps, 2 DeepSpeed ranks
  bertpipe demo --no-train                    # the data DAG only
  bash scripts/demo.sh                        # sets up ./.venv first, then runs `bertpipe demo`

This is `bertpipe run e2e` with the sample's settings: the packaged sample dump (51 short articles written
for bertpipe, md5-checked) -> wikiextractor 3.1.0 (clock pinned to 2026-01-01) -> clean -> segment ->
eval split (5 articles) -> gather -> a learned 8,000-entry uncased WordPiece vocab -> create_pretraining_data
(MLPerf flags: 512/76, dupe 10, seed 12345) -> TFRecords -> HDF5 -> 4 length bins (8 shards each) and
eval.txt -> TFRecord -> eval picks -> HDF5; then the tiny BERT is pre-trained on the bins with DeepSpeed
(CPU, gloo, ZeRO-1, bf16) and evaluated on the eval HDF5. Every stage lands in <work-dir>/<stage>/<key>/
with its _manifest.json; a second `bertpipe demo` finds the data stages done and re-trains only.
Prefect: with no PREFECT_API_URL a temporary local server runs for the length of the command.

The console shows progress bars (on a terminal), warnings and errors, a few training lines, the stage table
and the summary (about 30 lines); -v shows every log line and the DeepSpeed launcher's whole output. The
Prefect run logs keep everything either way.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path

from bertpipe.commands._common import nonneg_int, number, positive_int


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--work-dir", "--work_dir", dest="work_dir", default="work/demo",
                   help="folder for every stage's output (default: work/demo)")
    p.add_argument("--workers", type=nonneg_int(4096), default=0, help="parallel shard tasks (0: one per CPU; default)")
    p.add_argument("--max-steps", "--max_steps", dest="max_steps", type=positive_int(), default=40,
                   help="training steps of the tiny model (default: 40)")
    p.add_argument("--learning-rate", "--learning_rate", dest="learning_rate",
                   type=number(float, 0, 10, lo_open=True), default=0.05,
                   help="peak learning rate of the tiny model (default: 0.05, high enough to move in 40 steps)")
    p.add_argument("--nproc", type=positive_int(1024), default=2, help="DeepSpeed ranks for the training run (default: 2)")
    p.add_argument("--no-train", dest="train", action="store_false",
                   help="stop after the data DAG (no DeepSpeed start-up)")


def run_args(args: argparse.Namespace) -> argparse.Namespace:
    """The `bertpipe run` arguments that the demo stands for."""
    from bertpipe.commands import run as run_cmd

    p = argparse.ArgumentParser()
    run_cmd.add_arguments(p)
    argv = ["e2e" if args.train else "data", "--work-dir", str(args.work_dir), "--workers", str(args.workers),
            "--max-steps", str(args.max_steps), "--nproc", str(args.nproc), "--learning-rate", str(args.learning_rate)]
    if args.train:  # a second demo re-trains from step 1 over the first one's checkpoints
        argv.append("--overwrite")
    ns = p.parse_args(argv)
    ns.quiet, ns.verbose = getattr(args, "quiet", False), getattr(args, "verbose", 0)
    return ns


class QuietConsole(logging.Filter):
    """The demo's console without -v: warnings and errors, and of the INFO lines only the training's own
    (:func:`pretrain.launch.console_line`: set-up, five step lines, eval results), which the Prefect task
    relays from the launcher. Set on the console handlers only: the loggers stay at INFO, so the Prefect run
    logs keep every line."""

    def filter(self, record: logging.LogRecord) -> bool:
        from pretrain.launch import console_line

        return record.levelno >= logging.WARNING or console_line(record.getMessage())


def quiet_console() -> list[tuple[logging.Handler, logging.Filter]]:
    """Put :class:`QuietConsole` on every console handler (call once Prefect has configured logging); returns
    what to remove afterwards."""
    added = []
    loggers = [logging.getLogger(), *(logging.getLogger(n) for n in list(logging.root.manager.loggerDict))]
    for lg in loggers:
        for h in getattr(lg, "handlers", ()):
            if type(h) is logging.StreamHandler or type(h).__name__ == "PrefectConsoleHandler":
                if not any(isinstance(f, QuietConsole) for f in h.filters):
                    f = QuietConsole()
                    h.addFilter(f)
                    added.append((h, f))
    return added


def run(args: argparse.Namespace) -> int:
    from bertpipe.commands import run as run_cmd

    os.environ.setdefault("DS_ACCELERATOR", "cpu")  # the demo trains on the CPU even where a GPU is present
    quieted: list[tuple[logging.Handler, logging.Filter]] = []
    if not getattr(args, "verbose", 0):
        run_cmd.prefect_env(getattr(args, "quiet", False))  # (what `run` does first) before Prefect's import
        import prefect  # noqa: F401 - configures Prefect's logging: the filter goes on its handlers too

        quieted = quiet_console()
    try:
        rc = run_cmd.run(run_args(args))
    finally:
        for h, f in quieted:
            h.removeFilter(f)
    if rc:
        return rc
    work = Path(args.work_dir)
    last = json.loads((work / "last_run.json").read_text(encoding="utf-8"))
    out = last.get("outputs", {})
    print(f"\nbertpipe demo: done; everything is under {work}/")
    for label, key in (("training text", "text_dir"), ("vocab", "vocab"), ("4-bin HDF5", "train_dir"),
                       ("eval HDF5", "eval_hdf5")):
        if key in out:
            print(f"  {label:<14} {out[key]}")
    summary_file = work / "pretrain" / "summary.json"
    if args.train and summary_file.is_file():
        s = json.loads(summary_file.read_text(encoding="utf-8"))
        acc = s.get("final_eval_mlm_accuracy")
        print(f"  training       {work / 'pretrain'}/  {s['steps']} steps on {s['world_size']} {s['device']} rank(s), "
              f"final loss {s['final_loss']:.3f}, {s['training_sequences_per_second']:.1f} seq/s, "
              f"eval MLM accuracy {acc if acc is None else round(acc, 4)} (MLPerf target {s['eval_target']})")
        print(f"  metrics        {work / 'pretrain' / 'metrics.jsonl'}")
    return 0
