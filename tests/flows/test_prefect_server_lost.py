"""Issues 21.6 / 23.6 with real Prefect servers (slow): a standing `prefect server start` killed (or frozen) in the
middle of `bertpipe run` stops the run within 60 s with one line naming the server, exit 2, no manifest written
after the exit and no process of the run left; the next run (server restarted on the same PREFECT_HOME) marks the
old flow and task runs Crashed. Two runs sharing one PREFECT_HOME print no traceback. A temporary server that
cannot start in time is one line naming the setting to raise.

The run is kept busy with core.manifest's test hook BERTPIPE_TEST_SLOW (each bins shard sleeps at its start)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from bench.kill_campaign import descendants

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
BERTPIPE = str(Path(sys.executable).parent / "bertpipe")
PREFECT = str(Path(sys.executable).parent / "prefect")
SLOW_BINS = "bins:start:6"  # each of the 8 bins shards sleeps 6 s at its start (2 workers: ~24 s of bins)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PREFECT_API", "BERTPIPE_FAULT", "BERTPIPE_TEST_SLOW", "BERTPIPE_RUN_TOKEN",
                                 "BERTPIPE_PREFECT_PATIENCE"))}  # these servers are stopped: the default applies
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false", **extra)
    return env


def _healthy(url: str, timeout: float = 2) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=timeout) as r:
            return r.status == 200
    except OSError:
        return False


@contextmanager
def prefect_server(home: Path, log: Path) -> Iterator[tuple[str, subprocess.Popen]]:
    """`prefect server start` on 127.0.0.1 in its own process group; (API URL, process); killed at the end."""
    port = _port()
    url = f"http://127.0.0.1:{port}/api"
    with open(log, "ab") as out:
        proc = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)],
                                env=_env(home), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not _healthy(url):
            assert proc.poll() is None, log.read_text(errors="replace")[-2000:]
            assert time.monotonic() < deadline, "prefect server did not start in 240 s"
            time.sleep(1)
        yield url, proc
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGCONT)
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def _manifests(work: Path) -> dict[str, int]:
    return {str(p.relative_to(work)): p.stat().st_mtime_ns for p in work.rglob("_manifest.json")}


def _api(url: str, path: str, body: dict) -> list[dict]:
    req = urllib.request.Request(url + path, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.loads(r.read())


def _stop_server_mid_run(tmp_path: Path, how: str) -> tuple[str, Path, str]:
    """Start a server, start a run, stop the server (``kill``: SIGKILL of its group; ``freeze``: SIGSTOP, it then
    accepts connections and never answers) while the bins shards run. Checks the run's end; returns (the run's
    tag, the work dir, the PREFECT_HOME)."""
    home, work = tmp_path / "home", tmp_path / "work"
    with prefect_server(home, tmp_path / "server.log") as (url, server):
        out = open(tmp_path / "run.log", "wb")  # noqa: SIM115
        run = subprocess.Popen([BERTPIPE, "run", "--work-dir", str(work), "-q"], cwd=ROOT, stdout=out,
                               stderr=subprocess.STDOUT, env=_env(home, PREFECT_API_URL=url,
                                                                  BERTPIPE_TEST_SLOW=SLOW_BINS))
        deadline = time.monotonic() + 400
        while not any(work.glob("bins/*/")) and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        family = descendants(run.pid) | {run.pid}
        assert run.poll() is None, (tmp_path / "run.log").read_text()
        tag = "bertpipe-run:" + json.loads((work / ".bertpipe-prefect.json").read_text())["run"]
        os.killpg(server.pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
        t_stop = time.monotonic()
        rc = run.wait(timeout=120)
        seconds = time.monotonic() - t_stop
        at_exit = _manifests(work)
        out.close()
        text = (tmp_path / "run.log").read_text()
        lines = [x for x in text.splitlines() if x.strip()]
        print(f"{how}: the run ended {seconds:.1f} s after the server was stopped, rc {rc}; {len(lines)} line(s)")
        assert rc == 2, text
        assert seconds < 60, text
        assert "Traceback" not in text and "Finished in state" not in text, text
        assert lines[-1].startswith(f"bertpipe run: error: the Prefect server at {url} stopped answering ("), text
        assert lines[-1].endswith("restart it and re-run: finished shards are kept"), text
        assert [x for x in lines if "error" in x.lower()] == [lines[-1]], text
        time.sleep(5)  # pool workers poll for their parent every 0.5 s, the run token's watchdog every 0.3 s
        assert _manifests(work) == at_exit, "a manifest was written after the run had ended"
        assert not [p for p in family if _alive(p)], "processes of the run outlived it"
    return tag, work, str(home)


def _rerun_marks_crashed(tmp_path: Path, tag: str, work: Path) -> None:
    home = tmp_path / "home"
    with prefect_server(home, tmp_path / "server2.log") as (url, _server):
        before = _api(url, "/flow_runs/filter", {"flow_runs": {"tags": {"all_": [tag]}}})
        assert before and {r["state"]["type"] for r in before} == {"RUNNING"}, before
        r = subprocess.run([BERTPIPE, "run", "--work-dir", str(work), "-q"], cwd=ROOT, capture_output=True,
                           text=True, env=_env(home, PREFECT_API_URL=url), timeout=600)
        assert r.returncode == 0, r.stderr
        assert "Traceback" not in r.stderr
        flows = _api(url, "/flow_runs/filter", {"flow_runs": {"tags": {"all_": [tag]}}})
        tasks = _api(url, "/task_runs/filter", {"task_runs": {"tags": {"all_": [tag]}}})
        assert {f["id"] for f in flows} == {f["id"] for f in before}
        assert {f["state"]["type"] for f in flows} == {"CRASHED"}, flows
        # (a task run the server knew only from its creation event has no state: unfinished too)
        assert tasks and not [t for t in tasks if (t["state"] or {}).get("type", "PENDING") in
                              ("RUNNING", "PENDING", "SCHEDULED")], tasks
        new = json.loads((work / ".bertpipe-prefect.json").read_text())["run"]
        done = _api(url, "/flow_runs/filter", {"flow_runs": {"tags": {"all_": ["bertpipe-run:" + new]}}})
        assert [f["state"]["type"] for f in done] == ["COMPLETED"]
    assert (work / "last_run.json").is_file()


def test_server_killed_mid_run_then_the_next_run_marks_it_crashed(tmp_path: Path) -> None:
    tag, work, _ = _stop_server_mid_run(tmp_path, "kill")
    _rerun_marks_crashed(tmp_path, tag, work)


def test_server_frozen_mid_run(tmp_path: Path) -> None:
    """SIGSTOP: the server's socket still accepts connections, nothing answers (the 496 s case)."""
    _stop_server_mid_run(tmp_path, "freeze")


