"""The ``bertpipe`` command.

Each subcommand lives in ``bertpipe/commands/<module>.py`` with two functions:
``add_arguments(parser)`` and ``run(args) -> int | None``. Modules are imported only when their
subcommand is used, so ``bertpipe --help`` and every command start fast (heavy frameworks such as
prefect, torch and tensorflow are imported inside ``run``, where they are needed).
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading

# name -> (module under bertpipe.commands, one-line help). The names and flags are contracts.
COMMANDS: dict[str, tuple[str, str]] = {
    "demo": ("demo", "run the whole pipeline end to end on the built-in sample (the README's main job)"),
    "download": ("download", "fetch a Wikipedia dump, MLCommons text or a local file; resumable, md5-verified"),
    "extract": ("extract", "WikiExtractor over a MediaWiki dump -> text/AA/wiki_00 ..."),
    "clean": ("text_stages", "cleanup_file.py + clean.sh over extractor files (wiki_nn -> wiki_nn.2)"),
    "segment": ("text_stages", "nltk 3.4.5 punkt sentence segmentation (wiki_nn.2 -> wiki_nn.3)"),
    "split-eval": ("text_stages", "seperate_test_set.py: withhold eval articles (-> .4, eval.txt, eval.md5)"),
    "gather": ("text_stages", "do_gather.py: .4 files -> part-XXXXX-of-00500"),
    "text": ("text", "text stages end to end: dump or extractor output -> part files + eval.txt"),
    "create-pretraining-data": ("create_pretraining_data", "tokenize, mask and write TFRecords (MLPerf reference)"),
    "pick-eval-samples": ("pick_eval_samples", "evenly spaced eval subset of a TFRecord (eval_10k)"),
    "tfrecord-to-hdf5": ("tfrecord_to_hdf5", "TFRecord -> padded HDF5 (Samsung MLPerf layout)"),
    "split-4bins": ("split_4bins", "split padded HDF5 into 4 sequence-length bins and shards"),
    "pack-varlength": ("pack_varlength", "padded HDF5 -> NVIDIA's packed (variable-length) HDF5"),
    "pack-nvidia": ("pack_nvidia", "NVIDIA's packed_data chain: <= 3 sequences a sample, shard lists + packed shards"),
    "pack-habana": ("pack_habana", "Habana's pack_pretraining_data_pytorch.py: <= 3 sequences a pack (packed mode)"),
    "chop-hdf5": ("nvidia", "NVIDIA's chop_hdf5_files.py: padded part files -> N shards (--varlength: packed)"),
    "shuffle-samples": ("nvidia", "NVIDIA's shuffle_samples.py: rows shuffled across shards (random.Random(24))"),
    "pick-eval-samples-varlength": ("nvidia", "NVIDIA's pick_eval_samples_varlength.py: eval subset, packed form"),
    "vocab": ("vocab", "learn an uncased WordPiece vocab from part files"),
    "run": ("run", "run the Prefect data / pretrain / end-to-end flow locally"),
    "status": ("status", "show the stages of a work dir: done / missing / corrupt, keys, sizes"),
    "verify": ("verify", "re-check every md5 of a work dir against its manifests"),
    "export-dataset": ("export_dataset", "symlink a work dir's data set into Samsung's, NVIDIA's or Habana's layout"),
    "train": ("train", "pre-train BERT with DeepSpeed (HPU, CUDA or CPU)"),
    "export-hf": ("export_hf", "a training run's checkpoint -> transformers BertForPreTraining directory"),
    "import-tf": ("import_tf", "TF1 BERT checkpoint (MLPerf's model.ckpt-28252) -> safetensors / transformers"),
}

log = logging.getLogger("bertpipe")


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the flag, what is wrong, where to look), exit 2."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"{self.prog}: error: {message} (see `{self.prog} --help`)\n")


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread like Ctrl-C, so every ``finally`` and temp-file cleanup runs."""


#: Set once Ctrl-C or SIGTERM arrived: what fails after it (a task whose pool was stopped) is a consequence,
#: not news; the console shows the one line of the stop (bertpipe/commands/run.py filters Prefect's reports).
STOPPING = threading.Event()


#: Why a watchdog thread stopped the command (bertpipe/prefect_server.py: the Prefect server stopped answering):
#: the one line the CLI prints instead of "interrupted" (see :func:`abort`).
ABORTED: list[str] = []
_REPORTED = threading.Event()
_COMMAND: list = []  # [command name, whether main() runs as the process's command line]
_ABORT_LOCK = threading.Lock()
#: after abort(), how long the main thread may take to unwind (a library still waiting on the dead service)
ABORT_GRACE_S = 15.0


