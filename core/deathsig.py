"""The kernel's parent-death signal (Linux ``prctl(PR_SET_PDEATHSIG)``), and the forkserver's use of it.

Imported by a forkserver that :func:`core.pools.start_forkserver` starts (it is in the forkserver's preload
list): when ``$BERTPIPE_FORKSERVER_OWNER`` names this process's parent, the forkserver asks the kernel for
SIGKILL when that parent dies, and dies at once if the parent is already gone. Its pool workers have the same
signal towards the forkserver (core/pools.py), so a ``kill -9`` of the process that started them ends them
all, even a worker busy in native code. Standard library only.
"""

from __future__ import annotations

import os
import signal
import sys

OWNER_ENV = "BERTPIPE_FORKSERVER_OWNER"
PR_SET_PDEATHSIG = 1


def set_parent_death_signal(sig: int = signal.SIGKILL) -> bool:
    """``prctl(PR_SET_PDEATHSIG, sig)`` for this process: ``sig`` when the thread that started it ends.
    False where that does not exist."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes
        import ctypes.util

        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        return libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _forkserver_preload() -> None:
    owner = os.environ.get(OWNER_ENV, "")
    if not owner.isdigit() or int(owner) != os.getppid():
        return
    if set_parent_death_signal() and os.getppid() != int(owner):  # the owner died before the prctl
        os._exit(1)


if "multiprocessing.forkserver" in sys.modules and sys.argv[:1] == ["-c"]:  # imported by a forkserver at start
    _forkserver_preload()
