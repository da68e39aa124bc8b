"""Run a Prefect flow locally: the data DAG (default), pre-training, or both (e2e).

  bertpipe run --work-dir work                                       # built-in sample, learned vocab
  bertpipe run --text-dir results --vocab vocab.txt --work-dir work  # MLCommons' text, MLPerf flags
  bertpipe run --dump enwiki-20200101 --vocab vocab.txt --work-dir work --workers 16   # MLPerf's extractor
  bertpipe run --dump DUMP --extractor mlperf --extractor-script WikiExtractor.py --current-time 2020-01-01T00:00:00
  bertpipe run ... --only hdf5          # one stage; fails naming the missing upstream stage if needed
  bertpipe run ... --force tfrecord     # redo a stage even though its manifests verify
  bertpipe run ... --dask-address tcp://scheduler:8786                # shard tasks on a Dask cluster
  bertpipe run e2e --work-dir work --max-steps 20                     # data, then a short CPU training run

A second run over the same inputs finds every stage done (its manifests verify) and runs nothing.
With --dask-address the work dir must be on a file system that every Dask worker mounts at the same path.
Only one run at a time per work dir: a second one refuses at once (or waits: --wait-lock SECONDS).
Prefect: with no PREFECT_API_URL a temporary local server is started for the run (120 s to start unless
PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS is set). A PREFECT_API_URL that does not answer, or a PREFECT_HOME
that cannot be written, is one line before any work; a server that stops answering during the run stops it (one
line, exit 2: after 20 s without an answer, or BERTPIPE_PREFECT_PATIENCE_S); the next run marks that run's flow and
task runs Crashed.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import re
import sys
from pathlib import Path
from typing import Any

from bertpipe.commands._common import bool_flag, number, positive_int

GROUPS = {"source": "source (default: the built-in sample)", "data": "reference flags (MLPerf defaults)",
          "target": "what to build (--target, repeatable) and NVIDIA's and Habana's sets", "run": "execution"}


def add_data_arguments(p: argparse.ArgumentParser) -> None:
    """One flag per DataParams field, generated: its declared flags (else ``--dashed`` and ``--under_scored``),
    its help and default; booleans in absl style (``--do_lower_case=False``), lists repeatable."""
    import typing
    from dataclasses import MISSING, fields

    from preprocessing.params import DataParams, cli_flags

    hints = typing.get_type_hints(DataParams)
    groups = {k: p.add_argument_group(v) for k, v in GROUPS.items()}
    for f in fields(DataParams):
        meta, g = f.metadata, groups[f.metadata["group"]]
        text = meta["help"].replace("%", "%%")  # argparse formats help with %
        opts = cli_flags(f.name, meta)
        default = f.default if f.default is not MISSING else f.default_factory()  # type: ignore[misc]
        hint, args = hints[f.name], typing.get_args(hints[f.name])
        shown = "" if default is None or default == [] else f" (default: {default})"
        if hint is bool:
            if opts[0].startswith("--no-"):
                g.add_argument(*opts, dest=f.name, action="store_false", help=text)
            elif default is False:
                g.add_argument(*opts, dest=f.name, action="store_true", help=text)
            else:
                bool_flag(g, f.name, default, text)
        elif typing.get_origin(hint) is list or list in {typing.get_origin(a) for a in args}:
            # default None: a given flag replaces the default list (append would add to it); DataParams fills it in
            g.add_argument(*opts, dest=f.name, action="append", default=None, metavar=meta.get("metavar") or "STAGE",
                           help=text + " (repeatable)")
        elif typing.get_origin(hint) is typing.Literal:
            g.add_argument(*opts, dest=f.name, choices=args, default=default, help=text + shown)
        else:
            kind = next((a for a in (args or (hint,)) if a is not type(None)), str)
            if kind in (int, float):  # bounds checked at parse time (DataParams checks them again)
                lo = meta["ge"] if meta.get("ge") is not None else meta.get("gt")
                hi = meta["le"] if meta.get("le") is not None else meta.get("lt")
                kind = number(kind, lo, hi, lo_open=meta.get("gt") is not None, hi_open=meta.get("lt") is not None)
            g.add_argument(*opts, dest=f.name, type=kind, default=default, help=text + shown)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("flow", nargs="?", choices=("data", "pretrain", "e2e"), default="data",
                   help="which flow (default: data)")
    add_data_arguments(p)
    tr = p.add_argument_group("pre-training (pretrain / e2e)")
    tr.add_argument("--model", default="tiny", help="tiny | large | 1.5b | 5b (default: tiny)")
    tr.add_argument("--max-steps", "--max_steps", dest="max_steps", type=positive_int(), default=20,
                    help="optimizer steps (default: 20)")
    tr.add_argument("--nproc", type=positive_int(1024), default=1, help="ranks on this node (default: 1)")
    tr.add_argument("--learning-rate", "--learning_rate", dest="learning_rate",
                    type=number(float, 0, 10, lo_open=True),
                    help="peak learning rate (default: bertpipe train's)")
    tr.add_argument("--train-dir", dest="train_dir", help="pretrain only: 4-bin HDF5 folder")
    tr.add_argument("--eval-file", dest="eval_file", help="pretrain only: eval HDF5")
    tr.add_argument("--output-dir", dest="output_dir", help="training output (default: <work>/pretrain)")
    tr.add_argument("--resume", action="store_true",
                    help="pretrain only: continue the training in the output dir from its newest complete checkpoint")
    tr.add_argument("--overwrite", action="store_true",
                    help="start the training at step 1 over an earlier run's checkpoints in the output dir (they are "
                         "removed; without it such a dir is refused)")


def data_params(args: argparse.Namespace):  # -> DataParams
    """The DataParams of ``args`` (one attribute per field: no hand mapping); errors name the flags."""
    from dataclasses import fields

    from preprocessing.params import DataParams, surface

    with surface("cli"):
        return DataParams(**{f.name: getattr(args, f.name) for f in fields(DataParams)})


def prefect_env(quiet: bool = False) -> None:
    """Before Prefect is imported: forward library loggers to the run logger; quieter console if asked."""
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "preprocessing,pretrain,tasks,flows")
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")  # a temporary server reports nothing
    from bertpipe.prefect_server import startup_timeout_default

    startup_timeout_default()  # 120 s for the temporary server's start-up (Prefect's 20 s fail on a busy machine)
    if quiet:
        os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
    for noisy in ("httpx", "httpcore", "distributed", "asyncio"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


class _KnownErrorsOnce(logging.Filter):
    """Console only: a bertpipe error (bad input, checksum, disk full) is printed once, as one line, by the CLI.
    Prefect's own report of it (a traceback per task and flow run) is dropped here; the run's logs in the
    Prefect UI keep everything."""

    def __init__(self) -> None:
        super().__init__()
        from core.errors import BertpipeError

        self.base = BertpipeError
        names, todo = set(), [BertpipeError]
        while todo:
            cls = todo.pop()
            names.add(cls.__name__)
            todo.extend(cls.__subclasses__())
        self.pattern = re.compile(rf"\b({'|'.join(sorted(names))})\b")

    def filter(self, record: logging.LogRecord) -> bool:
        if not record.name.startswith("prefect") or record.levelno < logging.ERROR:
            return True
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, self.base):
            return False
        if exc is not None and not isinstance(exc, Exception):  # Ctrl-C, SIGTERM: the CLI says so in one line
            return False
        from bertpipe.cli import STOPPING

        if STOPPING.is_set():  # a task whose pool the stop ended (BrokenProcessPool ...): a consequence, not news
            return False
        return not self.pattern.search(record.getMessage())


def shield_temporary_server() -> None:
    """Start Prefect's temporary server (no PREFECT_API_URL) in its own session. Ctrl-C reaches the terminal's
    whole foreground process group: the server died with it, before the flow could record the stop, and the run
    ended in pages of connection errors. The server is still stopped at exit (Prefect's atexit) or by the reaper."""
    import functools
    import subprocess
    import types

    from prefect.settings import PREFECT_API_URL

    if PREFECT_API_URL.value():  # a running server: no temporary one, and its 2.5 s module is not imported
        return
    try:
        from prefect.server.api import server
    except ImportError:  # another Prefect layout: nothing to shield
        return
    if isinstance(getattr(server, "subprocess", None), types.SimpleNamespace):
        return
    shim = types.SimpleNamespace(**{k: getattr(subprocess, k) for k in dir(subprocess) if not k.startswith("__")})
    shim.Popen = functools.partial(subprocess.Popen, start_new_session=True)
    server.subprocess = shim


def note_prefect_sigterm() -> None:
    """Inside a flow run Prefect's own SIGTERM handler replaces the CLI's; wrap it so that the CLI still learns
    of the stop (``bertpipe.cli.STOPPING``: the task failures it causes are not shown as tracebacks)."""
    from bertpipe.cli import STOPPING

    try:
        from prefect.utilities import engine
    except ImportError:
        return
    original = getattr(engine, "_prefect_sigterm_handler", None)
    if original is None or getattr(original, "bertpipe", False):
        return

    def handler(sig_num: int, *args: object):  # noqa: ANN202
        STOPPING.set()
        return original(sig_num, *args)

    handler.bertpipe = True  # type: ignore[attr-defined]
    engine._prefect_sigterm_handler = handler


def quiet_known_errors() -> None:
    """Attach :class:`_KnownErrorsOnce` to the console handlers Prefect configured (call after importing it)."""
    loggers = [logging.getLogger(), *(logging.getLogger(n) for n in list(logging.root.manager.loggerDict)
                                      if n.startswith("prefect"))]
    for lg in loggers:
        for h in lg.handlers:
            if isinstance(h, logging.StreamHandler) and not any(isinstance(f, _KnownErrorsOnce) for f in h.filters):
                h.addFilter(_KnownErrorsOnce())


def check_dask_server(params) -> None:
    """Dask workers report their task runs to the Prefect server in their PREFECT_API_URL: a temporary server
    on this machine's 127.0.0.1 cannot be theirs (each would start its own, and the runs would not show)."""
    if params.resolved_runner() != "dask":
        return
    from prefect.settings import PREFECT_API_URL

    from core.errors import InputError

    if not PREFECT_API_URL.value():
        raise InputError("--dask-address needs a standing Prefect server that every Dask worker reaches: run "
                         "`prefect server start --host <this host>` (behind your own authentication), then export "
                         "PREFECT_API_URL=http://<host>:4200/api here and in the environment of every `dask worker`")


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
    w = max([14, *map(len, summary["stages"])])  # nvidia_4320_shuffled and the like are longer
    print(f"{'stage':<{w}} {'calls':>5} {'cached':>6} {'files':>6} {'bytes':>14} {'seconds':>8}  dir", file=out)
    for name, s in summary["stages"].items():
        print(f"{name:<{w}} {s['calls']:>5} {s['cached']:>6} {s['files']:>6} {s['bytes']:>14,} {s['seconds']:>8.2f}  "
              f"{s['dir']}", file=out)
    for name, s in summary["stages"].items():
        for line in s.get("redone", []):  # why a stage that existed ran again
            print(f"  redone {name} {line}", file=out)
    done = sum(s["calls"] - s["cached"] for s in summary["stages"].values())
    print(f"{'all stages cached' if not done else f'{done} call(s) ran'}; outputs:", file=out)
    w = max([10, *map(len, summary.get("outputs", {}))])
    for k, v in summary.get("outputs", {}).items():
        print(f"  {k:<{w}} {v}", file=out)


def run(args: argparse.Namespace) -> int:
    from preprocessing.params import surface

    prefect_env(args.quiet)
    with surface("cli"):  # errors name --flags, here and inside the flow
        params = data_params(args)  # invalid flags and inputs fail here, before Prefect starts
        check_paths(args)
        params.preflight()
        from bertpipe import prefect_server

        prefect_server.preflight()  # PREFECT_API_URL answers, PREFECT_HOME is writable: before the work dir is made
        return _run_flow(args, params)


def check_paths(args: argparse.Namespace) -> None:
    """--vocab and --text-dir; for pretrain / e2e the training inputs and output folder: all checked before
    Prefect or DeepSpeed starts (the stages' own checks follow in preflight)."""
    from bertpipe.commands.download import check_source
    from core.errors import InputError
    from core.paths import PathCheck

    check_source(args.source)  # a URL with spaces or control characters
    pc = PathCheck()
    pc.output_dir("--work-dir", args.work_dir)
    if args.vocab is not None:
        pc.input_file("--vocab", args.vocab, "vocab.txt")
    if args.text_dir is not None:
        pc.input_dir("--text-dir", args.text_dir, "text folder (part-XXXXX-of-00500 files and eval.txt)")
    if args.flow == "data":
        return
    from pretrain.config import MODEL_PRESETS

    if args.model not in MODEL_PRESETS:
        raise InputError(f"--model {args.model!r}: choose one of {', '.join(MODEL_PRESETS)}")
    if args.flow == "pretrain":
        if not args.train_dir:
            raise InputError("bertpipe run pretrain needs --train-dir (a 4-bin folder) and usually --eval-file")
        pc.input_dir("--train-dir", args.train_dir, "4-bin HDF5 folder")
        if args.eval_file:
            pc.input_file("--eval-file", args.eval_file, "eval HDF5")
    if args.output_dir:
        pc.output_dir("--output-dir", args.output_dir)
    else:  # <work>/pretrain
        pc.output_dir("--work-dir", Path(args.work_dir) / "pretrain")


@contextlib.contextmanager
def _swept_on_stop(work: Path):
    """After Ctrl-C / SIGTERM (or an error), remove what killed writers left in the locked work dir
    (``.<name>.tmp-<pid>``): the pool's workers are stopped by then, and the lock keeps other runs out."""
    try:
        yield
    except BaseException:
        from core.manifest import remove_debris

        if work.is_dir():
            remove_debris(work)
        raise


def _run_flow(args: argparse.Namespace, params) -> int:
    from core.lock import WorkDirLock

    # The work dir is locked for the whole command (Prefect's start-up included); the flow takes the
    # same lock again (re-entrant), so a deployment run is protected too.
    lock_dir = params.work_dir
    if args.flow == "pretrain":
        lock_dir = args.output_dir or str(Path(args.work_dir) / "pretrain")
    with WorkDirLock(lock_dir, wait_s=params.wait_lock_s), _swept_on_stop(Path(lock_dir)):
        start_reaper()
        shield_temporary_server()
        note_prefect_sigterm()
        if args.flow == "data":
            check_dask_server(params)
        with _prefect_run(lock_dir, verbose=bool(args.verbose)):
            if args.flow == "data":
                from flows.data_flow import data_flow

                quiet_known_errors()
                print_summary(data_flow(**params.to_dict()))
                return 0
            return run_training_flow(args)


@contextlib.contextmanager
def _prefect_run(lock_dir: str, verbose: bool = False):
    """The server for the flow (the temporary one started now, one start-up at a time per PREFECT_HOME), watched
    for the length of the run; the flow runs an earlier command left open in ``lock_dir`` marked Crashed; this
    command's flow and task runs tagged (``bertpipe-run:<id>``, recorded in ``lock_dir``; host and pid)."""
    import socket

    from prefect import tags
    from prefect.settings import PREFECT_API_URL

    from bertpipe import prefect_server

    url, alive = PREFECT_API_URL.value(), None
    if not url:
        url, alive = prefect_server.start_temporary_server()
    try:
        prefect_server.crash_orphans(lock_dir)
    except Exception as exc:  # noqa: BLE001 - bookkeeping of an earlier run: never a reason to stop this one
        logging.getLogger("bertpipe").warning("could not mark the flow runs of the previous run in %s Crashed: %s",
                                              lock_dir, " ".join(str(exc).split())[:200])
    tag = prefect_server.record_run(lock_dir)
    with prefect_server.watched(url, temporary=alive is not None, alive=alive, verbose=verbose), \
            tags(tag, f"bertpipe-host:{socket.gethostname()}", f"bertpipe-pid:{os.getpid()}"):
        yield


def train_options(args: argparse.Namespace) -> dict[str, Any] | None:
    """TrainConfig fields set on the command line (``--learning-rate``, ``--overwrite``)."""
    lr = getattr(args, "learning_rate", None)
    options = {"learning_rate": lr} if lr is not None else {}
    if getattr(args, "overwrite", False):
        options["overwrite"] = True
    return options or None


def run_training_flow(args: argparse.Namespace) -> int:
    """``bertpipe run pretrain|e2e``."""
    from core.errors import InputError
    from flows.pretrain_flow import pretrain_flow

    quiet_known_errors()
    if args.flow == "pretrain":
        if not args.train_dir:
            raise InputError("bertpipe run pretrain needs --train-dir (a 4-bin folder) and usually --eval-file")
        pretrain_flow(train_dir=args.train_dir, eval_file=args.eval_file or "",
                      output_dir=args.output_dir or str(Path(args.work_dir) / "pretrain"), model=args.model,
                      max_steps=args.max_steps, nproc=args.nproc, vocab=args.vocab, options=train_options(args),
                      resume=getattr(args, "resume", False))
        return 0
    if getattr(args, "resume", False):
        raise InputError("--resume is for `bertpipe run pretrain` (or `bertpipe train --resume`); the e2e flow "
                         "trains from step 1 (--overwrite replaces an earlier training in its output dir)")
    from flows.e2e_flow import e2e_flow

    out = e2e_flow(data=data_params(args).to_dict(), output_dir=args.output_dir, model=args.model,
                   max_steps=args.max_steps, nproc=args.nproc, options=train_options(args))
    print_summary(out["dataset"])
    s = out["pretrain"]["summary"]
    brief = ", ".join(f"{k}={s[k]:.4g}" if isinstance(s[k], float) else f"{k}={s[k]}"
                      for k in ("steps", "final_loss", "training_sequences_per_second", "final_eval_mlm_accuracy")
                      if s.get(k) is not None)
    print(f"pre-training: {out['pretrain']['output_dir']}/  {brief or 'no summary.json written'}")
    return 0
