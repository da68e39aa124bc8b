"""Issue 21 with real processes: a standing `prefect server`, `dask scheduler` and `dask worker` processes, and
`bertpipe run --dask-address` as a user runs it (a subprocess). Each case ends either with every manifest true
(each listed file on disk, of its size and md5) or in one line, fast, with nothing written afterwards:

* a worker that does not see the work dir (its own mount namespace, a tmpfs over the shared folder): the run
  refuses before any work naming it; one that loses the mount once the run has started fails the run in one
  line naming it, and writes nothing into its own copy of the path; a worker that cannot reach the Prefect API
  is named before any work;
* the dump route on workers under their nanny (daemonic processes): the bytes of a local run;
* every library log line of a call reaches the flow run's logs in the Prefect server, as in a local run;
* SIGTERM and kill -9 of the command: no manifest is written after it ends, nothing is left queued on Dask;
* the scheduler killed mid-run: one line naming it, within 60 s, exit non-zero, no traceback.

Slow (a server and a cluster per module; each test starts its own scheduler and workers). The SIGKILLed worker and
the frame-holding `client.call_stack()` loop: tests/flows/test_dask_cluster.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path

import pytest
from flowhelpers import output_md5s, split_docs

from core.manifest import MANIFEST_NAME, md5_file

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow
FLAGS = ["--dupe-factor", "2", "--n-output-shards", "4", "--num-examples-to-pick", "50"]
LIBRARY = re.compile(r"^(preprocessing|pretrain|tasks|core|flows|py\.warnings)(\.[\w.]+)?$")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url: str, body: dict | None = None):
    req = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"}, method="GET" if body is None else "POST")
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def wait_for(check, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise TimeoutError(f"{what}: not within {timeout:.0f} s")


def can_hide_a_folder() -> bool:
    """Whether a worker can be given its own view of the file system here (root, util-linux's unshare)."""
    if os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"):
        return False
    r = subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", "mount -t tmpfs none /mnt"],
                       capture_output=True)
    return r.returncode == 0


def true_manifests(work: Path) -> int:
    """Every manifest under ``work`` lists files that are on disk with its size and md5; how many manifests."""
    n = 0
    for mf in work.rglob(MANIFEST_NAME):
        m = json.loads(mf.read_text())
        if (mf.parent / "_dropped.json").exists():
            continue
        for f in m["files"]:
            p = mf.parent / f["name"]
            assert p.is_file(), f"{mf} lists {f['name']}, which is not there"
            assert p.stat().st_size == f["bytes"] and md5_file(p) == f["md5"], f"{mf}: {f['name']} differs"
        n += 1
    return n


class Cluster:
    """Processes of one test (a scheduler, workers), stopped by :meth:`close`; a standing Prefect server."""

    def __init__(self, tmp: Path, env: dict[str, str], api: str) -> None:
        self.tmp, self.env, self.api = tmp, env, api
        self.logs = tmp / "logs"
        self.logs.mkdir(exist_ok=True)
        self.procs: dict[str, subprocess.Popen] = {}
        self.address = ""

    def start(self, name: str, cmd: list[str], extra: dict | None = None, cwd: Path = ROOT) -> subprocess.Popen:
        p = subprocess.Popen(cmd, env={**self.env, **(extra or {})}, cwd=cwd, stdin=subprocess.DEVNULL,
                             stdout=open(self.logs / f"{name}.log", "ab"), stderr=subprocess.STDOUT,
                             start_new_session=True)
        self.procs[name] = p
        return p

    def scheduler(self) -> str:
        port = free_port()
        self.address = f"tcp://127.0.0.1:{port}"
        self.start("scheduler", [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", str(port),
                                 "--no-dashboard"])
        return self.address

    def worker(self, name: str, *, hide: Path | None = None, extra: dict | None = None, nanny: bool = True,
               nthreads: int = 1, preload: Path | None = None) -> subprocess.Popen:
        """A worker with its own HOME, TMPDIR and working directory; ``hide``: it runs in its own mount namespace
        where a tmpfs covers that folder (the shared mount missing on its machine)."""
        home = self.tmp / f"home-{name}"
        (home / "tmp").mkdir(parents=True, exist_ok=True)
        cmd = [str(BIN / "dask"), "worker", self.address, "--nworkers", "1", "--nthreads", str(nthreads),
               "--local-directory", str(home / "dask"), "--no-dashboard", *([] if nanny else ["--no-nanny"]),
               *(["--preload", str(preload)] if preload else [])]
        if hide is not None:
            cmd = ["unshare", "-m", "--propagation", "private", "sh", "-c",
                   f'mount -t tmpfs none "{hide}" && exec "$@"', "hide", *cmd]
        env = {"HOME": str(home), "TMPDIR": str(home / "tmp"), **(extra or {})}
        return self.start(name, cmd, env, cwd=home)

    def client(self):
        from distributed import Client

        return Client(self.address, timeout=30)

    def wait_workers(self, n: int) -> dict[str, dict]:
        with self.client() as c:
            c.wait_for_workers(n, timeout=180)
            return dict(c.scheduler_info(n_workers=-1)["workers"])

    def stop(self, name: str, sig: int = signal.SIGTERM) -> None:
        p = self.procs.pop(name, None)
        if p is not None and p.poll() is None:
            try:
                os.killpg(p.pid, sig)
                p.wait(timeout=30)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                with_kill = p.poll() is None
                if with_kill:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait(timeout=10)

    def close(self) -> None:
        for name in [n for n in self.procs if n != "scheduler"] + ["scheduler"]:
            self.stop(name)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    """A standing Prefect server (docs/caching-and-clusters.md's multi-machine recipe) and the environment of
    every process."""
    tmp = tmp_path_factory.mktemp("prefect")
    api = f"http://127.0.0.1:{free_port()}/api"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "BERTPIPE_FAULT", "DASK_"))}
    env.update(PREFECT_SERVER_ANALYTICS_ENABLED="false", PYTHONPATH=str(ROOT), BERTPIPE_PROGRESS="0",
               PREFECT_HOME=str(tmp / "home"), PREFECT_API_URL=api)
    p = subprocess.Popen([str(BIN / "prefect"), "server", "start", "--host", "127.0.0.1", "--port",
                          api.split(":")[2][:-4]], env=env, stdout=open(tmp / "server.log", "wb"),
                         stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: http(api + "/health") is True, 300, "prefect server")
        yield env, api
    finally:
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)


