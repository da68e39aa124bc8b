"""The Prefect server a flow-running command uses: checked before any work, watched while the run goes on.

* :func:`preflight` (before the work dir is touched): ``PREFECT_API_URL``, when set, must answer
  ``GET <url>/health`` with 200 ``true`` within a few seconds (plain urllib, before Prefect is imported when
  the URL comes from the environment); Prefect's home (``PREFECT_HOME``, default ``~/.prefect``: the temporary
  server's database and the task result records) must be a writable folder or creatable. Each failure is one
  line naming the URL or the folder and what to do.
* :func:`start_temporary_server` (no ``PREFECT_API_URL``): Prefect's temporary server is started before the
  flow, one start-up at a time per ``PREFECT_HOME`` (a lock file there: two servers migrating one SQLite
  database at once fail with "duplicate column" tracebacks), with a start-up timeout of
  :data:`STARTUP_TIMEOUT_S` unless ``PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS`` is set; a start-up that
  still times out is one line naming that setting.
* :class:`ServerWatch`: a thread that asks the server's ``/health`` every few seconds during the run; when it
  has not answered for :data:`GONE_AFTER_S` (or ``BERTPIPE_PREFECT_PATIENCE_S``) it stops the command (:func:`bertpipe.cli.abort`): one line naming
  the URL, exit 2, running calls stopped (their manifests are gated on the run: tasks/runtoken.py).
* :func:`crash_orphans` / :func:`record_run`: every flow run of a command carries a tag ``bertpipe-run:<id>``,
  recorded in the locked folder (``.bertpipe-prefect.json``). The next command on that folder holds its lock,
  so the recorded run is over: its flow and task runs that the server still shows as Running or Pending (the
  server was gone when it ended, or it was killed) are set Crashed.

Prefect itself is imported only where needed (the server's start, the crash marking).
"""

from __future__ import annotations

import base64
import contextlib
import json
import logging
import os
import re
import socket
import stat
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from core.errors import InputError

#: seconds the health check waits for an answer before the run (a dead port answers at once)
PROBE_TIMEOUT_S = 8.0
#: the temporary server's start-up timeout unless PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS is set
#: (Prefect's default, 20 s, is too short on a busy 2-core machine: its database migrations alone take longer)
STARTUP_TIMEOUT_S = 120
STARTUP_ENV = "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"
#: during a run: a health check every WATCH_EVERY_S, each waiting WATCH_TIMEOUT_S; the server is gone when
#: none has answered for GONE_AFTER_S (and at least GONE_AFTER_N checks in a row failed)
WATCH_EVERY_S, WATCH_TIMEOUT_S, GONE_AFTER_S, GONE_AFTER_N = 2.0, 8.0, 20.0, 3
#: seconds without an answer before the run is stopped, when set (instead of GONE_AFTER_S): for a server known to
#: stall (a remote one, a SQLite database on a slow disk: 30 s locks were seen on a loaded 2-core CI machine)
PATIENCE_ENV = "BERTPIPE_PREFECT_PATIENCE_S"
RECORD_NAME = ".bertpipe-prefect.json"
TAG_PREFIX = "bertpipe-run:"


# -- the health check --------------------------------------------------------------------------------------
def _auth_headers(api_key: str | None, auth_string: str | None) -> dict[str, str]:
    if api_key:
        return {"Authorization": f"Bearer {api_key}"}
    if auth_string:
        return {"Authorization": "Basic " + base64.b64encode(auth_string.encode()).decode()}
    return {}


