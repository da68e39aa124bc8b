"""Is a process still the one we mean? Its start time from /proc, and whether it runs (not a zombie).

A pid alone can be reused once its process is gone; (pid, start time) names one process for good. Used by the
pool workers' owner watch (core/pools.py) and the training launcher's and ranks' liveness (pretrain/liveness.py).
"""

from __future__ import annotations

import os


def start_time(pid: int) -> str | None:
    """The start time of ``pid`` (clock ticks since boot, /proc/PID/stat field 22); None without /proc or pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()[19]


def process_alive(pid: int, start: str | None = None) -> bool:
    """Whether ``pid`` runs (not a zombie) and, when ``start`` is given and /proc exists, is the process that
    started then (not a later process that reuses the pid)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except FileNotFoundError:
        return False
    except OSError:  # no /proc (macOS): signal 0 tells whether the pid exists
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True
    fields = stat[stat.rfind(")") + 2:].split()
    if fields[0] in ("Z", "X", "x"):  # a zombie is dead, whether or not its parent has reaped it
        return False
    return start is None or fields[19] == start
