"""The work-dir lock: one ``bertpipe run`` (or deployment run) writes into a work dir at a time.

``fcntl.flock`` on ``<work>/.bertpipe.lock``: the kernel drops the lock when its holder dies, so a
lock left by a ``kill -9`` is never stale — the next run takes it at once. The file's content (pid,
host, start time, command) only serves the message shown to a second run. Re-entrant within one
process (the end-to-end flow calls the data flow). Needs a file system with working flock (local
disks do; some NFS setups do not).
"""

from __future__ import annotations

import fcntl
import json
import os
import socket
import sys
import threading
import time
from pathlib import Path
from typing import IO

from core.errors import InputError

LOCK_NAME = ".bertpipe.lock"
_HELD: dict[str, tuple[IO[str], int]] = {}
_GUARD = threading.Lock()


def _holder(f: IO[str]) -> str:
    f.seek(0)
    try:
        info = json.loads(f.read() or "{}")
    except ValueError:
        info = {}
    if not info:
        return "another process"
    return f"pid {info.get('pid')} on {info.get('host')} (started {info.get('started')}: {info.get('cmd')})"


class WorkDirLock:
    """Exclusive lock on a work dir; ``wait_s`` > 0 waits that long for it, 0 refuses at once."""

    def __init__(self, work_dir: str | os.PathLike, wait_s: float = 0.0, *, what: str = "work dir",
                 advice: str = "wait for that run to finish (or pass --wait-lock SECONDS), or use another --work-dir"
                 ) -> None:
        self.work_dir = Path(work_dir)
        self.wait_s = wait_s
        self.what, self.advice = what, advice  # the refusal: "<what> X is in use by <holder>; <advice>"
        self._key = ""

    def __enter__(self) -> WorkDirLock:
        try:
            self.work_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a file in the way (FileExistsError, NotADirectoryError), a read-only parent
            raise InputError(f"cannot use {self.work_dir} as a work dir: {exc.strerror or exc} ({exc.filename or ''}); "
                             "give a folder (it is created if missing)") from None
        self._key = str(self.work_dir.resolve())
        with _GUARD:
            if self._key in _HELD:
                f, n = _HELD[self._key]
                _HELD[self._key] = (f, n + 1)
                return self
        try:
            f = open(self.work_dir / LOCK_NAME, "a+", encoding="utf-8")  # noqa: SIM115 - held until __exit__
        except OSError as exc:  # a folder named .bertpipe.lock, a read-only work dir
            raise InputError(f"cannot create the lock file {self.work_dir / LOCK_NAME}: {exc.strerror or exc}; "
                             "remove what is in its place, or use another --work-dir") from None
        deadline = time.monotonic() + self.wait_s
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    who = _holder(f)
                    f.close()
                    raise InputError(f"{self.what} {self.work_dir} is in use by {who}; {self.advice}") from None
                time.sleep(0.5)
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                            "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "cmd": " ".join(sys.argv)[:300]}))
        f.flush()
        with _GUARD:
            _HELD[self._key] = (f, 1)
        return self

    def __exit__(self, *exc: object) -> None:
        with _GUARD:
            f, n = _HELD[self._key]
            if n > 1:
                _HELD[self._key] = (f, n - 1)
                return
            del _HELD[self._key]
        f.seek(0)
        f.truncate()
        f.flush()
        fcntl.flock(f.fileno(), fcntl.LOCK_UN)
        f.close()