def health(url: str, timeout: float = PROBE_TIMEOUT_S, *, api_key: str | None = None,
           auth_string: str | None = None) -> str:
    """"" when ``GET <url>/health`` answers 200 with ``true`` within ``timeout`` seconds, else what went wrong
    (a short phrase for a message)."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        return "it is not an http(s) URL (expected e.g. http://127.0.0.1:4200/api)"
    target = url.rstrip("/") + "/health"
    req = urllib.request.Request(target, headers={"Accept": "application/json",  # noqa: S310 - http(s) only
                                                  **_auth_headers(api_key, auth_string)})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310
            body = r.read(200).decode("utf-8", "replace").strip()
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return "HTTP 404 for /health: a web server, but not a Prefect API (whose URL ends in /api, e.g. " \
                   "http://127.0.0.1:4200/api)"
        if exc.code in (401, 403):
            return f"HTTP {exc.code}: the server refuses the credentials (PREFECT_API_KEY / PREFECT_API_AUTH_STRING)"
        return f"HTTP {exc.code} {exc.reason}"
    except TimeoutError:
        return f"no answer within {timeout:g} s"
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, TimeoutError):
            return f"no answer within {timeout:g} s"
        if isinstance(reason, ConnectionRefusedError):
            return "connection refused: nothing listens there"
        if isinstance(reason, socket.gaierror):
            return f"host {parts.hostname!r} not found"
        return str(getattr(reason, "strerror", None) or reason)
    except (ConnectionError, OSError) as exc:  # reset or closed mid-answer
        return f"the connection failed ({exc.strerror or type(exc).__name__})"
    except ValueError as exc:  # a malformed URL that urlsplit let through
        return f"it is not a usable URL ({exc})"
    if body.lower() != "true":
        return f"GET {target} answered 200 but not as a Prefect API does ({body[:60]!r} instead of true)"
    return ""


def patience_s() -> float:
    """Seconds a server may go without answering before the run is stopped: ``BERTPIPE_PREFECT_PATIENCE_S``
    when set (a positive number of seconds), else :data:`GONE_AFTER_S`."""
    raw = _env(PATIENCE_ENV)
    if raw is None:
        return GONE_AFTER_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise InputError(f"{PATIENCE_ENV}={raw!r}: expected a positive number of seconds (how long the Prefect "
                         f"server may not answer before the run is stopped; default {GONE_AFTER_S:g})")
    return value


def _env(name: str) -> str | None:
    value = os.environ.get(name, "").strip()
    return value or None


def check_api(url: str, *, api_key: str | None = None, auth_string: str | None = None) -> None:
    """One line (InputError) unless the Prefect API at ``url`` answers its health check."""
    why = health(url, api_key=api_key, auth_string=auth_string)
    if why:
        raise InputError(f"PREFECT_API_URL={url}: no Prefect API answers there: {why}. Start the server "
                         "(`prefect server start`), correct PREFECT_API_URL, or unset it to run with a temporary "
                         "local server")


# -- Prefect's home ----------------------------------------------------------------------------------------
def _writable_dir(path: Path) -> bool:
    """Mode bits count even for root (as core/paths.py does), and a read-only mount."""
    st = path.stat()
    if not st.st_mode & 0o222 or not os.access(path, os.W_OK | os.X_OK):
        return False
    try:
        return not os.statvfs(path).f_flag & os.ST_RDONLY
    except (OSError, AttributeError):
        return True


def home_problem(home: Path) -> str:
    """"" when ``home`` is a writable folder, or can be made (its nearest existing parent is a writable folder);
    else what is wrong, naming the folder."""
    q = home
    try:
        while not q.exists():
            if q.parent == q:
                return ""
            q = q.parent
        if not q.is_dir():
            return f"{q} is a file, not a folder"
        if not _writable_dir(q):
            mode = stat.filemode(q.stat().st_mode)
            return f"{q} is read-only (mode {mode})" if q == home else \
                f"it cannot be created: {q} is read-only (mode {mode})"
    except OSError as exc:
        return f"{q}: {exc.strerror or exc}"
    return ""


def check_home(home: Path, *, from_env: bool) -> None:
    """One line (InputError) unless Prefect's home folder is writable (or can be created)."""
    why = home_problem(home)
    if not why:
        return
    if from_env:
        raise InputError(f"PREFECT_HOME={home}: {why}. Prefect keeps its database and the task result records there: "
                         "set PREFECT_HOME to a writable folder (or fix its permissions)")
    raise InputError(f"Prefect's home {home} (PREFECT_HOME is unset: ~/.prefect, HOME={os.environ.get('HOME', '?')}): "
                     f"{why}. Prefect keeps its database and the task result records there: export PREFECT_HOME="
                     "<a writable folder> (or fix the permissions)")


def preflight() -> str | None:
    """Before any work: the API URL (if any) answers, Prefect's home is writable. Returns the API URL or None.

    The environment is checked first, before Prefect is imported (a dead or hanging server costs seconds, not
    Prefect's retries); then Prefect's settings, which may also come from a profile, ``.env`` or ``prefect.toml``."""
    env_url, env_home = _env("PREFECT_API_URL"), _env("PREFECT_HOME")
    patience_s()  # a malformed BERTPIPE_PREFECT_PATIENCE_S: one line before any work
    if env_url:
        check_api(env_url, api_key=_env("PREFECT_API_KEY"), auth_string=_env("PREFECT_API_AUTH_STRING"))
    check_home(Path(env_home).expanduser() if env_home else Path.home() / ".prefect", from_env=bool(env_home))
    from prefect.settings import get_current_settings

    s = get_current_settings()
    url = s.api.url or None
    if url and url != env_url:
        key = s.api.key.get_secret_value() if s.api.key else None
        auth = s.api.auth_string.get_secret_value() if s.api.auth_string else None
        check_api(url, api_key=key, auth_string=auth)
    home = Path(s.home).expanduser()
    if not env_home or home != Path(env_home).expanduser():
        check_home(home, from_env=bool(env_home))
    storage = Path(s.results.local_storage_path).expanduser()
    if not storage.is_relative_to(home) and (why := home_problem(storage)):
        raise InputError(f"PREFECT_LOCAL_STORAGE_PATH={storage}: {why}; Prefect keeps the task result records there: "
                         "point it at a writable folder")
    return url


