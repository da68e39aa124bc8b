"""The run token: how a call proves it sees the run's work dir, and learns that the run has ended.

At its start the data DAG writes ``<work>/.bertpipe-run-<id>`` (:func:`start_run`) and every call carries the
token (:class:`RunToken`). A call reads the file first (:func:`entered`): a worker that does not find it does
not see the work dir (its shared mount is missing, or it sees another copy) and fails the call with one line
naming its host and the path (:class:`WorkDirNotSeen`), before it writes anything. While the call runs, every
stage output asks the token again before it starts and before it commits its manifest (the commit gate of
``core.manifest``); the flow removes the file when the run ends, however it ends (:func:`end_run`; after a
``kill -9`` of the command a watchdog process removes it within a second), so a call still running somewhere
commits no manifest after that (:class:`RunEnded`).

Prefect-free and Dask-free: pool workers and Dask workers import this module. :func:`probe_worker` is what
``bertpipe run --dask-address`` runs on every worker before any work (flows/cluster.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from core.errors import BertpipeError

TOKEN_PREFIX = ".bertpipe-run-"
_WATCH_S = 0.3  # the watchdog's poll: a kill -9 of the run is seen within this


class WorkDirNotSeen(BertpipeError):
    """A call runs where the run's work dir is not (a Dask worker without the shared mount)."""


class RunEnded(BertpipeError):
    """A call (or a stage output in it) that would commit after its run has ended."""


@dataclass(frozen=True)
class RunToken:
    """What a call needs to find its run: the work dir, the token file's name and the value inside it."""

    work: str
    value: str

    @property
    def path(self) -> Path:
        return Path(self.work) / f"{TOKEN_PREFIX}{self.value}"


def where() -> str:
    """This process's place, for messages: host, and the Dask worker's address when running in one."""
    host = socket.gethostname()
    dist = sys.modules.get("distributed")
    if dist is not None:
        try:
            return f"host {host} (Dask worker {dist.get_worker().address})"
        except (ValueError, AttributeError):  # not inside a Dask task
            pass
    return f"host {host} (pid {os.getpid()})"


def read_token(token: RunToken) -> str:
    """"" when ``token``'s file is there and holds its value, else what is wrong (one phrase)."""
    try:
        with open(token.path, encoding="utf-8") as f:
            found = json.loads(f.read() or "{}").get("run")
    except FileNotFoundError:
        return f"{token.path} is not there"
    except (OSError, ValueError, AttributeError) as exc:
        return f"{token.path} cannot be read ({getattr(exc, 'strerror', None) or exc})"
    return "" if found == token.value else f"{token.path} names another run"


def _lock_seen(work: str) -> bool:
    from core.lock import LOCK_NAME

    return os.path.isfile(os.path.join(work, LOCK_NAME))


def check_sees(token: RunToken) -> None:
    """Raise WorkDirNotSeen (or RunEnded) unless this process sees ``token``'s file: the run's work dir, live."""
    why = read_token(token)
    if not why:
        return
    if _lock_seen(token.work):  # the work dir is here (it has bertpipe's lock file), the token is not
        raise RunEnded(f"{where()}: the run that sent this call has ended ({why}), or this worker sees another "
                       f"copy of the work dir {token.work}; nothing was written")
    raise WorkDirNotSeen(f"{where()} does not see the run's work dir {token.work} ({why}); mount the shared work "
                         "dir at the same path on every Dask worker (or stop this worker) and run again")


def ensure_live(token: RunToken, what: str) -> None:
    """The commit gate of a call: raise RunEnded when ``token``'s run has ended (its file is gone)."""
    why = read_token(token)
    if why and not _lock_seen(token.work):  # the whole work dir is gone from here: its mount went away
        raise WorkDirNotSeen(f"{where()} no longer sees the run's work dir {token.work} ({why}) while {what} was "
                             "being written; not committed. Mount the shared work dir at the same path on every "
                             "Dask worker (or stop this worker) and run again")
    if why:
        raise RunEnded(f"{where()}: the run ended while {what} was being written ({why}); not committed, the "
                       "next run redoes it")


