"""A real Prefect server on 127.0.0.1 (temporary PREFECT_HOME): work pool, deploy from
deployments/prefect.yaml, a process worker, `prefect deployment run … --param stages=…` on the built-in
sample; outputs checked; worker and server stopped by pid."""

from __future__ import annotations

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

from core.manifest import verify_manifest

ROOT = Path(__file__).resolve().parents[2]
PREFECT = str(Path(sys.executable).parent / "prefect")
STAGES = ["download", "extract", "text", "vocab", "tfrecord", "hdf5", "bins"]  # the training branch only


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(url: str, proc: subprocess.Popen, timeout: float = 180) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"prefect server exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        time.sleep(1)
    raise TimeoutError(f"prefect server at {url} not healthy after {timeout} s")


def _stop(proc: subprocess.Popen) -> None:
    """SIGTERM the process group led by ``proc.pid`` (the server's / worker's children too), then SIGKILL."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_deploy_and_run_the_data_deployment(tmp_path: Path) -> None:
    pytest.importorskip("prefect")
    port = _port()
    api = f"http://127.0.0.1:{port}/api"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "home"), "PREFECT_API_URL": api,
           "PREFECT_SERVER_ANALYTICS_ENABLED": "false", "BERTPIPE_PROJECT_DIR": str(ROOT),
           "PREFECT_SERVER_API_HOST": "127.0.0.1", "PREFECT_CLI_PROMPT": "false"}
    env.pop("PREFECT_LOGGING_LEVEL", None)
    logs = tmp_path / "logs"
    logs.mkdir()
    server = worker = None
    try:
        server = subprocess.Popen([PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(port)], env=env,
                                  stdout=open(logs / "server.log", "wb"), stderr=subprocess.STDOUT,
                                  start_new_session=True)
        _wait_healthy(api, server)

        def cli(*args: str, timeout: float = 300) -> str:
            r = subprocess.run([PREFECT, *args], env=env, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
            assert r.returncode == 0, f"prefect {' '.join(args)}: {r.stdout[-3000:]}\n{r.stderr[-3000:]}"
            return r.stdout

        cli("work-pool", "create", "bertpipe-process", "--type", "process")
        cli("--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml", "--all")
        worker = subprocess.Popen([PREFECT, "worker", "start", "--pool", "bertpipe-process", "--limit", "1"],
                                  env=env, cwd=tmp_path, stdout=open(logs / "worker.log", "wb"),
                                  stderr=subprocess.STDOUT, start_new_session=True)
        work = tmp_path / "work"
        out = cli("deployment", "run", "bertpipe-data/data", "--param", f"stages={json.dumps(STAGES)}",
                  "--param", f"work_dir={work}", "--param", "workers=1", "--watch", "--watch-timeout", "400",
                  timeout=420)
        assert "Completed" in out, out
    finally:
        for p in (worker, server):
            if p is not None:
                _stop(p)
    summary = json.loads((work / "last_run.json").read_text())
    assert sorted(summary["stages"]) == sorted(STAGES)
    bins = Path(summary["outputs"]["train_dir"])
    m = verify_manifest(bins.parent)  # the manifest sits beside data/, outside what trainers read
    assert sorted(p.name for p in bins.iterdir()) == ["128", "256", "384", "512"]
    assert m.counters["rows"] > 0 and len(m.files) == 4 * 8  # the sample's 8 shards per bin
    assert not (work / "eval_tfrecord").exists()  # left out by the stages parameter
    assert server.poll() is not None and worker.poll() is not None