# -- the temporary server ----------------------------------------------------------------------------------
def startup_timeout_default() -> None:
    """Give the temporary server :data:`STARTUP_TIMEOUT_S` to start unless the user chose (before Prefect loads
    its settings)."""
    os.environ.setdefault(STARTUP_ENV, str(STARTUP_TIMEOUT_S))


@contextlib.contextmanager
def _home_lock(home: Path, wait_s: float) -> Iterator[None]:
    """One temporary-server start-up at a time per Prefect home (flock; given up after ``wait_s``)."""
    import fcntl

    try:
        home.mkdir(parents=True, exist_ok=True)
        f = open(home / ".bertpipe-server-start.lock", "a+")  # noqa: SIM115 - closed below
    except OSError:  # checked by preflight; a race: start unserialized, as Prefect would
        yield
        return
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.2)
        yield
    finally:
        f.close()  # releases the lock


def start_temporary_server() -> tuple[str, Callable[[], bool]]:
    """Start Prefect's temporary server now (the flow then uses it: one per process), serialized per
    PREFECT_HOME; returns its API URL and whether its process still runs. A start-up that fails is one line
    (InputError) naming the setting to raise."""
    from prefect.server.api.server import SubprocessASGIServer
    from prefect.settings import get_current_settings

    s = get_current_settings()
    timeout = s.server.ephemeral.startup_timeout_seconds
    # The server process's own log: only what stops it. On a loaded machine its shutdown cancels the task-run
    # recorder mid-flush and it printed ~100 lines of tracebacks after a run that had succeeded; a server that
    # fails while a run needs it is reported by the run's watch (ServerWatch) in one line. Unless the user chose.
    os.environ.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "CRITICAL")
    server = SubprocessASGIServer()
    try:
        with _home_lock(Path(s.home).expanduser(), wait_s=timeout + 30):
            server.start()
    except RuntimeError as exc:
        if "Timed out" not in str(exc) and "ephemeral" not in str(exc):
            raise
        code = server.server_process.poll() if server.server_process else None
        server.stop()
        exited = f" (it exited with code {code})" if code is not None else ""
        raise InputError(f"Prefect's temporary server did not start within {STARTUP_ENV}={timeout} s{exited}: the "
                         f"machine is busy, or PREFECT_HOME={s.home} is slow. Raise {STARTUP_ENV} (e.g. to "
                         f"{max(2 * timeout, STARTUP_TIMEOUT_S)}), or start a server (`prefect server start`) and "
                         "set PREFECT_API_URL") from None
    def alive() -> bool:
        proc = server.server_process
        return proc is not None and proc.poll() is None

    return server.api_url, alive


# -- watching the server during the run --------------------------------------------------------------------
#: Prefect's own reports of an API it cannot reach (its event and log senders, a state it could not set): while a
#: server is watched they leave the console, and the watch checks at once; the watch's one line says it all.
_TROUBLE = re.compile(r"Unable to connect to|failed to process item|All connection attempts failed|Connect call "
                      r"failed|Connection refused|ConnectError|ReadTimeout|ConnectTimeout|RemoteProtocolError|"
                      r"Server disconnected|Error logging to API")


