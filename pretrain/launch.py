"""Build, print and run the launcher command of a training run (``bertpipe train`` and the Prefect task).

    from pretrain.launch import launch
    from pretrain.train_config import TrainConfig
    rc = launch(TrainConfig(train_dir="work/4bins", eval_file="work/eval_10k.hdf5", output_dir="results/run1"),
                nproc=2)

The command is DeepSpeed's launcher (``deepspeed --num_gpus N [--hostfile F --num_nodes M] pretrain/train.py
...``) or ``torchrun --nproc_per_node N pretrain/train.py ...``. On a CPU host ``--num_gpus`` is the number
of CPU ranks (DeepSpeed 0.19.8 accepts it with ``DS_ACCELERATOR=cpu``) and each rank gets
``OMP_NUM_THREADS = cores // ranks`` unless set. Bad inputs (missing/corrupt shard, eval file, vocab,
checkpoint of another model, an init checkpoint that is missing or, for safetensors/transformers, of
another shape) are caught here, before any rank starts, by :func:`preflight`.

A training owns its output dir and dies with its command:

* :func:`output_dir_lock` (``OUTPUT_DIR/.bertpipe.lock``, core/lock.py's flock, the file ``bertpipe run
  pretrain`` locks too) is held for the whole launch: a second training on the same dir is refused in one
  line naming the holder (pid, host); a lock left by a killed holder is free at once (the kernel drops it).
  A Prefect flow or deployment takes it with the same function (re-entrant within one process).
* ranks of an earlier training still alive in the dir are waited for (15 s), then refused
  (:func:`pretrain.liveness.wait_for_old_ranks`);
* the launcher gets a parent-death signal and every rank a watchdog on this process
  (:mod:`pretrain.liveness`): ``kill -9`` of the command stops them within about a second;
* SIGTERM/Ctrl-C go to the ranks only (not to DeepSpeed's ``launch.py``, which would SIGKILL them 30 s
  later, in the middle of an eval or a large checkpoint): each saves a checkpoint and exits;
* a stale torch extension build lock (left by a training killed while it built DeepSpeed's op) is removed
  before the ranks start (:mod:`pretrain.extensions`).
"""

from __future__ import annotations

import logging
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

from pretrain.train_config import TrainConfig, to_argv

log = logging.getLogger(__name__)

TRAIN_SCRIPT = Path(__file__).resolve().parent / "train.py"
LAUNCHERS = ("deepspeed", "torchrun")
#: ``bertpipe -v`` sets it (the count of -v): the launcher's and ranks' whole output then goes to the console
VERBOSE_ENV = "BERTPIPE_VERBOSE"
LAUNCHER_LOG = "launcher.log"
_STEP = re.compile(r"\[rank0\] INFO pretrain\.train: step (\d+)/(\d+): ")
_WORTH = re.compile(r"\[rank\d+\] (INFO|WARNING|ERROR|CRITICAL) pretrain\.|\[rank\d+\] (WARNING|ERROR|CRITICAL) "
                    r"|^(\S+: )?pretrain/train\.py \[rank \d+\]: error: ")
#: a rank's one error line (pretrain/train.py's ``_fail``), perhaps behind pdsh's "host: "
_RANK_ERROR = re.compile(r"^(?:\S+: )?(pretrain/train\.py \[rank \d+\]: error: .*)$")


def verbose_from_env() -> bool:
    return os.environ.get(VERBOSE_ENV, "") not in ("", "0")