@pytest.fixture
def cluster(server, tmp_path: Path):
    env, api = server
    c = Cluster(tmp_path, env, api)
    c.scheduler()
    try:
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def text(golden: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """8 part files (golden part-00000 cut at documents) and a short eval.txt."""
    d = tmp_path_factory.mktemp("text")
    for i, part in enumerate(split_docs((golden / "text_chain" / "part-00000-of-00500").read_text(), 8)):
        (d / f"part-{i:05d}-of-00500").write_text(part)
    (d / "eval.txt").write_text(split_docs((golden / "text_chain" / "eval.txt").read_text(), 4)[0])
    return d


def bertpipe(env: dict, *args: object, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([str(BIN / "bertpipe"), "run", *map(str, args)], env=env, capture_output=True, text=True,
                          timeout=timeout)


def last_line(r: subprocess.CompletedProcess) -> str:
    return (r.stderr.strip().splitlines() or [""])[-1]


def flow_run_logs(api: str) -> list[dict]:
    """The logs of the most recent flow run in the server (task runs' included), oldest first."""
    fr = http(api + "/flow_runs/filter", {"sort": "START_TIME_DESC", "limit": 1})[0]
    out: list[dict] = []
    while True:
        page = http(api + "/logs/filter", {"logs": {"flow_run_id": {"any_": [fr["id"]]}}, "sort": "TIMESTAMP_ASC",
                                           "limit": 200, "offset": len(out)})
        out += page
        if len(page) < 200:
            return out


def library_lines(logs: list[dict]) -> list[tuple[str, int, str]]:
    """(logger, level, message) of our libraries' records in a flow run's logs: sent by the library logger itself
    (the flow's own process) or re-logged by the task as "<logger>: <message>" (pool and Dask workers)."""
    out = []
    for rec in logs:
        if LIBRARY.match(rec["name"]):
            out.append((rec["name"], rec["level"], rec["message"]))
        elif rec["name"].startswith("prefect") and (m := re.match(r"^([\w.]+): (.*)$", rec["message"], re.S)) \
                and LIBRARY.match(m[1]):
            out.append((m[1], rec["level"], m[2]))
    return out


@pytest.fixture(scope="module")
def local_text_run(server, text: Path, shared_data: Path, tmp_path_factory) -> tuple[dict, list]:
    """The 8 parts run locally (2 pool workers) against the standing server: output md5s, library log lines."""
    env, api = server
    w = tmp_path_factory.mktemp("local") / "w"
    r = bertpipe(env, "--text-dir", text, "--vocab", shared_data / "vocab.txt", *FLAGS, "--work-dir", w,
                 "--workers", "2")  # (no -q: INFO lines go to the server, as in the Dask run)
    assert r.returncode == 0, r.stderr[-3000:]
    return output_md5s(w), library_lines(flow_run_logs(api))


# -- the work dir not seen, the API not reached --------------------------------------------------------------
def test_workers_that_do_not_see_the_work_dir_or_reach_prefect_are_named_and_write_nothing(
        cluster: Cluster, text: Path, shared_data: Path, tmp_path: Path) -> None:
    if not can_hide_a_folder():
        pytest.skip("needs root and unshare/nsenter to give a worker its own mounts")
    shared = tmp_path / "shared"  # the shared file system: the work dir (and a copy of the inputs) live there
    shutil.copytree(text, shared / "text")
    shutil.copy(shared_data / "vocab.txt", shared / "vocab.txt")
    work = shared / "work"
    args = ["--text-dir", shared / "text", "--vocab", shared / "vocab.txt", *FLAGS, "--work-dir", work,
            "--dask-address", cluster.address, "--workers", "2"]
    cluster.worker("seeing")
    blind = cluster.worker("blind", hide=shared, nanny=False)
    workers = cluster.wait_workers(2)
    with cluster.client() as c:
        blind_addr = next(a for a, pid in c.run(os.getpid).items() if pid == blind.pid)

    # 1. a worker without the mount from the start: refused before any work, naming it
    t0 = time.monotonic()
    r = bertpipe(cluster.env, *args)
    took = time.monotonic() - t0
    assert r.returncode != 0, r.stdout[-2000:]
    line = last_line(r)
    assert f"Dask worker {blind_addr} on host {socket.gethostname()} does not see the run's work dir {work}" in line
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    assert not [p for p in work.iterdir() if p.is_dir()], "a stage ran although a worker cannot see the work dir"
    assert not (work / "last_run.json").exists()
    print(f"refused in {took:.1f} s: {line}")

    # 2. a worker that cannot reach the head's Prefect API (its proxy is dead): named before any work
    subprocess.run(["nsenter", "-t", str(blind.pid), "-m", "umount", str(shared)], check=True)  # it sees again
    dead = f"http://127.0.0.1:{free_port()}"
    cluster.worker("proxied", extra={"http_proxy": dead, "HTTP_PROXY": dead, "no_proxy": "", "NO_PROXY": ""})
    proxied_addr = next(iter(set(cluster.wait_workers(3)) - set(workers)))
    r = bertpipe(cluster.env, *args)
    assert r.returncode != 0
    assert f"Dask worker {proxied_addr} on host {socket.gethostname()} cannot reach this run's Prefect API " \
           f"(GET {cluster.env['PREFECT_API_URL']}/health failed" in last_line(r), r.stderr[-2000:]
    assert not [p for p in work.iterdir() if p.is_dir()]
    cluster.stop("proxied")
    cluster.wait_workers(2)

    # 3. the mount goes away once the run has started: the run fails in one line naming that worker; every
    # manifest written is true; the worker wrote nothing into its own copy of the path
    run = subprocess.Popen([str(BIN / "bertpipe"), "run", *map(str, args)], env=cluster.env, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    for raw in run.stdout:
        lines.append(raw.rstrip("\n"))
        if "reach this run's Prefect API and see the work dir" in raw:
            subprocess.run(["nsenter", "-t", str(blind.pid), "-m", "mount", "-t", "tmpfs", "none", str(shared)],
                           check=True)
            break
    rest, _ = run.communicate(timeout=600)
    lines += rest.splitlines()
    assert run.returncode != 0, "\n".join(lines[-40:])
    final = lines[-1]
    assert blind_addr in final and str(work) in final and "see the run's work dir" in final, "\n".join(lines[-40:])
    assert not any(line.startswith("Traceback") for line in lines), "\n".join(lines[-60:])
    assert not (work / "last_run.json").exists()
    print(f"manifests true: {true_manifests(work)}; last line: {final}")
    seen_by_blind = subprocess.run(["nsenter", "-t", str(blind.pid), "-m", "find", str(shared), "-mindepth", "1"],
                                   capture_output=True, text=True, check=True).stdout.split()
    assert seen_by_blind == [], seen_by_blind  # nothing re-run into the worker's own disk

    # 4. without that worker the same command finishes, every manifest true
    cluster.stop("blind")
    cluster.wait_workers(1)
    r = bertpipe(cluster.env, *args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert true_manifests(work) >= 8 * 2


# -- the dump route on daemonic workers, and the log lines ------------------------------------------------------
def test_the_dump_route_runs_on_nanny_workers_with_the_local_bytes_and_logs(cluster: Cluster, server,
                                                                           tmp_path: Path) -> None:
    env, api = server
    local = tmp_path / "local"
    r = bertpipe(env, "--work-dir", local, "--workers", "2")  # the built-in sample dump, local pool
    assert r.returncode == 0, r.stderr[-3000:]
    local_lines = library_lines(flow_run_logs(api))
    for k in (1, 2):
        cluster.worker(f"w{k}")  # under a nanny: a daemonic process, as `dask worker` starts it
    cluster.wait_workers(2)
    with cluster.client() as c:
        assert set(c.run(lambda: __import__("multiprocessing").current_process().daemon).values()) == {True}
    work = tmp_path / "dask"
    records = result_records(env)
    t0 = time.monotonic()
    r = bertpipe(env, "--work-dir", work, "--workers", "2", "--dask-address", cluster.address)
    print(f"dump route on Dask: {time.monotonic() - t0:.1f} s")
    assert r.returncode == 0, r.stderr[-4000:]
    assert "daemonic processes are not allowed" not in r.stderr + r.stdout
    assert output_md5s(work) == output_md5s(local)
    true_manifests(work)
    dask_lines = library_lines(flow_run_logs(api))
    print(f"library lines: local {len(local_lines)}, Dask {len(dask_lines)}")
    _same_library_lines(local_lines, dask_lines)
    assert any(n == "core.pools" and "daemonic process" in m for n, _, m in dask_lines), dask_lines
    assert result_records(env) == records


def test_library_log_lines_of_dask_calls_reach_the_flow_run(cluster: Cluster, server, text: Path, shared_data: Path,
                                                           local_text_run, tmp_path: Path) -> None:
    env, _ = server
    md5s, local_lines = local_text_run
    for k in (1, 2):
        cluster.worker(f"w{k}")
    cluster.wait_workers(2)
    work = tmp_path / "dask"
    records = result_records(env)
    r = bertpipe(env, "--text-dir", text, "--vocab", shared_data / "vocab.txt", *FLAGS, "--work-dir", work,
                 "--workers", "2", "--dask-address", cluster.address)
    assert r.returncode == 0, r.stderr[-4000:]
    assert output_md5s(work) == md5s
    dask_lines = library_lines(flow_run_logs(env["PREFECT_API_URL"]))
    print(f"library lines: local {len(local_lines)}, Dask {len(dask_lines)}")
    _same_library_lines(local_lines, dask_lines)
    assert result_records(env) == records
    for k in (1, 2):  # the workers' own consoles: no result-record tracebacks, no lost warnings
        log = (cluster.logs / f"w{k}.log").read_text(errors="replace")
        assert "Traceback" not in log, log[-3000:]


def _same_library_lines(local: list, dask: list) -> None:
    """Every library line of the local run (logger and level; messages may hold paths and times) is in the Dask
    run's logs as often; the local run had some."""
    want = Counter((n, lvl) for n, lvl, _ in local)
    got = Counter((n, lvl) for n, lvl, _ in dask)
    assert sum(want.values()) >= 3, local
    missing = want - got
    assert not missing, f"library lines of the local run missing from the Dask run's logs: {missing}\n{dask}"


def result_records(env: dict) -> dict[str, int]:
    """Prefect's result records of stage tasks (under PREFECT_HOME/storage, shared by the head and the workers
    here): name -> mtime. On Dask none is written (the workers would write them on their own disks)."""
    storage = Path(env["PREFECT_HOME"]) / "storage"
    return {p.name: p.stat().st_mtime_ns for p in storage.rglob("*") if p.is_file() and "bertpipe-" in p.name} \
        if storage.exists() else {}


# -- nothing after the end ---------------------------------------------------------------------------------
def _watch_manifests(work: Path, since_ns: int, seconds: float) -> list[str]:
    """Manifests written under ``work`` after ``since_ns`` (watching ``seconds``)."""
    late: set[str] = set()
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for mf in work.rglob(MANIFEST_NAME):
            try:
                if mf.stat().st_mtime_ns > since_ns:
                    late.add(str(mf.relative_to(work)))
            except FileNotFoundError:
                pass
        time.sleep(0.2)
    return sorted(late)


@pytest.mark.parametrize("how", ["SIGTERM", "kill -9"])
def test_nothing_is_committed_after_the_command_ends(cluster: Cluster, server, text: Path, shared_data: Path,
                                                     tmp_path: Path, how: str) -> None:
    env, _ = server
    for k in (1, 2):  # each manifest commit waits 8 s: calls are still running when the command ends
        cluster.worker(f"w{k}", nthreads=2, preload=Path(__file__).with_name("dask_preload_slow.py"),
                       extra={"BERTPIPE_TEST_COMMIT_DELAY": "8"})
    cluster.wait_workers(2)
    work = tmp_path / "w"
    many = tmp_path / "text"
    many.mkdir()
    for i in range(24):  # 24 parts: the 8 parts three times over
        shutil.copy(text / f"part-{i % 8:05d}-of-00500", many / f"part-{i:05d}-of-00500")
    shutil.copy(text / "eval.txt", many / "eval.txt")
    run = subprocess.Popen([str(BIN / "bertpipe"), "run", "--text-dir", str(many), "--vocab",
                            str(shared_data / "vocab.txt"), "--dupe-factor", "5", "--n-output-shards", "4",
                            "--num-examples-to-pick", "50", "--work-dir", str(work), "--workers", "4",
                            "--dask-address", cluster.address], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, start_new_session=True)
    wait_for(lambda: any((work / "tfrecord").rglob(MANIFEST_NAME)) if (work / "tfrecord").exists() else False, 600,
             "a first TFRecord")
    if how == "SIGTERM":
        run.send_signal(signal.SIGTERM)
        _, err = run.communicate(timeout=120)
        assert run.returncode == 143, err[-3000:]
        assert "terminated (SIGTERM)" in err.strip().splitlines()[-1]
        ended = time.time_ns()
    else:
        run.kill()  # the command's process only (its Dask calls run in other processes, beyond any signal)
        run.communicate(timeout=60)
        ended = time.time_ns() + 1_000_000_000  # the token's watchdog notices within a second
    late = _watch_manifests(work, ended, 12.0)
    assert late == [], f"manifests written after the command ended ({how}): {late}"
    assert not list(work.glob(".bertpipe-run-*")), "the run's token outlived it"
    with cluster.client() as c:  # nothing of the run is left queued or running on the cluster
        wait_for(lambda: not any(c.processing().values()), 60, "the cluster to drain")
    done = true_manifests(work)
    print(f"{how}: {done} manifests true, none after the end")
    for k in (1, 2):  # the next run, on workers without the wait, finishes the rest
        cluster.stop(f"w{k}")
        cluster.worker(f"fresh{k}", nthreads=2)
    cluster.wait_workers(2)
    r = bertpipe(env, "--text-dir", many, "--vocab", shared_data / "vocab.txt", "--dupe-factor", "5",
                 "--n-output-shards", "4", "--num-examples-to-pick", "50", "--work-dir", work, "--workers", "4",
                 "--dask-address", cluster.address, "-q")
    assert r.returncode == 0, r.stderr[-3000:]
    assert true_manifests(work) >= 24 * 2


# -- the scheduler gone --------------------------------------------------------------------------------------
def test_a_lost_scheduler_stops_the_run_in_one_line_within_a_minute(cluster: Cluster, server, text: Path,
                                                                    shared_data: Path, tmp_path: Path) -> None:
    env, _ = server
    for k in (1, 2):
        cluster.worker(f"w{k}")
    cluster.wait_workers(2)
    work = tmp_path / "w"
    run = subprocess.Popen([str(BIN / "bertpipe"), "run", "--text-dir", str(text), "--vocab",
                            str(shared_data / "vocab.txt"), "--dupe-factor", "5", "--n-output-shards", "4",
                            "--num-examples-to-pick", "50", "--work-dir", str(work), "--workers", "2",
                            "--dask-address", cluster.address], env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)
    out: dict[str, str] = {}
    reader = threading.Thread(target=lambda: out.update(zip(("stdout", "stderr"), run.communicate(), strict=True)))
    reader.start()
    wait_for(lambda: (work / "tfrecord").exists(), 600, "the first calls")
    cluster.stop("scheduler", signal.SIGKILL)
    t0 = time.monotonic()
    reader.join(120)
    took = time.monotonic() - t0
    assert run.returncode is not None and run.returncode != 0, out
    err = out["stderr"].strip().splitlines()
    print(f"stopped {took:.1f} s after the scheduler's kill; {len(err)} stderr lines; last: {err[-1]}")
    assert took < 60
    assert f"the Dask scheduler at {cluster.address} is gone" in err[-1] and "restart it" in err[-1], err[-30:]
    assert not any("Traceback" in line for line in err), "\n".join(err[-80:])
    late = _watch_manifests(work, time.time_ns(), 5.0)
    assert late == []
    true_manifests(work)