def abort(message: str, grace_s: float | None = None) -> None:
    """Stop the command from another thread: the main thread unwinds as on Ctrl-C (running work is stopped,
    temporary files removed), then the CLI prints ``bertpipe CMD: error: <message>`` and exits 2. If the unwinding
    has not ended within ``grace_s`` (``ABORT_GRACE_S``), this thread prints the line and ends the process itself
    (what it started is stopped by the run's reaper; only when main() is the process's command line, not when it is
    called in-process). Only the first call counts. Call from a daemon thread."""
    import time

    with _ABORT_LOCK:
        if ABORTED:
            return
        ABORTED.append(_one_line(message))
    STOPPING.set()
    if _main_thread():  # no one to interrupt: the caller unwinds
        return
    signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)  # EINTR: a blocked wait wakes up too
    time.sleep(ABORT_GRACE_S if grace_s is None else grace_s)
    if not _COMMAND or not _COMMAND[1]:  # main() called in-process (tests): never end the caller's process
        return
    if not _REPORTED.is_set():
        _report_abort(_COMMAND[0] if _COMMAND else "run")
    sys.stderr.flush()
    os._exit(2)


def _report_abort(command: str) -> int:
    if not _REPORTED.is_set():
        _REPORTED.set()
        print(f"bertpipe {command}: error: {ABORTED[0]}", file=sys.stderr, flush=True)
    return 2


def _on_sigterm(signum, frame) -> None:  # noqa: ANN001
    STOPPING.set()
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM does not interrupt the cleanup
    raise Terminated()


def _on_sigint(signum, frame) -> None:  # noqa: ANN001
    STOPPING.set()
    raise KeyboardInterrupt()


#: A command run as the process's command line and signalled after its work ended (main() returning, the
#: interpreter shutting down): the signal's number. The process still exits 143 / 130 in one line, as a signal
#: during the work gives, not -15 / -2 by the default handlers (:func:`_exit_as_signalled`). ``_RC``: what main()
#: returned.
_LATE: list[int] = []
_RC: list[int] = []
_LATE_HOOKED: list[bool] = []


def _exit_late(sig: int) -> None:
    what = "terminated (SIGTERM)" if sig == signal.SIGTERM else "interrupted"
    done = "; its outputs are complete" if _RC == [0] else ""
    try:
        logging.shutdown()
        print(f"bertpipe {_COMMAND[0] if _COMMAND else 'run'}: {what} as it ended{done}", file=sys.stderr, flush=True)
        sys.stdout.flush()
    finally:
        os._exit(143 if sig == signal.SIGTERM else 130)


def _on_late_signal(signum, frame) -> None:  # noqa: ANN001
    """Recorded, so the exit's own cleanup goes on; a second signal ends the process at once."""
    if _LATE:
        _exit_late(_LATE[0])
    _LATE.append(signum)