def console_line(line: str) -> bool:
    """Whether a line of the launcher's (or a rank's) output belongs on a quiet console: what bertpipe's own
    code in the ranks logs (pretrain.*: set-up, eval results, checkpoints; of the step lines five a run: 1,
    each quarter, the last) and any rank's warnings and errors. DeepSpeed's own start-up chatter, the ranks'
    library warnings (FutureWarning ...) and the other step lines stay in launcher.log."""
    m = _STEP.search(line)
    if m:
        step, total = int(m[1]), int(m[2])
        return step == 1 or step == total or step % max(1, total // 4) == 0
    return bool(_WORTH.search(line))


class _LauncherLog:
    """Every output line, in arrival order, appended to ``<output_dir>/launcher.log``; the last ones kept."""

    def __init__(self, path: Path, keep: int = 20) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.last, self._lock = path, deque(maxlen=keep), threading.Lock()
        self._f = open(path, "a", encoding="utf-8", errors="replace")  # noqa: SIM115 - closed in close()
        self._f.write(f"--- {time.strftime('%Y-%m-%dT%H:%M:%S')} launch\n")

    def write(self, line: str) -> None:
        with self._lock:
            self.last.append(line)
            if not self._f.closed:  # (a rank that outlived the launch's wait)
                self._f.write(line + "\n")
                self._f.flush()

    def close(self) -> None:
        with self._lock:
            self._f.close()


class _Failure:
    """The first rank error line of a launch: shown once, and the whole training stopped :attr:`GRACE_S` later,
    or as soon as the launcher ends (the other ranks would only add their view of it: a collective whose peer
    is gone, launcher tracebacks; in that time they mostly end by themselves, rank 0 closing the MLPerf log
    with run_stop aborted)."""

    GRACE_S = 3.0

    def __init__(self) -> None:
        self.line: str | None = None
        self.proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._tree: list = []
        self._timer: threading.Timer | None = None

    def see(self, line: str) -> str | None:
        """The rank's error line when ``line`` is the first one (then the training is being stopped)."""
        m = _RANK_ERROR.match(line)
        if not m:
            return None
        with self._lock:
            if self.line is not None:
                return None
            self.line = m[1]
        if self.proc is not None:
            self._tree = _descendants(self.proc.pid)  # (now: a killed parent's children move to init)
            self._timer = threading.Timer(self.GRACE_S, self.stop)
            self._timer.daemon = True
            self._timer.start()
        return self.line

    def stop(self) -> None:
        """SIGKILL what is left of the training: the launcher (while it is unreaped, its pid is ours) and every
        process that was below it at the error."""
        if self._timer is not None:
            self._timer.cancel()
        if self.proc is not None and self.proc.poll() is None:
            stop_training(self.proc.pid)
        _kill(self._tree)

    @property
    def status(self) -> int:
        """2 for a refusal of the data or inputs (a rank's InputError, a non-finite loss), 1 for a crash."""
        return 1 if self.line is None or "(traceback: " in self.line else 2


def _descendants(pid: int) -> list:
    try:
        import psutil

        return psutil.Process(pid).children(recursive=True)
    except Exception:  # noqa: BLE001 - psutil missing, or the process gone
        return []


def _kill(procs: list) -> None:
    for p in procs:
        try:
            p.send_signal(signal.SIGKILL)  # (psutil checks it is still the same process: no reused pid)
        except Exception:  # noqa: BLE001 - gone already
            pass


def stop_training(launcher_pid: int) -> None:
    """SIGKILL the launcher, every process below it (torchrun's workers run in sessions of their own) and its
    process group: the ranks' descendants are listed first, before their parents die and they are reparented."""
    _kill(_descendants(launcher_pid))
    try:
        os.killpg(launcher_pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _pump(pipe, sink: _LauncherLog | None, stream, failure: _Failure | None = None, everything: bool = False
          ) -> None:
    """Each line of ``pipe`` into the log, and onto ``stream`` if it belongs on a quiet console (``everything``:
    every line); after a rank's error line (``failure``), that line only."""
    for raw in pipe:
        line = raw.rstrip("\n")
        if sink is not None:
            sink.write(line)
        if failure is not None and failure.line is not None:
            continue
        error = failure.see(line) if failure is not None else None
        if error is not None:
            print(error, file=stream, flush=True)
        elif everything or console_line(line):
            print(line, file=stream, flush=True)
    pipe.close()


def _tool(name: str) -> str:
    """The launcher executable next to this Python (a venv), else the bare name on PATH."""
    local = Path(sys.executable).parent / name
    return str(local) if local.exists() else name


def free_port() -> int:
    """A TCP port free right now on this host (avoids clashes between concurrent local runs)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: the rendezvous port of a multi-node run when none is given (DeepSpeed's and torchrun's default)
MULTINODE_PORT = 29500


def rdzv_id_for(output_dir: str | os.PathLike) -> str:
    """torchrun's --rdzv-id of a run: the same on every node that names the same output dir."""
    import hashlib

    return "bertpipe-" + hashlib.md5(str(Path(output_dir).resolve()).encode()).hexdigest()[:12]


def check_nodes(launcher: str, hostfile: str, num_nodes: int, master_addr: str, node_rank: int) -> None:
    """Refuse (ValueError, one line) a multi-node set-up the launchers would fail on, or hang in."""
    if node_rank < 0:
        if launcher == "torchrun" and num_nodes > 1:
            raise ValueError("torchrun on several nodes: run `bertpipe train ... --num-nodes N --node-rank K "
                             "--master-addr HOST` on each node (K = 0 on the node that owns --output-dir, 1 .. N-1 "
                             "on the others)")
        return
    if num_nodes < 2 or node_rank >= num_nodes:
        raise ValueError(f"--node-rank {node_rank} needs --num-nodes N > 1 and 0 <= K < N "
                         f"(got --num-nodes {num_nodes})")
    if not master_addr:
        raise ValueError("--node-rank needs --master-addr: the address of node 0, which every node can reach")
    if launcher == "deepspeed" and not hostfile:
        raise ValueError("--node-rank with the deepspeed launcher needs --hostfile (its nodes and slots, the same "
                         "file on every node)")


def build_command(cfg: TrainConfig, nproc: int, *, launcher: str = "deepspeed", hostfile: str = "",
                  num_nodes: int = 0, master_addr: str = "", master_port: int = 0, node_rank: int = -1,
                  rdzv_id: str = "") -> list[str]:
    """The exact argv that starts ``nproc`` ranks per node of ``pretrain/train.py`` with ``cfg``.

    ``node_rank`` >= 0: this node's ranks only (one command per node, no ssh): DeepSpeed's ``--no_ssh
    --node_rank K`` (the hostfile names the nodes), or torchrun's c10d rendezvous at ``master_addr:master_port``
    (``--rdzv-id``: ``rdzv_id``, default from the output dir; the rendezvous numbers the nodes)."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r}; choose from {', '.join(LAUNCHERS)}")
    if nproc < 1:
        raise ValueError(f"--nproc must be >= 1, got {nproc}")
    check_nodes(launcher, hostfile, num_nodes, master_addr, node_rank)
    if launcher == "deepspeed":
        cmd = [_tool("deepspeed")]
        if hostfile:
            cmd += ["--hostfile", hostfile]
        if num_nodes:
            cmd += ["--num_nodes", str(num_nodes)]
        cmd += ["--num_gpus", str(nproc)]
        if node_rank >= 0:
            cmd += ["--no_ssh", "--node_rank", str(node_rank)]
        if master_addr:
            cmd += ["--master_addr", master_addr]
        if master_port:
            cmd += ["--master_port", str(master_port)]
    else:
        if hostfile:
            raise ValueError("--hostfile needs the deepspeed launcher (torchrun takes --nnodes/--rdzv-endpoint)")
        cmd = [_tool("torchrun"), "--nproc_per_node", str(nproc)]
        if node_rank >= 0:
            cmd += ["--nnodes", str(num_nodes), "--rdzv-backend", "c10d", "--rdzv-endpoint",
                    f"{master_addr}:{master_port or MULTINODE_PORT}",
                    "--rdzv-id", rdzv_id or rdzv_id_for(cfg.output_dir)]
            return cmd + [str(TRAIN_SCRIPT)] + to_argv(cfg)
        if num_nodes:
            cmd += ["--nnodes", str(num_nodes)]
        if master_addr:
            cmd += ["--master_addr", master_addr]
        if master_port:
            cmd += ["--master_port", str(master_port)]
    return cmd + [str(TRAIN_SCRIPT)] + to_argv(cfg)


def launch_env(cfg: TrainConfig, nproc: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment additions for the ranks: DS_ACCELERATOR for an explicit device, CPU thread counts."""
    base = dict(os.environ) if base is None else base
    extra: dict[str, str] = {}
    device = cfg.device if cfg.device != "auto" else base.get("DS_ACCELERATOR", "auto")
    if device == "auto":  # resolve here so DeepSpeed in the ranks picks the same device (HPU > CUDA > CPU)
        from pretrain.devices import select_device

        device = select_device("auto", env=base).accelerator
    if cfg.device != "auto" or "DS_ACCELERATOR" not in base:  # an explicit --device wins over the env
        extra["DS_ACCELERATOR"] = device
    if device == "cpu" and "OMP_NUM_THREADS" not in base:
        extra["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // nproc))
    return extra


def output_dir_lock(output_dir: str | os.PathLike, wait_s: float = 0.0, *, flag: str = "--output-dir"):
    """The lock of a training's output dir (a context manager): ``with output_dir_lock(out): ...``.

    Taken by :func:`launch` for the whole training; a Prefect flow or deployment that trains into ``out``
    takes it first (re-entrant within a process, so the launch inside takes it again). A second holder is
    refused with :class:`core.errors.InputError`: "training output dir OUT is in use by pid N on HOST
    (started ...: cmd); wait for that training to finish, or use another {flag}" (``flag``: how the caller
    names the output dir, e.g. ``output_dir`` for a deployment parameter). ``wait_s`` > 0 waits that long.
    """
    from core.lock import WorkDirLock

    return WorkDirLock(output_dir, wait_s, what="training output dir",
                       advice=f"wait for that training to finish, or use another {flag}")


def preflight(cfg: TrainConfig):
    """Check data, eval file, vocab and the resume checkpoint before spending minutes on start-up; returns
    where the run starts (:class:`pretrain.checkpoint.ResumePoint` with md5s verified, or None: step 1).

    Raises:
        InputError: naming the bad file and what to do (also: no --resume over a run's checkpoints without
            --overwrite; --resume over checkpoints none of which is complete).
    """
    import numpy as np

    from core.errors import InputError
    from core.schema import HDF5_FIELDS
    from pretrain import checkpoint as ckpt
    from pretrain.data import _open_h5, check_vocab, inspect_shard
    from pretrain.train import model_config_for

    if not cfg.train_dir:
        raise InputError("--train-dir is required (the split-4bins output or a folder of HDF5 files)")
    try:
        mcfg = model_config_for(cfg)
    except (OSError, ValueError, TypeError) as exc:
        raise InputError(f"bad model config ({cfg.model!r}, {cfg.model_config!r}): {exc}") from exc
    start = ckpt.start_point(cfg.output_dir, resume=cfg.resume, overwrite=cfg.overwrite, md5=True)
    from pretrain.packing import preflight_bins

    bins = preflight_bins(cfg.train_dir, cfg.packed, mcfg.vocab_size)  # packed data: checked there, {} back
    from pretrain.batch_mix import check_bins

    check_bins(cfg, bins)  # --split-batch-cnt: the bins it draws from hold rows
    files = [next(s for s in shards if s.rows) for shards in bins.values() if any(s.rows for s in shards)]
    if cfg.eval_file:
        if not Path(cfg.eval_file).is_file():
            raise InputError(f"eval file {cfg.eval_file} does not exist")
        files.append(inspect_shard(Path(cfg.eval_file), None))
    for shard in files:  # a sample of rows per bin: the full check runs on every batch during training
        with _open_h5(shard.path) as h:  # (the values check of pretrain/data.py: ids, masks, segments, positions)
            arrays = {k: h[k][:256].astype(np.int64) for k in HDF5_FIELDS}
        check_vocab(arrays, mcfg.vocab_size, str(shard.path))
    if start:
        ckpt.check_model_config(cfg.output_dir, start.tag, mcfg.to_dict())
        ckpt.check_checkpoint_files(cfg.output_dir, start.tag)  # a truncated file fails here, not in a rank
    elif cfg.init_checkpoint:  # (a resumed run ignores it)
        from pretrain.init_checkpoint import check_init_checkpoint

        check_init_checkpoint(cfg.init_checkpoint, mcfg)
    return start


def ds_env_file(output_dir: str | os.PathLike, extra: dict[str, str]) -> Path:
    """``OUTPUT_DIR/.deepspeed_env``: the lines DeepSpeed's launcher would export to every node over pdsh/ssh
    (``$DS_ENV_FILE``, else ``~/.deepspeed_env`` and ``./.deepspeed_env``), then ``extra`` (the device, thread
    count and this command's owner token), so the ranks of every node run as those of this one; the launcher
    reads it through ``DS_ENV_FILE``."""
    names = [os.environ["DS_ENV_FILE"]] if os.environ.get("DS_ENV_FILE") else [".deepspeed_env"]
    lines: list[str] = []
    for folder in (Path.home(), Path.cwd()):
        for name in names:
            path = folder / name
            if path.is_file():
                lines += [ln for ln in path.read_text().splitlines() if "=" in ln]
    keys = set(extra)
    lines = [ln for ln in lines if ln.split("=", 1)[0] not in keys] + [f"{k}={v}" for k, v in extra.items()]
    out = Path(output_dir) / ".deepspeed_env"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("".join(ln + "\n" for ln in lines))
    return out.resolve()


def signal_ranks(launcher_pid: int, sig: int) -> int:
    """Send ``sig`` to the rank processes (``pretrain/train.py``) below the launcher; returns how many got it
    (0 when none runs yet, or psutil is missing)."""
    try:
        import psutil
    except ImportError:
        return 0
    try:
        procs = psutil.Process(launcher_pid).children(recursive=True)
    except psutil.Error:
        return 0
    sent = 0
    for p in procs:
        try:
            if str(TRAIN_SCRIPT) in p.cmdline():
                p.send_signal(sig)
                sent += 1
        except psutil.Error:
            pass
    return sent


def launch(cfg: TrainConfig, nproc: int = 1, *, launcher: str = "deepspeed", hostfile: str = "",
           num_nodes: int = 0, master_addr: str = "", master_port: int = 0, dry_run: bool = False,
           check: bool = True, on_output: Callable[[str], None] | None = None, verbose: bool | None = None,
           node_rank: int = -1, rdzv_id: str = "") -> int:
    """Print the launcher command, run it, and return its exit code (0 when ``dry_run``).

    Holds :func:`output_dir_lock` throughout (dry runs excepted). SIGTERM/SIGINT received here are
    forwarded to the ranks (:func:`signal_ranks`; before they exist, to the launcher's process group), so
    they write a checkpoint and exit (see pretrain/train.py). The launcher and the ranks die with the
    calling process (:mod:`pretrain.liveness`). ``on_output``: called with the command and then each line
    the launcher and its ranks write (stdout and stderr merged), instead of printing them (the Prefect task
    streams them into the run's logs), and into ``<output_dir>/launcher.log``. Without it the console stays
    quiet: the whole output goes to ``<output_dir>/launcher.log`` and only :func:`console_line` lines are
    shown, plus the log's last lines if the launch fails; ``verbose`` (default: ``bertpipe -v``, via
    BERTPIPE_VERBOSE) shows everything on the console instead (and writes no launcher.log).
    """
    nodes = (node_rank, rdzv_id)
    if dry_run:
        return _launch(cfg, nproc, launcher, hostfile, num_nodes, master_addr, master_port, True, check, on_output,
                       verbose, nodes)
    if node_rank > 0:  # a node joining node 0's training: node 0's command holds the output dir's lock
        return _launch(cfg, nproc, launcher, hostfile, num_nodes, master_addr, master_port, False, check, on_output,
                       verbose, nodes)
    from pretrain.liveness import wait_for_old_ranks

    with output_dir_lock(cfg.output_dir):
        wait_for_old_ranks(cfg.output_dir)
        return _launch(cfg, nproc, launcher, hostfile, num_nodes, master_addr, master_port, False, check, on_output,
                       verbose, nodes)


def _launch(cfg: TrainConfig, nproc: int, launcher: str, hostfile: str, num_nodes: int, master_addr: str,
            master_port: int, dry_run: bool, check: bool, on_output: Callable[[str], None] | None,
            verbose: bool | None, nodes: tuple[int, str] = (-1, "")) -> int:
    from pretrain import checkpoint as ckpt
    from pretrain.extensions import build_roots, recover_stale_locks
    from pretrain.liveness import OWNER_ENV, exec_wrapper, owner_token

    def say(text: str) -> None:
        if on_output is None:
            print(text, flush=True)
        else:
            on_output(text)

    start = preflight(cfg) if check else None
    from pretrain.packing import packed_files
    from pretrain.recipe import recipe_line

    # what the run uses (lr schedule, clipping, batches' bins); contradicting flags are refused here, in one line
    recipe = recipe_line(cfg, packed=bool(cfg.train_dir) and packed_files(cfg.train_dir) is not None)
    node_rank, rdzv_id = nodes
    if start and start.note:  # `latest` is missing, damaged or names an incomplete checkpoint
        if not dry_run and node_rank <= 0:  # (node 0 repairs it)
            ckpt.write_latest(cfg.output_dir, start.tag)  # so the ranks resume the verified one
        say(start.note + ("" if dry_run else "; checkpoints/latest now names it"))
    if not master_port and not hostfile and node_rank < 0:
        master_port = free_port()
    cmd = build_command(cfg, nproc, launcher=launcher, hostfile=hostfile, num_nodes=num_nodes,
                        master_addr=master_addr, master_port=master_port, node_rank=node_rank, rdzv_id=rdzv_id)
    extra = launch_env(cfg, nproc)
    line = " ".join(f"{k}={shlex.quote(v)}" for k, v in extra.items()) + (" " if extra else "") + shlex.join(cmd)
    say(recipe)
    say(line)
    if dry_run:
        return 0
    recover_stale_locks(build_roots({**os.environ, **extra}), say=say)
    extra[OWNER_ENV] = owner_token()  # each rank's watchdog: stop when this process is gone
    if launcher == "deepspeed" and hostfile and node_rank < 0:  # over ssh: the other nodes' ranks need them too
        carried = {k: os.environ[k] for k in ("TORCH_EXTENSIONS_DIR",) if k in os.environ}  # (its build cache)
        extra["DS_ENV_FILE"] = str(ds_env_file(cfg.output_dir, {**carried, **extra}))
    quiet = on_output is None and not (verbose_from_env() if verbose is None else verbose)
    log_name = LAUNCHER_LOG if node_rank <= 0 else f"launcher.node{node_rank}.log"  # (a shared output dir)
    sink = _LauncherLog(Path(cfg.output_dir) / log_name) if quiet or on_output is not None else None
    failure = _Failure()  # the first rank error line: shown alone, and the whole training stopped
    if quiet:
        print(f"(launcher and rank output: {sink.path}; bertpipe -v shows it here)", flush=True)
    elif on_output is not None:
        relay = on_output

        def on_output(line: str) -> None:  # the callback's lines go to launcher.log as well
            sink.write(line)
            if failure.line is not None:  # after a rank's error line, the log only
                return
            error = failure.see(line)
            relay(error if error is not None else line)
    # one merged pipe: the log (and its last lines on failure) keeps the order the lines were written in; -v:
    # stdout and stderr each to theirs, every line
    pipe = dict(stdout=subprocess.PIPE, stderr=subprocess.STDOUT if sink else subprocess.PIPE, text=True,
                errors="replace", bufsize=1)
    # (the exec wrapper gives the launcher a parent-death signal: it dies when this thread's process does)
    proc = subprocess.Popen(exec_wrapper(cmd), env={**os.environ, **extra}, start_new_session=True, **pipe)
    failure.proc = proc
    if quiet:
        pumps = [threading.Thread(target=_pump, args=(proc.stdout, sink, sys.stderr, failure), daemon=True)]
    elif on_output is None:
        pumps = [threading.Thread(target=_pump, args=(pipe_, None, stream, failure, True), daemon=True)
                 for pipe_, stream in ((proc.stdout, sys.stdout), (proc.stderr, sys.stderr))]
    else:
        pumps = []
    for t in pumps:
        t.start()

    stopped: list[int] = []

    def forward(signum, frame):
        stopped.append(signum)
        # Ctrl-C as SIGTERM: each rank checkpoints (DeepSpeed's runner dies in a traceback on SIGINT). To the
        # ranks only: DeepSpeed's launch.py, signalled, SIGKILLs its ranks 30 s later, mid-eval or mid-save.
        if signal_ranks(proc.pid, signal.SIGTERM):
            return
        try:  # no rank yet (start-up): the launcher stops them
            os.killpg(proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass

    main = threading.current_thread() is threading.main_thread()  # Prefect may call from a worker thread
    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)} if main else {}
    try:
        if on_output is not None:
            _stream(proc.stdout, on_output)  # until the launcher and every rank closed it
        rc = proc.wait()
        if failure.line is not None:  # the launcher ended after a rank's error: whatever is left goes now
            failure.stop()
        wait_for_group(proc.pid)  # after a SIGTERM the ranks are still writing their checkpoint
        for t in pumps:
            t.join(timeout=30)
        if stopped:  # the user stopped it: not a failure
            from pretrain import checkpoint as ckpt

            tag = ckpt.latest_tag(cfg.output_dir)
            name = "Ctrl-C" if stopped[0] == signal.SIGINT else signal.Signals(stopped[0]).name
            print(f"training stopped by {name}: " + (f"checkpoint {tag} saved in {cfg.output_dir}; add --resume to "
                  "continue" if tag else "no checkpoint yet (stopped before the first one)"), file=sys.stderr)
            return 128 + stopped[0]
        if failure.line is not None:  # a rank's one error line is shown: it is the whole report
            return failure.status
        if quiet and rc != 0:
            print(f"training failed (exit status {rc}); the last lines of {sink.path}:", file=sys.stderr)
            for last in sink.last:
                print(f"  {last}", file=sys.stderr)
            sys.stderr.flush()
        return rc
    finally:
        if master_port:  # the ranks are gone (or stopped): DeepSpeed leaves its CPU all-reduce segments behind
            from pretrain.extensions import release_shm_buffers

            release_shm_buffers(master_port, say=sink.write if sink is not None else
                                lambda text: print(text, file=sys.stderr, flush=True))  # -v: on the console
        if sink is not None:
            sink.close()
        for s, h in previous.items():
            signal.signal(s, h)


def _stream(pipe, on_output: Callable[[str], None]) -> None:
    """Each line of ``pipe`` to ``on_output``; a failing callback never stops the reading (the ranks would
    block on a full pipe)."""
    for line in pipe:
        try:
            on_output(line.rstrip("\n"))
        except Exception:  # noqa: BLE001
            log.exception("on_output failed for a launcher line")
    pipe.close()


def wait_for_group(pgid: int, timeout: float = 120.0) -> bool:
    """Wait until no process of group ``pgid`` is left (True), or ``timeout`` seconds (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return True
        time.sleep(0.5)
    return False