def test_two_runs_sharing_a_prefect_home_print_no_traceback(tmp_path: Path) -> None:
    """Two temporary servers starting on one fresh PREFECT_HOME migrated one SQLite database at once ("duplicate
    column name" tracebacks): their start-ups now take turns."""
    env = _env(tmp_path / "home")
    runs = [subprocess.Popen([BERTPIPE, "run", "--work-dir", str(tmp_path / f"w{i}"), "-q"], cwd=ROOT, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for i in (1, 2)]
    outs = [r.communicate(timeout=900)[0] for r in runs]
    for r, out in zip(runs, outs, strict=True):
        assert r.returncode == 0, out
        assert "Traceback" not in out and "ERROR" not in out, out
    for i in (1, 2):
        assert (tmp_path / f"w{i}" / "last_run.json").is_file()


def test_a_temporary_server_that_starts_too_slowly_is_one_line(tmp_path: Path) -> None:
    r = subprocess.run([BERTPIPE, "run", "--work-dir", str(tmp_path / "w"), "-q"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300,
                       env=_env(tmp_path / "home", PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="1"))
    lines = [x for x in (r.stderr + r.stdout).splitlines() if x.strip()]
    assert r.returncode == 2, lines
    assert "Traceback" not in r.stderr
    assert lines[-1].startswith("bertpipe run: error: Prefect's temporary server did not start within "
                                "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=1 s"), lines
    assert "Raise PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS" in lines[-1]
    assert not any(tmp_path.glob("w/*/_manifest.json"))
