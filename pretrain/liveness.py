"""A training dies with the command that started it, and one training writes into an output dir at a time.

``bertpipe train`` (or the Prefect task, or any caller of :func:`pretrain.launch.launch`) is the *owner*
of a training: the DeepSpeed launcher and the ranks it starts must not outlive it, even when it is killed
with ``kill -9`` (or by the OOM killer) and no handler runs. Three layers, Linux first, degrading to the
watchdog elsewhere:

* the launcher is started through this file as an exec wrapper (``python liveness.py exec PID -- CMD``):
  it sets ``prctl(PR_SET_PDEATHSIG, SIGKILL)`` and then execs the launcher, so the kernel kills the
  launcher when the owner dies (the owner calls ``Popen`` from the thread that waits for it);
* each rank started by DeepSpeed's ``launch.py`` sets the same parent-death signal towards ``launch.py``;
* each rank runs a watchdog thread (:func:`guard_rank`) that polls the owner (pid and start time, from
  :data:`OWNER_ENV`) every second; when the owner is gone (a zombie counts as gone), it SIGKILLs the
  launcher's whole process group (the session ``launch`` created) and itself: no further step, write or
  checkpoint. A checkpoint half-written at that moment has no completion record and is never resumed.

Every rank also holds a shared ``flock`` on ``OUTPUT_DIR/.bertpipe.ranks.lock`` for its lifetime
(:func:`hold_ranks_lock`); :func:`wait_for_old_ranks` (the owner, before launching) takes it exclusively
for a moment, so ranks of an earlier training still alive in that dir (a launcher killed elsewhere, a
``deepspeed pretrain/train.py`` started by hand) are found and named before a second training starts.

This module imports only the standard library: it runs as the exec wrapper before anything else.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path

from core.procs import process_alive, start_time  # noqa: F401  (re-exported: the launcher's and tests' names)

log = logging.getLogger("pretrain.liveness")

#: ``"<pid>:<start time>:<host>"`` of the process that owns the training (set by pretrain/launch.py)
OWNER_ENV = "BERTPIPE_TRAIN_OWNER"
RANKS_LOCK = ".bertpipe.ranks.lock"
PR_SET_PDEATHSIG = 1
_LIBC = None


def _libc():
    global _LIBC
    if _LIBC is None:
        import ctypes
        import ctypes.util

        _LIBC = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    return _LIBC


def owner_token(pid: int | None = None) -> str:
    """The value of :data:`OWNER_ENV` naming ``pid`` (default: this process)."""
    pid = os.getpid() if pid is None else pid
    return f"{pid}:{start_time(pid) or ''}:{socket.gethostname()}"


def parse_owner(token: str) -> tuple[int, str | None, str] | None:
    try:
        pid, start, host = token.split(":", 2)
        return int(pid), start or None, host
    except ValueError:
        return None


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """``prctl(PR_SET_PDEATHSIG, sig)``: the kernel sends ``sig`` to this process when the thread that
    forked it ends. False where that does not exist (not Linux)."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        return _libc().prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def exec_with_parent_death(parent: int, argv: list[str]) -> None:
    """Set the parent-death signal, check the parent did not die before that, and exec ``argv``
    (the signal setting survives exec of a normal, non-setuid program)."""
    set_parent_death_signal()
    if os.getppid() != parent:  # the owner died between our fork and the prctl: nothing to run for
        os._exit(137)
    os.execvp(argv[0], argv)


def exec_wrapper(argv: list[str]) -> list[str]:
    """``argv`` run through this file as a parent-death exec wrapper for the calling process (Linux); the
    unchanged ``argv`` elsewhere."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    return [sys.executable, str(Path(__file__).resolve()), "exec", str(os.getpid()), "--", *argv]


def _parent_is_deepspeed_launch() -> bool:
    try:
        cmdline = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return b"deepspeed.launcher.launch" in cmdline


def _kill_training(reason: str) -> None:
    """SIGKILL the launcher's process group (when ``launch`` made it: a session of its own, not the owner's)
    and this rank."""
    try:
        print(f"rank {os.environ.get('RANK', '?')} (pid {os.getpid()}): {reason}: stopping now", file=sys.stderr,
              flush=True)
    except (OSError, ValueError):  # the owner's end of the pipe is gone
        pass
    try:
        pgid = os.getpgid(0)
        if pgid == os.getsid(0) and pgid != os.getpid():  # the launcher's new session: every process of it
            os.killpg(pgid, signal.SIGKILL)
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGKILL)


def guard_rank(interval: float = 1.0) -> threading.Thread | None:
    """In a rank: die with the owner named in :data:`OWNER_ENV` (absent: started by hand, nothing to do).

    Sets the parent-death signal towards DeepSpeed's ``launch.py`` when that is the parent, and starts the
    watchdog thread; returns it (None when there is no owner on this host)."""
    owner = parse_owner(os.environ.get(OWNER_ENV, ""))
    if owner is None or owner[2] != socket.gethostname():  # another node's owner: its launcher's job
        return None
    pid, start, _ = owner
    if _parent_is_deepspeed_launch():
        parent = os.getppid()
        if set_parent_death_signal() and os.getppid() != parent:
            _kill_training("the DeepSpeed launcher died during start-up")
    if not process_alive(pid, start):
        _kill_training(f"the command that started this training (pid {pid}) is gone")

    def watch() -> None:
        while True:
            time.sleep(interval)
            if not process_alive(pid, start):
                _kill_training(f"the command that started this training (pid {pid}) is gone")

    t = threading.Thread(target=watch, name="bertpipe-owner-watchdog", daemon=True)
    t.start()
    return t


def hold_ranks_lock(output_dir: str | os.PathLike):
    """A shared flock on ``OUTPUT_DIR/.bertpipe.ranks.lock``, held (by the returned open file) until this
    rank exits. None where flock does not work (the owner's check is then skipped)."""
    try:
        import fcntl

        Path(output_dir).mkdir(parents=True, exist_ok=True)
        f = open(Path(output_dir) / RANKS_LOCK, "a+")  # noqa: SIM115 - held for the process's life
        fcntl.flock(f.fileno(), fcntl.LOCK_SH)
        return f
    except (ImportError, OSError) as exc:
        log.debug("no ranks lock in %s: %s", output_dir, exc)
        return None


def ranks_alive(output_dir: str | os.PathLike) -> bool:
    """Whether any rank holds ``OUTPUT_DIR/.bertpipe.ranks.lock`` (False when it cannot be told)."""
    path = Path(output_dir) / RANKS_LOCK
    if not path.is_file():
        return False
    try:
        import fcntl

        with open(path, "a+") as f:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return True
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
    except (ImportError, OSError):
        return False
    return False


def wait_for_old_ranks(output_dir: str | os.PathLike, wait_s: float = 15.0) -> None:
    """Refuse (InputError) when ranks of an earlier training still run in ``output_dir`` after ``wait_s``
    seconds (ranks of a killed owner need a moment to notice)."""
    deadline = time.monotonic() + wait_s
    while ranks_alive(output_dir):
        if time.monotonic() >= deadline:
            from core.errors import InputError

            path = Path(output_dir) / RANKS_LOCK
            raise InputError(f"ranks of an earlier training still run in --output-dir {output_dir} (they hold "
                             f"{path}; `fuser -v {path}` lists them): stop them, or use another --output-dir")
        time.sleep(0.5)


def _main(argv: list[str]) -> int:
    if len(argv) >= 4 and argv[0] == "exec" and argv[2] == "--":
        exec_with_parent_death(int(argv[1]), argv[3:])
    print("usage: python liveness.py exec PARENT_PID -- COMMAND [ARGS...]", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
