"""The weekly refresh really fires, once enabled: deployments/prefect.yaml deployed (--all) as shipped to a real
`prefect server` with its scheduler creates no refresh run (its schedule ships paused: deploying arms nothing);
enabled as docs/deployments.md says (the schedule's datasets_dir and `active: true`, then `prefect deploy --name refresh`),
the scheduler creates the refresh's scheduled runs with no error in the server log (with SQLAlchemy 2.1 it logged
"Can't evaluate bulk DML statement" every loop and created none), and a real process worker runs one of those
runs to completion: the run taken from the schedule is pointed at a small local file:// dump with an md5sums file
and made due now."""

from __future__ import annotations

import bz2
import datetime as dt
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from preprocessing.sample import sample_dump_path

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Api:
    def __init__(self, url: str) -> None:
        self.url = url

    def call(self, method: str, path: str, body: dict | None = None) -> object:
        req = urllib.request.Request(self.url + path, method=method, data=None if body is None else
                                     json.dumps(body).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=30) as r:
            data = r.read()
        return json.loads(data) if data else None

    def healthy(self) -> bool:
        try:
            return self.call("GET", "/health") is True
        except OSError:
            return False

    def scheduled_runs(self, deployment_id: str) -> list[dict]:
        return self.call("POST", "/flow_runs/filter", {"flow_runs": {
            "deployment_id": {"any_": [deployment_id]}, "state": {"type": {"any_": ["SCHEDULED"]}}},
            "sort": "EXPECTED_START_TIME_ASC"})

    def run(self, run_id: str) -> dict:
        return self.call("GET", f"/flow_runs/{run_id}")


def _wait(what: str, check, timeout: float, every: float = 2.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(every)
    raise TimeoutError(f"{what} after {timeout:.0f} s")


def _publish(mirror: Path) -> str:
    """A recompressed copy of the sample dump with its md5 in an md5sums file, as dump mirrors publish it."""
    data = bz2.compress(bz2.decompress(sample_dump_path().read_bytes()), compresslevel=3)
    (mirror / "dump.xml.bz2").write_bytes(data)
    md5 = hashlib.md5(data).hexdigest()
    (mirror / "md5sums").write_text(f"{md5}  dump.xml.bz2\n")
    return md5


def test_the_scheduler_creates_refresh_runs_and_a_worker_runs_one(tmp_path: Path) -> None:
    port = _port()
    api = Api(f"http://127.0.0.1:{port}/api")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PREFECT_")}
    env.update(PREFECT_HOME=str(tmp_path / "home"), PREFECT_API_URL=api.url, PREFECT_SERVER_ANALYTICS_ENABLED="false",
               PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS="3", BERTPIPE_PROJECT_DIR=str(ROOT),
               PREFECT_CLI_PROMPT="false")
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    md5 = _publish(mirror)
    server_log, worker_log = tmp_path / "server.log", tmp_path / "worker.log"
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port",
                                       str(port)], env=env, stdout=open(server_log, "wb"), stderr=subprocess.STDOUT,
                                      start_new_session=True))
        _wait("server healthy", api.healthy, 180, 1)
        for args in (["work-pool", "create", "bertpipe-process", "--type", "process"],
                     ["--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml", "--all"]):
            r = subprocess.run([str(BIN / "prefect"), *args], env=env, cwd=ROOT, capture_output=True, text=True,
                               timeout=300)
            assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        dep = api.call("GET", "/deployments/name/bertpipe-refresh/refresh")
        assert dep["schedules"] and dep["schedules"][0]["schedule"]["cron"] == "0 3 * * 1"
        assert not dep["schedules"][0]["active"]
        time.sleep(10)  # a few scheduler loops (3 s each): a paused schedule makes no run
        assert not api.scheduled_runs(dep["id"])

        # enabled as docs/deployments.md says: the schedule's datasets_dir and active: true, then deploy the refresh again
        shipped = (ROOT / "deployments" / "prefect.yaml").read_text()
        paused = "        active: false   # enable: see docs/deployments.md (Refresh)\n"
        assert paused in shipped
        enabled = shipped.replace(paused, "        active: true\n        parameters: {datasets_dir: "
                                  f"{tmp_path / 'scheduled-datasets'}}}\n")
        (tmp_path / "prefect.yaml").write_text(enabled)
        r = subprocess.run([str(BIN / "prefect"), "--no-prompt", "deploy", "--prefect-file", str(tmp_path / "prefect.yaml"),
                            "--name", "refresh"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
        dep = api.call("GET", "/deployments/name/bertpipe-refresh/refresh")
        assert dep["schedules"][0]["active"]
        runs = _wait("scheduled refresh runs", lambda: api.scheduled_runs(dep["id"]), 120)
        assert runs[0]["parameters"]["datasets_dir"] == str(tmp_path / "scheduled-datasets")
        first = dt.datetime.fromisoformat(runs[0]["expected_start_time"])
        assert first.weekday() == 0 and first.hour == 3  # Mondays 03:00 UTC
        time.sleep(8)  # a few more scheduler loops: any failure would be logged by now
        text = server_log.read_text(errors="replace")
        assert "Can't evaluate bulk DML" not in text and "Traceback" not in text, text[-3000:]

        # One of the runs the scheduler made, on a small local dump, due now.
        run = runs[0]
        params = {"source": (mirror / "dump.xml.bz2").as_uri(), "datasets_dir": str(tmp_path / "datasets"),
                  "data": {"workers": 1, "dupe_factor": 1,
                           "n_output_shards": 2, "vocab_size": 2000, "current_time": "2026-01-01T00:00:00"}}
        api.call("PATCH", f"/flow_runs/{run['id']}", {"parameters": params})
        now = dt.datetime.now(dt.timezone.utc).isoformat()
        api.call("POST", f"/flow_runs/{run['id']}/set_state",
                 {"state": {"type": "SCHEDULED", "name": "Scheduled", "state_details": {"scheduled_time": now}},
                  "force": True})
        procs.append(subprocess.Popen([str(BIN / "prefect"), "worker", "start", "--pool", "bertpipe-process"],
                                      env=env, cwd=tmp_path, stdout=open(worker_log, "wb"), stderr=subprocess.STDOUT,
                                      start_new_session=True))
        final = _wait("the scheduled run to finish",
                      lambda: (s := api.run(run["id"])["state"])["type"] in ("COMPLETED", "FAILED", "CRASHED") and s,
                      900, 3)
        assert final["type"] == "COMPLETED", (final, worker_log.read_text(errors="replace")[-4000:])
    finally:
        for p in reversed(procs):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
    latest = tmp_path / "datasets" / "latest"
    info = json.loads((latest / "SOURCE.json").read_text())
    assert info["md5"] == md5 and {"train_dir", "eval_hdf5", "vocab"} <= set(info["outputs"])
    assert "Can't evaluate bulk DML" not in server_log.read_text(errors="replace")
