"""Stale JIT-extension build locks: found and removed before a training starts, named while a rank waits.

DeepSpeed builds its C++ ops (on CPU: ``deepspeed_shm_comm``) with ``torch.utils.cpp_extension.load``,
which guards each build folder with a ``FileBaton``: the file ``<build dir>/lock``, created with
O_EXCL and removed when the build ends. A process killed while it holds the baton (``kill -9`` of a
training during its first start-up) leaves the file behind, and every later process that loads the op
polls for it to go away, forever and silently.

Rule (:func:`lock_state`): a baton is *stale* when it is older than :data:`GRACE_S` and no live process
works in its build folder (a build runs ``ninja`` with the folder as its working directory, and the
compilers it starts inherit it; the few seconds before ninja starts are covered by the grace period).
Only processes of the build folder's owner are looked at (torch's build folders are per user); when they
cannot be inspected (no /proc, a hidden working directory), a baton is never called stale. ``pretrain/launch.py`` removes stale batons before it starts the ranks (ninja then
rebuilds whatever the killed build left unfinished: a command that never completed has no entry in
its ``.ninja_log``), and each rank's start-up watch (:func:`watch_build_locks`) names the baton it
waits on, and how to remove it, within seconds.

Build roots: ``$TORCH_EXTENSIONS_DIR`` if set, else torch's default ``~/.cache/torch_extensions``
(``$XDG_CACHE_HOME``) with its ``py311_cpu``-style sub-folders: batons one or two levels below.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

log = logging.getLogger("pretrain.extensions")

BATON = "lock"
#: a baton younger than this is never stale (its holder may still be before ninja's start)
GRACE_S = 60.0


def build_roots(env: dict[str, str] | None = None) -> list[Path]:
    """The folders under which torch builds JIT extensions for this environment."""
    env = os.environ if env is None else env
    if env.get("TORCH_EXTENSIONS_DIR"):
        return [Path(env["TORCH_EXTENSIONS_DIR"])]
    cache = env.get("XDG_CACHE_HOME") or str(Path(env.get("HOME") or Path.home()) / ".cache")
    return [Path(cache) / "torch_extensions"]


def build_locks(roots: list[Path]) -> list[Path]:
    """Every baton file one or two levels below ``roots`` (``<root>/<name>/lock``, ``<root>/py311_cpu/<name>/lock``)."""
    found: list[Path] = []
    for root in roots:
        for pattern in (f"*/{BATON}", f"*/*/{BATON}"):
            try:
                found += [p for p in root.glob(pattern) if p.is_file() and not p.is_symlink()]
            except OSError:
                continue
    return sorted(set(found))


def _builders(folder: Path) -> list[int] | None:
    """Pids of live processes whose working directory is ``folder`` or below it; None when that cannot be
    told (no /proc, or a process of the folder's owner whose cwd may not be read). Processes of other users
    are not asked (torch's build folders are per user), nor is pid 1 (init builds nothing; some sandboxes
    hide its cwd even from root)."""
    proc = Path("/proc")
    if not (proc / "self" / "cwd").exists():
        return None
    target = os.path.realpath(folder)
    try:
        owner = os.stat(folder).st_uid
    except OSError:
        return None
    pids, unknown = [], False
    for entry in proc.iterdir():
        if not entry.name.isdigit() or entry.name == "1":
            continue
        try:
            cwd = os.readlink(entry / "cwd")
        except FileNotFoundError:  # ended meanwhile
            continue
        except PermissionError:
            try:
                unknown = unknown or entry.stat().st_uid == owner
            except OSError:
                pass
            continue
        except OSError:
            continue
        if cwd == target or cwd.startswith(target + os.sep):
            pids.append(int(entry.name))
    return None if unknown and not pids else pids


def lock_state(baton: Path, grace_s: float = GRACE_S, now: float | None = None) -> tuple[str, str]:
    """``("stale" | "live" | "unknown" | "gone", detail)`` of one baton (see the module's rule)."""
    try:
        age = (time.time() if now is None else now) - baton.stat().st_mtime
    except FileNotFoundError:
        return "gone", "removed meanwhile"
    builders = _builders(baton.parent)
    if builders:
        return "live", f"a build runs in {baton.parent} (pid {', '.join(map(str, builders[:4]))})"
    if age < grace_s:
        return "live", f"taken {age:.0f} s ago: a build may be starting"
    if builders is None:
        return "unknown", f"{age:.0f} s old; the processes of this machine cannot be inspected"
    return "stale", f"{age:.0f} s old and no process builds in {baton.parent}"


def recover_stale_locks(roots: list[Path] | None = None, grace_s: float = GRACE_S,
                        say: Callable[[str], None] = print) -> list[Path]:
    """Remove every stale baton under ``roots`` (default: :func:`build_roots`), one line each; returns them."""
    removed = []
    for baton in build_locks(build_roots() if roots is None else roots):
        state, detail = lock_state(baton, grace_s)
        if state != "stale":
            continue
        try:
            baton.unlink()
        except FileNotFoundError:
            continue
        except OSError as exc:
            say(f"a stale torch extension build lock {baton} ({detail}) cannot be removed ({exc.strerror}): "
                f"remove it by hand (rm {baton}), or every training waits for it")
            continue
        removed.append(baton)
        say(f"removed a stale torch extension build lock {baton} ({detail}: left by a killed build)")
    return removed


def watch_build_locks(done: threading.Event, after_s: float = 5.0, interval: float = 2.0,
                      roots: list[Path] | None = None) -> threading.Thread:
    """In a rank, until ``done`` is set: each baton present for ``after_s`` seconds is named once (WARNING when
    nobody builds under it, with the command that removes it)."""

    def watch() -> None:
        first_seen: dict[Path, float] = {}
        told: set[Path] = set()
        while not done.wait(interval):
            for baton in build_locks(build_roots() if roots is None else roots):
                seen = first_seen.setdefault(baton, time.monotonic())
                if baton in told or time.monotonic() - seen < after_s:
                    continue
                state, detail = lock_state(baton)
                if state == "gone":
                    continue
                told.add(baton)
                if state == "live":
                    log.info("waiting for the torch extension build lock %s (%s)", baton, detail)
                else:
                    log.warning("waiting for the torch extension build lock %s (%s): if no build of this "
                                "extension runs on this machine, remove it: rm %s", baton, detail, baton)

    t = threading.Thread(target=watch, name="bertpipe-build-lock-watch", daemon=True)
    t.start()
    return t


#: DeepSpeed's CPU all-reduce (``deepspeed_shm_comm``, used when every rank is on this machine) maps one POSIX
#: shared-memory segment a rank, ``/dev/shm/deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_<MASTER_PORT>_<rank>``
#: (~69 MB), and never unlinks it: each CPU training left ~138 MB of memory behind (a day of test runs: 12 GB).
SHM_DIR = Path("/dev/shm")
SHM_PREFIX = "deepspeed_allreduce_buffer"


def shm_buffers(master_port: int, uid: int | None = None, shm_dir: Path = SHM_DIR) -> list[Path]:
    """The ranks' DeepSpeed all-reduce segments of the training on ``master_port`` (any address), this user's."""
    uid = os.getuid() if uid is None else uid
    if not master_port or not shm_dir.is_dir():
        return []
    return sorted(p for p in shm_dir.glob(f"{SHM_PREFIX}_{uid}_*_{master_port}_*")
                  if p.name.rsplit("_", 1)[-1].isdigit())


def release_shm_buffers(master_port: int, *, say: Callable[[str], None] | None = None,
                        shm_dir: Path = SHM_DIR) -> int:
    """Unlink the ranks' all-reduce segments of the training on ``master_port`` once its ranks are gone (the
    launcher calls it however they ended: a mapping still held stays valid, only the name goes). Returns how many
    were removed."""
    gone = 0
    for p in shm_buffers(master_port, shm_dir=shm_dir):
        try:
            p.unlink()
            gone += 1
        except FileNotFoundError:
            pass
        except OSError as exc:  # not ours to remove: say so, do not fail the training for it
            log.warning("could not remove DeepSpeed's shared-memory segment %s: %s", p, exc)
    if gone and say is not None:
        say(f"removed DeepSpeed's {gone} shared-memory all-reduce segment(s) of this training (master port "
            f"{master_port}) from {shm_dir}")
    return gone