def _exit_as_signalled() -> None:
    """atexit, registered first so it runs last: after a late signal, exit 143 (SIGTERM) / 130 (Ctrl-C). From here
    on both signals are ignored: in the interpreter's own teardown Python restores the default handlers of the
    signals it handles (not of ignored ones), and a signal then would kill the process (-15 / -2) after its work
    ended; the process exits with the command's code instead."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if _LATE:  # (one that arrived before the lines above has run its handler by now)
        _exit_late(_LATE[0])


def _one_line(text: object) -> str:
    return " ".join(str(text).split())


def _top_parser() -> argparse.ArgumentParser:
    width = max(len(n) for n in COMMANDS)
    lines = "\n".join(f"  {n:<{width}}  {h}" for n, (_, h) in COMMANDS.items())
    p = _Parser(
        prog="bertpipe",
        description="MLPerf BERT pre-training data, byte-exact to the reference scripts, and DeepSpeed "
        "pre-training.\n\ncommands:\n" + lines + "\n\nRun `bertpipe COMMAND --help` for a command's flags.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("command", nargs="?", help=argparse.SUPPRESS)
    p.add_argument("--version", action="store_true", help="print the version and exit")
    return p


def build_parser(command: str) -> tuple[argparse.ArgumentParser, object]:
    """The parser of one subcommand and its module."""
    module_name, help_text = COMMANDS[command]
    module = importlib.import_module(f"bertpipe.commands.{module_name}")
    doc = (module.__doc__ or "").strip()
    p = _Parser(
        prog=f"bertpipe {command}",
        description=help_text[0].upper() + help_text[1:] + "." + (f"\n\n{doc}" if doc and "\n" in doc else ""),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    p.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    if hasattr(module, "add_arguments_for"):
        module.add_arguments_for(command, p)  # modules that serve several commands
    else:
        module.add_arguments(p)
    return p, module


def setup_logging(verbose: int = 0, quiet: bool = False) -> None:
    level = logging.WARNING if quiet else (logging.DEBUG if verbose > 1 else logging.INFO)
    if verbose:  # create_pretraining_data's example dumps (reference-style), here and in worker processes;
        os.environ["BERTPIPE_LOG_EXAMPLES"] = "1"  # the DeepSpeed launcher's whole output (pretrain/launch.py)
        os.environ["BERTPIPE_VERBOSE"] = str(verbose)
        logging.getLogger("preprocessing.mlperf.create_pretraining_data.examples").setLevel(logging.INFO)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", datefmt="%H:%M:%S",
                        stream=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    try:
        rc = _main(argv)
    except KeyboardInterrupt as exc:  # (Terminated too) a signal after the command's own handling ended: its
        if argv is not None or not _COMMAND:  # last line was printed; on the command line, one line, 130 / 143
            raise
        _exit_late(signal.SIGTERM if isinstance(exc, Terminated) else signal.SIGINT)
    _RC[:] = [rc]
    return rc


def _main(argv: list[str] | None) -> int:
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help") or argv[0].startswith("-"):
        args = _top_parser().parse_args(argv)
        if args.version:
            from bertpipe import __version__

            print(f"bertpipe {__version__}")
            return 0
        _top_parser().print_help()
        return 0
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        _top_parser().error(f"unknown command {command!r}; choose from: {', '.join(COMMANDS)}")
    try:
        parser, module = build_parser(command)
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("bertpipe.commands"):
            print(f"bertpipe {command}: not available in this version", file=sys.stderr)
            return 2
        raise
    args = parser.parse_args(rest)
    setup_logging(args.verbose, args.quiet)
    # Past a file-size limit (ulimit -f) the kernel sends SIGXFSZ, which kills the process outright;
    # ignored, the write fails with EFBIG instead and the stage reports it cleanly (DiskFullError).
    if hasattr(signal, "SIGXFSZ"):
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    from core.errors import BertpipeError

    # SIGTERM unwinds like Ctrl-C: temporary files are removed, no half output stays, exit 143.
    # multiprocessing's resource tracker (a helper process, started later with these -W options) frees the
    # semaphores of a pool stopped by Ctrl-C/SIGTERM and warns about each: its cleanup is the point, the warning noise.
    quiet_tracker = "ignore::UserWarning:multiprocessing.resource_tracker"
    if quiet_tracker not in sys.warnoptions:
        sys.warnoptions.append(quiet_tracker)
    STOPPING.clear()
    ABORTED.clear()
    _REPORTED.clear()
    _COMMAND[:] = [command, from_command_line]
    late = from_command_line and _main_thread()
    if late and not _LATE_HOOKED:
        import atexit

        atexit.register(_exit_as_signalled)  # before what the command registers: runs after it
        _LATE_HOOKED.append(True)
    _RC.clear()
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if _main_thread() else None
    previous_int = signal.signal(signal.SIGINT, _on_sigint) if _main_thread() else None
    try:
        rc = _call(module, command, args)
        _RC[:] = [rc]  # the command's own code, known before a signal can still arrive (main(): a late signal)
    except _Aborted:
        return _report_abort(command)  # what failed after the abort is its consequence: the abort's line only
    except BertpipeError as exc:
        print(f"bertpipe {command}: error: {_one_line(exc)}", file=sys.stderr)
        return 2
    except Terminated:
        print(f"bertpipe {command}: terminated (SIGTERM); unfinished outputs were removed", file=sys.stderr)
        return 143
    except KeyboardInterrupt:
        print(f"bertpipe {command}: interrupted; unfinished outputs were removed", file=sys.stderr)
        return 130
    except OSError as exc:  # a path problem the checks did not foresee: still one line, naming the file
        if args.verbose > 1:
            log.exception("bertpipe %s", command)
        where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f)
        print(f"bertpipe {command}: error: {exc.strerror or _one_line(exc)}{': ' + where if where else ''} "
              "(check the path and its permissions; -vv shows the traceback)", file=sys.stderr)
        return 2
    except BaseException as exc:
        if type(exc).__name__ != "TerminationSignal":  # Prefect's SIGTERM inside a flow run
            raise
        print(f"bertpipe {command}: terminated (SIGTERM); unfinished outputs were removed", file=sys.stderr)
        return 143
    finally:
        if late:  # the process ends after this: a signal from here on is recorded, and still exits 143 / 130
            signal.signal(signal.SIGTERM, _on_late_signal)
            signal.signal(signal.SIGINT, _on_late_signal)
        else:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
            if previous_int is not None:
                signal.signal(signal.SIGINT, previous_int)
    if ABORTED:
        return _report_abort(command)
    return int(rc or 0)


class _Aborted(Exception):
    """The command ended after :func:`abort` (however it ended)."""


def _call(module, command: str, args: argparse.Namespace):  # noqa: ANN001, ANN202
    try:
        return module.run_for(command, args) if hasattr(module, "run_for") else module.run(args)
    except BaseException as exc:
        if ABORTED and not isinstance(exc, SystemExit):
            raise _Aborted() from None
        raise


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


if __name__ == "__main__":
    sys.exit(main())