class ServerWatch(threading.Thread):
    """Asks ``url``/health every :data:`WATCH_EVERY_S`; when no check has answered for :data:`GONE_AFTER_S`
    (and :data:`GONE_AFTER_N` failed in a row), stops the command with one line (:func:`bertpipe.cli.abort`).

    ``alive`` (the temporary server: its process is ours) says whether the server still runs: a live but slow
    server (a busy machine) is waited for; a dead one is reported at the first failed check."""

    def __init__(self, url: str, *, temporary: bool = False, alive: Callable[[], bool] | None = None,
                 every_s: float = WATCH_EVERY_S, timeout_s: float | None = None,
                 gone_after_s: float | None = None, gone_after_n: int = GONE_AFTER_N) -> None:
        super().__init__(name="bertpipe-prefect-watch", daemon=True)
        self.url, self.temporary, self.alive = url, temporary, alive
        self.every_s, self.timeout_s = every_s, WATCH_TIMEOUT_S if timeout_s is None else timeout_s
        gone_after_s = patience_s() if gone_after_s is None else gone_after_s
        self.gone_after_s, self.gone_after_n = gone_after_s, gone_after_n
        self.failing = threading.Event()  # the last check failed
        self._wake, self._stopped = threading.Event(), threading.Event()
        self.key, self.auth = _env("PREFECT_API_KEY"), _env("PREFECT_API_AUTH_STRING")

    def stop(self) -> None:
        self._stopped.set()
        self._wake.set()

    def poke(self) -> None:
        """Check now (something reported trouble with the API)."""
        self._wake.set()

    def message(self, why: str) -> str:
        what = "Prefect's temporary server" if self.temporary else "the Prefect server"
        todo = "re-run" if self.temporary else "restart it and re-run"
        return f"{what} at {self.url} stopped answering ({why}): the run was stopped; {todo}: finished shards are kept"

    def check(self) -> str:
        """"" if the server answers now, else why not."""
        why = health(self.url, self.timeout_s, api_key=self.key, auth_string=self.auth)
        if why and self.alive is not None and self.alive():
            return ""  # our own server, running but slow: not gone
        if why and self.alive is not None:
            why = "its process ended"
        return why

    def run(self) -> None:
        last_ok, fails = time.monotonic(), 0
        while True:
            self._wake.wait(self.every_s)
            self._wake.clear()
            if self._stopped.is_set():
                return
            why = self.check()
            if self._stopped.is_set():
                return
            if not why:
                last_ok, fails = time.monotonic(), 0
                self.failing.clear()
                continue
            fails += 1
            self.failing.set()
            dead = self.alive is not None  # our own server's process is gone: no reason to wait
            if dead or (fails >= self.gone_after_n and time.monotonic() - last_ok >= self.gone_after_s):
                from bertpipe.cli import abort

                abort(self.message(why))
                return


class _QuietApiTrouble(logging.Filter):
    """Console only: Prefect's reports of an API it cannot reach are dropped while the server is watched (and
    wake the watch); after the watch stopped the run, every Prefect record is (the CLI prints the one line)."""

    def __init__(self, watch: ServerWatch) -> None:
        super().__init__()
        self.watch = watch

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.WARNING:
            return True
        if not (record.name.startswith("prefect") or record.name in _PREFECT_SERVICES):
            return True  # our libraries' own records (a download's connection error among them) always show
        from bertpipe.cli import ABORTED

        if ABORTED:
            return False
        message = record.getMessage()
        if message.startswith(_LIBRARIES):  # a library record relayed by a task's logger
            return True
        exc = record.exc_info[1] if record.exc_info else None
        transport = exc is not None and type(exc).__module__.split(".")[0] in ("httpx", "httpcore", "websockets")
        if transport or _TROUBLE.search(message[:2000]):
            self.watch.poke()
            return False
        return True


#: Prefect's background services log under their class names
_PREFECT_SERVICES = ("EventsWorker", "APILogWorker", "QueueService")
_LIBRARIES = ("preprocessing.", "pretrain.", "tasks.", "flows.", "core.")


def _console_handlers() -> list[logging.Handler]:
    loggers = [logging.getLogger(), *(logging.getLogger(n) for n in list(logging.root.manager.loggerDict))]
    out = []
    for lg in loggers:
        for h in getattr(lg, "handlers", ()):
            if isinstance(h, logging.StreamHandler) and not isinstance(h, logging.FileHandler) and h not in out:
                out.append(h)
    return out


