"""Issue 23.6 / 21.6: a Prefect server that is not there, not Prefect, or hangs, and a Prefect home that cannot be
written, stop `bertpipe run` (data, e2e, pretrain) before any work: one line naming the URL or the folder and what
to do, exit 2, within 15 s, nothing created (the work dir, the Prefect home). The watch thread that stops a run
whose server stopped answering. (tests/flows/test_prefect_server_lost.py: real servers, slow.)

Generated: every server case and every home case x the three flow commands; the hanging server's 8 s wait runs for
`run` here and for e2e / pretrain under -m slow; a subprocess run measures the whole command's time."""

from __future__ import annotations

import http.server
import logging
import os
import socket
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bertpipe import prefect_server
from bertpipe.cli import main

ROOT = Path(__file__).resolve().parents[1]


# -- servers that are not a Prefect API ------------------------------------------------------------------
class _Handler(http.server.BaseHTTPRequestHandler):
    body: bytes | None = None  # None: 404 for everything

    def do_GET(self) -> None:  # noqa: N802
        if self.body is None or not self.path.endswith("/health"):
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args: object) -> None:
        pass


def _http_server(body: bytes | None) -> Iterator[str]:
    handler = type("H", (_Handler,), {"body": body})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{srv.server_address[1]}/api"
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.fixture(scope="module")
def not_found_url() -> Iterator[str]:
    """A plain web server: 404 for every path."""
    yield from _http_server(None)


@pytest.fixture(scope="module")
def not_prefect_url() -> Iterator[str]:
    """A web server whose /health answers 200, but not ``true``."""
    yield from _http_server(b"<html>hello</html>")


@pytest.fixture(scope="module")
def prefect_like_url() -> Iterator[str]:
    """/health answers 200 ``true``, as Prefect's API does."""
    yield from _http_server(b"true")


@pytest.fixture(scope="module")
def hanging_url() -> Iterator[str]:
    """A socket that accepts connections and never answers."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(64)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        s.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(s.accept()[0])
            except OSError:
                pass

    t = threading.Thread(target=accept, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{s.getsockname()[1]}/api"
    finally:
        stop.set()
        t.join()
        for c in held:
            c.close()
        s.close()


@pytest.fixture(scope="module")
def dead_url() -> str:
    """A port nothing listens on (bound once, then closed)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return f"http://127.0.0.1:{port}/api"


# -- the cases ------------------------------------------------------------------------------------------------
#: server case -> (fixture giving PREFECT_API_URL, what the line says besides the URL)
SERVERS = {
    "dead port": ("dead_url", "connection refused"),
    "404 server": ("not_found_url", "HTTP 404"),
    "200 but not Prefect": ("not_prefect_url", "not as a Prefect API does"),
    "hanging server": ("hanging_url", "no answer within 8 s"),
    "no scheme": (None, "not an http(s) URL"),
}


def _read_only(d: Path) -> Path:
    d.mkdir(parents=True, exist_ok=True)
    d.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP)
    return d


#: home case -> (environment given a sandbox, what the line names)
HOMES = {
    "read-only HOME": (lambda sb: {"HOME": str(_read_only(sb / "home")), "PREFECT_HOME": None},
                       "{sb}/home/.prefect"),
    "read-only PREFECT_HOME": (lambda sb: {"PREFECT_HOME": str(_read_only(sb / "ph"))}, "PREFECT_HOME={sb}/ph"),
    "PREFECT_HOME under a read-only folder": (lambda sb: {"PREFECT_HOME": str(_read_only(sb / "ro") / "ph")},
                                              "PREFECT_HOME={sb}/ro/ph"),
    "PREFECT_HOME is a file": (lambda sb: {"PREFECT_HOME": str(_file(sb / "ph"))}, "PREFECT_HOME={sb}/ph"),
}


def _file(p: Path) -> Path:
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("not a folder\n")
    return p


COMMANDS = {"run": [], "run e2e": ["e2e", "--max-steps", "1"], "run pretrain": ["pretrain"]}


def _argv(command: str, sb: Path) -> list[str]:
    argv = ["run", *COMMANDS[command], "--work-dir", str(sb / "work")]
    if command == "run pretrain":
        (sb / "bins").mkdir(exist_ok=True)
        (sb / "eval.hdf5").write_bytes(b"")
        argv += ["--train-dir", str(sb / "bins"), "--eval-file", str(sb / "eval.hdf5")]
    return argv