@contextmanager
def entered(token: RunToken | None) -> Iterator[None]:
    """Around one call: check that the work dir is seen, then gate every commit of the call on the run."""
    if token is None:
        yield
        return
    from core.manifest import commit_gate

    check_sees(token)
    with commit_gate(lambda what: ensure_live(token, what)):
        yield


# -- the flow's side --------------------------------------------------------------------------------------
def start_run(work: str | os.PathLike) -> RunToken:
    """Write a new token into ``work`` (held locked by this run), removing tokens of earlier, dead runs, and
    start the watchdog that removes it if this process dies without :func:`end_run`."""
    work = Path(work)
    for old in work.glob(TOKEN_PREFIX + "*"):
        old.unlink(missing_ok=True)
    token = RunToken(str(work), uuid.uuid4().hex)
    from core.manifest import atomic_write_text

    atomic_write_text(token.path, json.dumps({"run": token.value, "host": socket.gethostname(), "pid": os.getpid(),
                                              "started": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
    _WATCHDOGS[token.value] = _watchdog(token.path)
    return token


def end_run(token: RunToken | None) -> None:
    """The run is over: its token goes (no call commits after this), and its watchdog with it. Idempotent."""
    if token is None:
        return
    token.path.unlink(missing_ok=True)
    dog = _WATCHDOGS.pop(token.value, None)
    if dog is not None and dog.poll() is None:
        dog.kill()
        dog.wait()


_WATCHDOGS: dict[str, subprocess.Popen] = {}
_WATCHDOG = 'while kill -0 "$1" 2>/dev/null; do sleep "$3"; done; rm -f -- "$2"'


def _watchdog(path: Path) -> subprocess.Popen | None:
    """A small process that removes ``path`` once this one is gone (kill -9 included). Not in the run's reaper
    list (no BERTPIPE_RUN_TOKEN in its environment): it must outlive the run's own processes."""
    env = {k: v for k, v in os.environ.items() if k != "BERTPIPE_RUN_TOKEN"}
    try:
        return subprocess.Popen(["sh", "-c", _WATCHDOG, "bertpipe-token-watch", str(os.getpid()), str(path),
                                 str(_WATCH_S)], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:  # no sh: the token then outlives a kill -9 (the next run removes it)
        return None


# -- what `bertpipe run --dask-address` asks every worker before any work (flows/cluster.py) ---------------
def probe_worker(api_url: str, token: RunToken | None, timeout_s: float = 5.0,
                 inputs: tuple[str, ...] = ()) -> dict[str, str]:
    """Runs on a Dask worker: can it reach the Prefect API at ``api_url`` (the head's: Prefect sends the head's
    settings with each task), see the run's work dir and the run's ``inputs`` (paths outside the work dir that
    calls read)? {"host", "api", "work", "inputs"}: "" where fine, else why."""
    import urllib.error
    import urllib.request

    out = {"host": socket.gethostname(), "api": "", "work": "", "inputs": ""}
    missing = [p for p in inputs if not os.path.exists(p)]
    if missing:
        out["inputs"] = f"{missing[0]} is not there" + (f" (nor {len(missing) - 1} more)" if len(missing) > 1 else "")
    if api_url:
        url = api_url.rstrip("/") + "/health"
        try:
            with urllib.request.urlopen(url, timeout=timeout_s) as r:  # noqa: S310 - the run's own API URL
                if r.status != 200:
                    out["api"] = f"GET {url} answered HTTP {r.status}"
        except (urllib.error.URLError, OSError, ValueError) as exc:
            out["api"] = f"GET {url} failed: {getattr(exc, 'reason', None) or exc}"
    if token is not None:
        out["work"] = read_token(token)
    return out