@contextlib.contextmanager
def watched(url: str | None, *, temporary: bool = False, alive: Callable[[], bool] | None = None,
            verbose: bool = False) -> Iterator[ServerWatch | None]:
    """Watch the server at ``url`` (nothing when None) for the length of the block. An error that leaves the
    block while the server does not answer is that server's one line (InputError), not Prefect's traceback.
    Unless ``verbose``, Prefect's own reports of the unreachable API stay off the console."""
    if not url:
        yield None
        return
    from core.errors import BertpipeError

    watch = ServerWatch(url, temporary=temporary, alive=alive)
    quiet = _QuietApiTrouble(watch)
    handlers = [] if verbose else _console_handlers()
    for h in handlers:
        h.addFilter(quiet)
    raise_exceptions = logging.raiseExceptions
    if not verbose:  # Prefect's log sender writes "--- Error logging to API ---" to stderr unless this is off
        logging.raiseExceptions = False
    watch.start()
    try:
        yield watch
    except Exception as exc:
        if isinstance(exc, BertpipeError):
            raise
        why = watch.check()
        if why.startswith("no answer within"):  # it takes connections: the error is the error, with what was seen
            logging.getLogger("bertpipe").warning(
                "the Prefect server at %s did not answer its health check (%s) when the run failed: it is "
                "stalled or overloaded, and the error below may come from that (%s sets how long a silent "
                "server is waited for)", url, why, PATIENCE_ENV)
        elif why:
            raise InputError(watch.message(why)) from None
        raise
    finally:
        watch.stop()
        from bertpipe.cli import ABORTED

        if not ABORTED:  # after an abort Prefect's senders still fail until the exit: stay quiet
            for h in handlers:
                h.removeFilter(quiet)
            logging.raiseExceptions = raise_exceptions


# -- runs that ended without their server ------------------------------------------------------------------
def record_run(folder: str | os.PathLike) -> str:
    """A new run id for the flow runs of this command, recorded in the locked ``folder``; returns its tag."""
    from core.manifest import atomic_write_text

    run_id = uuid.uuid4().hex
    atomic_write_text(Path(folder) / RECORD_NAME, json.dumps(
        {"run": run_id, "host": socket.gethostname(), "pid": os.getpid(),
         "started": time.strftime("%Y-%m-%dT%H:%M:%S")}) + "\n")
    return TAG_PREFIX + run_id


def recorded_tag(folder: str | os.PathLike) -> str | None:
    """The tag of the run recorded in ``folder`` (an earlier command's), or None. Only a plain file of bertpipe's
    form counts: a link (to a file outside the folder) is not followed, anything else is ignored."""
    try:
        fd = os.open(Path(folder) / RECORD_NAME, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | os.O_NONBLOCK)
    except OSError:
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            run_id = json.loads(f.read(4096).decode("utf-8")).get("run")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(run_id, str) or not run_id.isalnum() or len(run_id) > 64:
        return None
    return TAG_PREFIX + run_id


def _all_pages(read: Callable[[int], list]) -> list:
    """Every item of a paged API read (``read(offset)``; the server returns at most its default limit a call)."""
    out: list = []
    while True:
        page = read(len(out))
        out += page
        if not page or len(out) >= 100_000:
            return out


def crash_orphans(folder: str | os.PathLike) -> int:
    """The flow and task runs of the run recorded in ``folder`` that the server still shows as not finished are
    set Crashed (call while holding ``folder``'s lock: that run is over). Returns how many runs were marked."""
    tag = recorded_tag(folder)
    if tag is None:
        return 0
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import (
        FlowRunFilter,
        FlowRunFilterState,
        FlowRunFilterStateType,
        FlowRunFilterTags,
        TaskRunFilter,
        TaskRunFilterState,
        TaskRunFilterStateType,
        TaskRunFilterTags,
    )
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    open_states = [StateType.RUNNING, StateType.PENDING, StateType.SCHEDULED, StateType.PAUSED,
                   StateType.CANCELLING]
    message = "the bertpipe command running it ended without reporting (its Prefect server was gone, or it was killed)"
    marked = 0
    with get_client(sync_client=True) as client:
        flows = client.read_flow_runs(flow_run_filter=FlowRunFilter(
            tags=FlowRunFilterTags(all_=[tag]), state=FlowRunFilterState(type=FlowRunFilterStateType(any_=open_states))))
        tasks = _all_pages(lambda offset: client.read_task_runs(task_run_filter=TaskRunFilter(
            tags=TaskRunFilterTags(all_=[tag]), state=TaskRunFilterState(type=TaskRunFilterStateType(any_=open_states))),
            offset=offset))
        # a task run the server learnt of from its creation event only (the server died before its first state
        # event was recorded) has no state at all: unfinished too
        tasks += [t for t in _all_pages(lambda offset: client.read_task_runs(
            task_run_filter=TaskRunFilter(tags=TaskRunFilterTags(all_=[tag])), offset=offset)) if t.state is None]
        for t in tasks:
            client.set_task_run_state(t.id, Crashed(message=message), force=True)
            marked += 1
        for fr in flows:
            client.set_flow_run_state(fr.id, Crashed(message=message), force=True)
            marked += 1
    return marked