def _snapshot(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.lstat().st_mode for p in sorted(root.rglob("*"))}


def _in_process(argv: list[str], env: dict[str, str | None], monkeypatch: pytest.MonkeyPatch,
                capsys: pytest.CaptureFixture[str]) -> tuple[int, str, float]:
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    for k, v in env.items():
        if v is None:
            monkeypatch.delenv(k, raising=False)
        else:
            monkeypatch.setenv(k, v)
    capsys.readouterr()
    t = time.monotonic()
    rc = main([*argv, "-q"])
    return rc, capsys.readouterr().err, time.monotonic() - t


def _one_line(err: str, *needles: str) -> str:
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def _server_params() -> list:
    out = []
    for case in SERVERS:
        for command in COMMANDS:
            marks = [pytest.mark.slow] if case == "hanging server" and command != "run" else []
            out.append(pytest.param(case, command, marks=marks, id=f"{case}-{command}"))
    return out


@pytest.mark.parametrize(("case", "command"), _server_params())
def test_a_server_that_is_not_there_is_one_line(case: str, command: str, tmp_path: Path,
                                                request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    fixture, says = SERVERS[case]
    url = request.getfixturevalue(fixture) if fixture else "localhost:4200"
    home = tmp_path / "prefect-home"  # writable, not there yet: only the URL is wrong
    argv = _argv(command, tmp_path)
    before = _snapshot(tmp_path)
    rc, err, seconds = _in_process(argv, {"PREFECT_API_URL": url, "PREFECT_HOME": str(home)}, monkeypatch, capsys)
    assert rc == 2
    line = _one_line(err, f"bertpipe run: error: PREFECT_API_URL={url}", says, "unset it")
    assert "prefect server start" in line
    assert seconds < 15
    assert _snapshot(tmp_path) == before  # no work dir, no Prefect home
    assert not (tmp_path / "work").exists() and not home.exists()


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize("case", HOMES)
def test_an_unwritable_prefect_home_is_one_line(case: str, command: str, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    make_env, names = HOMES[case]
    env = make_env(tmp_path)
    argv = _argv(command, tmp_path)
    before = _snapshot(tmp_path)
    try:
        rc, err, seconds = _in_process(argv, env, monkeypatch, capsys)
        after = _snapshot(tmp_path)
    finally:
        for p in tmp_path.iterdir():
            if p.is_dir():
                p.chmod(0o755)
    assert rc == 2
    _one_line(err, "bertpipe run: error: ", names.format(sb=tmp_path), "writable")
    assert seconds < 15
    assert after == before  # no work dir, no Prefect home, nothing in them


def _subprocess_run(env_extra: dict[str, str], work: Path) -> tuple[int, str, float]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_API")}
    env.update(env_extra)
    t = time.monotonic()
    r = subprocess.run([str(Path(sys.executable).parent / "bertpipe"), "run", "--work-dir", str(work), "-q"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stderr + r.stdout, time.monotonic() - t


def test_the_command_line_fails_within_15_s(dead_url: str, tmp_path: Path) -> None:
    """The whole command, interpreter start included: a dead port is one line within 15 s, nothing created."""
    rc, out, seconds = _subprocess_run({"PREFECT_API_URL": dead_url, "PREFECT_HOME": str(tmp_path / "h")},
                                       tmp_path / "work")
    assert rc == 2
    _one_line(out, f"PREFECT_API_URL={dead_url}", "connection refused")
    assert seconds < 15, seconds
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_the_command_line_with_a_hanging_server_fails_within_15_s(hanging_url: str, tmp_path: Path) -> None:
    rc, out, seconds = _subprocess_run({"PREFECT_API_URL": hanging_url, "PREFECT_HOME": str(tmp_path / "h")},
                                       tmp_path / "work")
    assert rc == 2
    _one_line(out, f"PREFECT_API_URL={hanging_url}", "no answer within 8 s")
    assert seconds < 15, seconds
    assert list(tmp_path.iterdir()) == []


# -- the health check itself -----------------------------------------------------------------------------------
def test_health_accepts_only_a_prefect_answer(prefect_like_url: str, not_prefect_url: str, not_found_url: str,
                                              dead_url: str) -> None:
    assert prefect_server.health(prefect_like_url, 2) == ""
    assert prefect_server.health(prefect_like_url + "/", 2) == ""
    assert "not as a Prefect API does" in prefect_server.health(not_prefect_url, 2)
    assert "HTTP 404" in prefect_server.health(not_found_url, 2)
    assert "connection refused" in prefect_server.health(dead_url, 2)
    assert "not an http(s) URL" in prefect_server.health("ftp://127.0.0.1/api", 2)
    assert "not found" in prefect_server.health("http://no-such-host.invalid/api", 5)


def test_health_gives_up_on_a_hanging_server(hanging_url: str) -> None:
    t = time.monotonic()
    assert prefect_server.health(hanging_url, 0.5) == "no answer within 0.5 s"
    assert time.monotonic() - t < 3


def test_the_startup_timeout_default_leaves_a_user_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(prefect_server.STARTUP_ENV, raising=False)
    prefect_server.startup_timeout_default()
    assert os.environ[prefect_server.STARTUP_ENV] == str(prefect_server.STARTUP_TIMEOUT_S)
    monkeypatch.setenv(prefect_server.STARTUP_ENV, "7")
    prefect_server.startup_timeout_default()
    assert os.environ[prefect_server.STARTUP_ENV] == "7"


# -- the watch during a run -------------------------------------------------------------------------------------
@pytest.fixture
def aborts(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """bertpipe.cli.abort recorded instead of interrupting the test's main thread."""
    import bertpipe.cli

    seen: list[str] = []
    monkeypatch.setattr(bertpipe.cli, "abort", lambda message, grace_s=None: seen.append(message))
    return seen


def _watch(url: str, **kw) -> prefect_server.ServerWatch:
    w = prefect_server.ServerWatch(url, every_s=0.05, timeout_s=0.3, gone_after_s=0.6, gone_after_n=3, **kw)
    w.start()
    return w


def _wait(cond, seconds: float) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.02)
    return cond()


def test_the_watch_lets_a_healthy_server_be(prefect_like_url: str, aborts: list[str]) -> None:
    w = _watch(prefect_like_url)
    time.sleep(1.2)
    w.stop()
    w.join(2)
    assert not w.is_alive() and aborts == []


@pytest.mark.parametrize("fixture", ["dead_url", "hanging_url", "not_found_url"])
def test_the_watch_stops_the_run_when_the_server_stops_answering(fixture: str, request: pytest.FixtureRequest,
                                                                  aborts: list[str]) -> None:
    url = request.getfixturevalue(fixture)
    t = time.monotonic()
    w = _watch(url)
    assert _wait(lambda: aborts, 5)
    assert time.monotonic() - t >= 0.6  # not before gone_after_s without an answer
    w.join(2)
    assert len(aborts) == 1
    assert aborts[0].startswith(f"the Prefect server at {url} stopped answering (")
    assert "restart it and re-run: finished shards are kept" in aborts[0]


def test_the_patience_setting_delays_the_stop(hanging_url: str, aborts: list[str],
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """BERTPIPE_PREFECT_PATIENCE_S: how long a silent server is waited for (a server known to stall)."""
    monkeypatch.setenv(prefect_server.PATIENCE_ENV, "2.5")
    w = prefect_server.ServerWatch(hanging_url, every_s=0.05, timeout_s=0.3, gone_after_n=3)
    assert w.gone_after_s == 2.5
    t = time.monotonic()
    w.start()
    assert _wait(lambda: aborts, 8)
    assert time.monotonic() - t >= 2.5 and len(aborts) == 1
    w.join(2)
    monkeypatch.delenv(prefect_server.PATIENCE_ENV)
    assert prefect_server.ServerWatch(hanging_url).gone_after_s == prefect_server.GONE_AFTER_S


@pytest.mark.parametrize("raw", ["soon", "0", "-5", "nan", "inf"])
def test_a_malformed_patience_is_one_line_before_any_work(raw: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from core.errors import InputError

    monkeypatch.setenv(prefect_server.PATIENCE_ENV, raw)
    with pytest.raises(InputError, match=f"BERTPIPE_PREFECT_PATIENCE_S='{raw}': expected a positive number"):
        prefect_server.preflight()


def test_an_error_while_the_server_stalls_is_the_error_with_a_warning(hanging_url: str, aborts: list[str],
                                                                     monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    """A run that fails while its server takes connections but does not answer (stalled, maybe overloaded) shows
    its own error, with a warning saying what the health check saw: not "stopped answering", which may be false."""
    monkeypatch.setattr(prefect_server, "WATCH_TIMEOUT_S", 0.3)
    with caplog.at_level(logging.WARNING, logger="bertpipe"), pytest.raises(RuntimeError, match="boom"):
        with prefect_server.watched(hanging_url, verbose=True):
            raise RuntimeError("boom")
    assert aborts == []
    [rec] = [r for r in caplog.records if r.name == "bertpipe"]
    assert rec.getMessage().startswith(f"the Prefect server at {hanging_url} did not answer its health check "
                                       "(no answer within 0.3 s) when the run failed")


def test_the_watch_waits_for_a_slow_temporary_server_but_not_a_dead_one(hanging_url: str, dead_url: str,
                                                                        aborts: list[str]) -> None:
    running = _watch(hanging_url, temporary=True, alive=lambda: True)  # our own server, alive but slow
    time.sleep(1.5)
    running.stop()
    running.join(2)
    assert aborts == []
    t = time.monotonic()
    _watch(dead_url, temporary=True, alive=lambda: False).join(3)  # its process ended: at the first failed check
    assert aborts and time.monotonic() - t < 2
    assert aborts[0].startswith(f"Prefect's temporary server at {dead_url} stopped answering (its process ended)")


def test_an_error_while_the_server_is_gone_is_the_servers_line(dead_url: str, prefect_like_url: str,
                                                                aborts: list[str]) -> None:
    """A flow that fails because its server went away (before the watch decided) shows the server's line."""
    from core.errors import InputError

    with pytest.raises(InputError, match=f"the Prefect server at {dead_url} stopped answering"):
        with prefect_server.watched(dead_url, verbose=True):
            raise ConnectionError("All connection attempts failed")
    with pytest.raises(RuntimeError, match="boom"):  # the server answers: the error is the error
        with prefect_server.watched(prefect_like_url, verbose=True):
            raise RuntimeError("boom")


def test_prefects_reports_of_the_unreachable_api_leave_the_console(dead_url: str, aborts: list[str]) -> None:
    import logging

    w = prefect_server.ServerWatch(dead_url)
    f = prefect_server._QuietApiTrouble(w)

    def rec(name: str, msg: str, level: int = logging.WARNING) -> logging.LogRecord:
        return logging.LogRecord(name, level, __file__, 1, msg, None, None)

    assert not f.filter(rec("prefect.events.clients", "Unable to connect to 'ws://127.0.0.1:1/api/events/in'."))
    assert not f.filter(rec("prefect._internal.concurrency", "Service 'EventsWorker' failed to process item Event(",
                            logging.ERROR))
    assert w._wake.is_set()  # the watch checks at once
    assert f.filter(rec("prefect.task_runs", "preprocessing.text.download: Connection refused by the mirror; retrying"))
    assert f.filter(rec("preprocessing.text.download", "Connection refused"))
    assert f.filter(rec("prefect.flow_runs", "Finished in state Completed()", logging.INFO))
    assert f.filter(rec("prefect.task_runs", "a warning of the run"))


# -- the run record of a locked folder ----------------------------------------------------------------------
def test_the_run_record_is_read_only_from_a_plain_file_of_its_form(tmp_path: Path) -> None:
    work, outside = tmp_path / "work", tmp_path / "victim"
    work.mkdir()
    outside.mkdir()
    tag = prefect_server.record_run(work)
    assert tag.startswith(prefect_server.TAG_PREFIX) and prefect_server.recorded_tag(work) == tag
    assert tag != prefect_server.record_run(work)  # each command its own id
    record = work / prefect_server.RECORD_NAME
    (outside / "r.json").write_text('{"run": "abc"}')
    record.unlink()
    record.symlink_to(outside / "r.json")  # planted: a link out of the work dir is not followed
    assert prefect_server.recorded_tag(work) is None
    for text in ('{"run": "../x"}', '{"run": 5}', "[]", "not json", '{"run": "' + "a" * 65 + '"}'):
        record.unlink()
        record.write_text(text)
        assert prefect_server.recorded_tag(work) is None, text
    record.unlink()
    record.mkdir()
    assert prefect_server.recorded_tag(work) is None
    assert prefect_server.crash_orphans(work) == 0  # no record: no server asked
    record.rmdir()
    prefect_server.record_run(work)
    assert (outside / "r.json").read_text() == '{"run": "abc"}'
