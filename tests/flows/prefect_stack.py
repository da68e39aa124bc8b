"""A real Prefect stack for the deployment tests: `prefect server start` (own PREFECT_HOME, free port), the
`bertpipe-process` work pool, `prefect deploy --all` of deployments/prefect.yaml and a `prefect worker` (process
pool), each in its own session; the REST API through urllib; the flow run's own process found by its id.

    with PrefectStack(tmp_path) as stack:
        run = stack.run("bertpipe-data/data", {"work_dir": str(w)})
        final = stack.wait(run["id"])
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PREFECT = str(BIN / "prefect")
FINAL = ("COMPLETED", "FAILED", "CRASHED", "CANCELLED")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, check, timeout: float, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{what}: not after {timeout:.0f} s")
        time.sleep(every)


def proc_alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def descendants(pid: int) -> set[int]:
    kids: dict[int, list[int]] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            kids.setdefault(ppid, []).append(int(d.name))
    seen, todo = set(), [pid]
    while todo:
        for c in kids.get(todo.pop(), []):
            if c not in seen:
                seen.add(c)
                todo.append(c)
    return seen


def with_env(pid: int, name: str, value: str) -> bool:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return f"{name}={value}".encode() in env


class PrefectStack:
    """Server, pool, deployments and worker; stopped (each process group) on exit."""

    def __init__(self, tmp: Path, *, worker: bool = True, deploy: bool = True, project_dir: Path = ROOT,
                 extra_env: dict[str, str] | None = None) -> None:
        self.tmp, self.port = Path(tmp), free_port()
        self.url = f"http://127.0.0.1:{self.port}/api"
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("PREFECT_", "BERTPIPE_RUN_TOKEN", "BERTPIPE_TEST_SLOW", "BERTPIPE_FAULT"))}
        self.env.update(PREFECT_HOME=str(self.tmp / "prefect-home"), PREFECT_API_URL=self.url,
                        PREFECT_SERVER_ANALYTICS_ENABLED="false", PREFECT_CLI_PROMPT="false",
                        BERTPIPE_PROJECT_DIR=str(project_dir), DS_ACCELERATOR="cpu", **(extra_env or {}))
        self.project_dir = project_dir
        self.want_worker, self.want_deploy = worker, deploy
        self.procs: dict[str, subprocess.Popen] = {}
        self.logs = self.tmp / "stack-logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.timings: dict[str, float] = {}

    # -- processes -----------------------------------------------------------------------------------
    def _start(self, name: str, args: list[str], cwd: Path | None = None) -> subprocess.Popen:
        out = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        p = subprocess.Popen(args, env=self.env, cwd=cwd or self.tmp, stdout=out, stderr=subprocess.STDOUT,
                             start_new_session=True)
        self.procs[name] = p
        return p

    def cli(self, *args: str, timeout: float = 300, check: bool = True, env: dict[str, str] | None = None
            ) -> subprocess.CompletedProcess:
        r = subprocess.run([PREFECT, *args], env=env or self.env, cwd=self.project_dir, capture_output=True,
                           text=True, timeout=timeout)
        if check:
            assert r.returncode == 0, f"prefect {' '.join(args)}: {r.stdout[-3000:]}\n{r.stderr[-3000:]}"
        return r

    def __enter__(self) -> PrefectStack:
        t0 = time.monotonic()
        server = self._start("server", [PREFECT, "server", "start", "--host", "127.0.0.1", "--port", str(self.port)])
        try:
            wait_for("prefect server healthy", lambda: server.poll() is not None or self.healthy(), 300)
            assert server.poll() is None, self.log("server")[-3000:]
            self.timings["server"] = time.monotonic() - t0
            self.cli("work-pool", "create", "bertpipe-process", "--type", "process")
            if self.want_deploy:
                t = time.monotonic()
                self.cli("--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml", "--all")
                self.timings["deploy"] = time.monotonic() - t
            if self.want_worker:
                self.start_worker()
        except BaseException:
            self.close()
            raise
        return self

    def start_worker(self) -> subprocess.Popen:
        return self._start("worker", [PREFECT, "worker", "start", "--pool", "bertpipe-process"])

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        for name in ("worker", "server"):
            p = self.procs.pop(name, None)
            if p is None or p.poll() is not None:
                continue
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            except ProcessLookupError:
                pass

    def log(self, name: str) -> str:
        return (self.logs / f"{name}.log").read_text(errors="replace")

    # -- the API -------------------------------------------------------------------------------------
    def call(self, method: str, path: str, body: Any = None, tries: int = 6) -> Any:
        """One API call; a busy server's 503 (or a timeout) is retried a few times, as Prefect's client does."""
        for attempt in range(tries):
            req = urllib.request.Request(self.url + path, method=method,
                                         data=None if body is None else json.dumps(body).encode(),
                                         headers={"Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=60) as r:
                    data = r.read()
                return json.loads(data) if data else None
            except urllib.error.HTTPError as exc:
                if exc.code not in (502, 503, 504) or attempt == tries - 1:
                    raise
            except (TimeoutError, urllib.error.URLError):
                if attempt == tries - 1:
                    raise
            time.sleep(2 * (attempt + 1))
        raise AssertionError("unreachable")

    def healthy(self) -> bool:
        try:
            return self.call("GET", "/health") is True
        except (OSError, ValueError):
            return False

    def deployment(self, name: str) -> dict:
        return self.call("GET", f"/deployments/name/{name}")

    def run(self, deployment: str, parameters: dict[str, Any] | None = None) -> dict:
        """Create a flow run of ``deployment`` (``flow/deployment``) with these parameters; the worker picks it up."""
        dep = self.deployment(deployment)
        return self.call("POST", f"/deployments/{dep['id']}/create_flow_run", {"parameters": parameters or {}})

    def flow_run(self, run_id: str) -> dict:
        return self.call("GET", f"/flow_runs/{run_id}")

    def state(self, run_id: str) -> dict:
        return self.flow_run(run_id)["state"]

    def wait(self, run_id: str, timeout: float = 900, states: tuple[str, ...] = FINAL) -> dict:
        """The run's state once its type is one of ``states``."""
        return wait_for(f"flow run {run_id} in {states}",
                        lambda: (s := self.state(run_id))["type"] in states and s, timeout, 1.0)

    def logs_of(self, run_id: str) -> list[dict]:
        out, offset = [], 0
        while True:
            page = self.call("POST", "/logs/filter", {"logs": {"flow_run_id": {"any_": [run_id]}},
                                                      "sort": "TIMESTAMP_ASC", "limit": 200, "offset": offset})
            out += page
            if len(page) < 200:
                return out
            offset += 200

    def log_text(self, run_id: str) -> str:
        return "\n".join(f"{x['level']} {x['name']}: {x['message']}" for x in self.logs_of(run_id))

    def task_runs(self, run_id: str) -> list[dict]:
        return self.call("POST", "/task_runs/filter", {"flow_runs": {"id": {"any_": [run_id]}}, "limit": 200})

    def artifacts(self, run_id: str) -> list[dict]:
        return self.call("POST", "/artifacts/filter", {"artifacts": {"flow_run_id": {"any_": [run_id]}}})

    def run_pid(self, run_id: str, timeout: float = 300) -> int:
        """The pid of the process that executes flow run ``run_id`` (its command line names the id, or its
        environment does: PREFECT__FLOW_RUN_ID)."""
        def find() -> int | None:
            worker = self.procs.get("worker")
            pids = descendants(worker.pid) if worker else {int(d.name) for d in Path("/proc").iterdir()
                                                            if d.name.isdigit()}
            hits = [p for p in pids if run_id in cmdline(p) or with_env(p, "PREFECT__FLOW_RUN_ID", run_id)]
            # the outermost such process: the flow run's own (its pool workers carry the same environment)
            return min(hits, key=lambda p: len(_ancestors(p))) if hits else None
        return wait_for(f"the process of flow run {run_id}", find, timeout, 0.2)


def _ancestors(pid: int) -> list[int]:
    out = []
    while pid > 1:
        try:
            pid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            break
        out.append(pid)
    return out
