"""Issue 24 with a real Prefect stack (slow): `prefect server start`, the `bertpipe-process` work pool, every
deployment of deployments/prefect.yaml deployed with `prefect deploy --all`, and a real `prefect worker` that runs
each flow run as its own process (tests/flows/prefect_stack.py). Nothing is mocked.

1. Runs die whole: a data, training or refresh run's process killed with SIGKILL leaves no pool worker,
   forkserver, resource tracker or DeepSpeed rank; the worker marks it Crashed within a minute; `prefect flow-run
   retry` resumes it (a training from its checkpoint, each step once); another run never trains into the busy or
   checkpointed output dir (one line naming the deployment's parameters).
2. Deploying is safe: nothing scheduled, the refresh needs a datasets_dir, an unset BERTPIPE_PROJECT_DIR is
   refused by `prefect deploy` naming it.
3./4. The refresh through the worker: rebuilt, unchanged, a changed data parameter rebuilds the bins only; its
   markdown artifact lists the versions kept and removed.
5. Parameter mistakes: one line naming the parameter, before any task, no Prefect engine traceback.
6. Results readable with run_deployment(...).state.result(); artifact keys carry the work dir's id; a forced
   stage's batches run while the others show Cached; the e2e run's logs hold the training's steps and the eval's
   progress; a failed refresh runs its hook and the shipped automation sends a notification.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from prefect_stack import FINAL, ROOT, PrefectStack, descendants, proc_alive, wait_for

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
JOB_ENV = {"PREFECT_LOGGING_EXTRA_LOGGERS": "preprocessing,pretrain,tasks,flows", "BERTPIPE_PROGRESS": "0"}
SLOW_BINS = {**JOB_ENV, "BERTPIPE_TEST_SLOW": "bins:start:4"}  # each bins shard sleeps 4 s: time to kill
TIMINGS: dict[str, float] = {}


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory):
    t0 = time.monotonic()
    with PrefectStack(tmp_path_factory.mktemp("ops"), extra_env={"PREFECT_WORKER_QUERY_SECONDS": "2",
                                                                  "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "3",
                                                                  "TORCH_EXTENSIONS_DIR": os.environ.get(
                                                                      "TORCH_EXTENSIONS_DIR", str(
                                                                          Path.home() / ".cache/torch_extensions"))}
                      ) as s:
        TIMINGS["stack up"] = time.monotonic() - t0
        yield s
    print("timings (s):", {k: round(v, 1) for k, v in TIMINGS.items()})


def _run(stack: PrefectStack, deployment: str, params: dict, env: dict | None = None) -> str:
    dep = stack.deployment(deployment)
    body = {"parameters": params, **({"job_variables": {"env": env}} if env else {})}
    return stack.call("POST", f"/deployments/{dep['id']}/create_flow_run", body)["id"]


def _finish(stack: PrefectStack, run_id: str, timeout: float = 900) -> dict:
    return stack.wait(run_id, timeout, FINAL)


def _kill_when(stack: PrefectStack, run_id: str, ready, what: str, timeout: float = 600) -> tuple[set[int], float]:
    """SIGKILL the flow run's process once ``ready()``; (its processes then, seconds until Prefect said Crashed).
    Asserts every one of those processes is gone within 10 s and the run is Crashed within 60 s."""
    pid = stack.run_pid(run_id)
    wait_for(what, lambda: ready() or stack.state(run_id)["type"] in FINAL, timeout, 0.1)
    assert stack.state(run_id)["type"] == "RUNNING", stack.state(run_id)
    family = descendants(pid) | {pid}
    assert len(family) > 2, family  # its pool workers or ranks are running
    advice_before = stack.log("worker").count(_ADVICE)
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()
    wait_for("every process of the killed run gone", lambda: not [p for p in family if proc_alive(p)], 10, 0.1)
    state = stack.wait(run_id, 60, FINAL)
    seconds = time.monotonic() - t0
    assert state["type"] == "CRASHED", state
    # The worker proposes Crashed a second time once its own wait for the process returns (a few seconds later,
    # then logging its "Check whether ..." advice); a retry set before that can be overwritten by it (Prefect 3.8),
    # so the retry waits for it.
    wait_for("the worker's own crash report", lambda: stack.log("worker").count(_ADVICE) > advice_before, 120, 0.5)
    return family, seconds


_ADVICE = "prefect.flow_runs.worker - Check whether the flow run exceeded its memory allocation"


def _retry(stack: PrefectStack, run_id: str) -> None:
    stack.cli("flow-run", "retry", run_id, timeout=120)


def _one_line_failure(stack: PrefectStack, run_id: str, words: str, timeout: float = 300) -> str:
    """The run Failed before any task, its message one line holding ``words``, no engine traceback logged."""
    state = _finish(stack, run_id, timeout)
    assert state["type"] == "FAILED", state
    message = state["message"] or ""
    assert words in message and "\n" not in message.split("exception: ", 1)[-1], message
    assert not stack.task_runs(run_id), [t["name"] for t in stack.task_runs(run_id)]
    logs = stack.log_text(run_id)
    assert "Engine execution exited with unexpected exception" not in logs and "Traceback" not in logs, logs[-3000:]
    return message


# -- 1. runs die whole, retries resume ---------------------------------------------------------------------
def test_a_killed_data_run_dies_whole_and_its_retry_completes(stack: PrefectStack, tmp_path: Path) -> None:
    w = tmp_path / "data"
    run = _run(stack, "bertpipe-data/data", {"work_dir": str(w), "workers": 2}, SLOW_BINS)
    _, crashed_s = _kill_when(stack, run, lambda: any(w.glob("bins/*/")), "the bins stage started")
    TIMINGS["data: kill -9 -> Crashed"] = crashed_s
    assert crashed_s < 60
    t0 = time.monotonic()
    _retry(stack, run)
    assert _finish(stack, run)["type"] == "COMPLETED", stack.log_text(run)[-3000:]
    TIMINGS["data: retry"] = time.monotonic() - t0
    r = subprocess.run([str(BIN / "bertpipe"), "status", "--work-dir", str(w)], capture_output=True, text=True)
    assert r.returncode == 0 and "0 of the current data set not done" in r.stdout, r.stdout + r.stderr


def _training(golden: Path, out: Path, max_steps: int, **kw) -> dict:
    return {"train_dir": str(golden / "4bins"), "eval_file": str(golden / "eval_100.hdf5"), "output_dir": str(out),
            "max_steps": max_steps, "options": {"checkpoint_interval": 4, "tensorboard": False, "micro_batch": 2,
                                                "eval_interval_steps": 1000}, **kw}


def test_a_killed_training_dies_whole_and_its_retry_resumes(stack: PrefectStack, golden: Path, tmp_path: Path) -> None:
    out = tmp_path / "pretrain"
    run = _run(stack, "bertpipe-pretrain/training", _training(golden, out, 24), JOB_ENV)
    family, crashed_s = _kill_when(stack, run, lambda: any(out.glob("checkpoints/*/bertpipe_complete.json")),
                                   "the first complete checkpoint", timeout=600)
    TIMINGS["training: kill -9 -> Crashed"] = crashed_s
    assert crashed_s < 60
    steps_then = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    time.sleep(3)  # nothing writes any more
    assert [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines()
            if '"loss"' in x] == steps_then

    # another run over the killed run's checkpoints: refused, naming the deployment's parameters
    other = _run(stack, "bertpipe-pretrain/training", _training(golden, out, 24), JOB_ENV)
    msg = _finish(stack, other)["message"]
    assert "holds" in msg and "add resume to continue it, or options.overwrite" in msg and "--" not in msg, msg

    # the retry continues from the checkpoint; a run started meanwhile is refused (the output dir is busy)
    t0 = time.monotonic()
    _retry(stack, run)
    wait_for("the retry holding the output dir", lambda: stack.state(run)["type"] in FINAL
             or "continuing its training" in stack.log_text(run), 300, 1)
    busy = _run(stack, "bertpipe-pretrain/training", _training(golden, out, 24, resume=True), JOB_ENV)
    state = _finish(stack, busy)
    assert state["type"] == "FAILED" and "training output dir" in state["message"] and "is in use by pid" in \
        state["message"] and "output_dir (or set wait_lock_s)" in state["message"], state
    assert _finish(stack, run)["type"] == "COMPLETED", stack.log_text(run)[-3000:]
    TIMINGS["training: retry to the end"] = time.monotonic() - t0
    logs = stack.log_text(run)
    assert "continuing its training" in logs and "resumed from checkpoint" in logs, logs[-3000:]
    steps = [json.loads(x)["step"] for x in (out / "metrics.jsonl").read_text().splitlines() if '"loss"' in x]
    assert steps == sorted(set(steps)) and steps[-1] == 24, steps  # each step once, in order
    assert json.loads((out / "summary.json").read_text())["steps"] == 24


def test_a_killed_refresh_dies_whole_and_its_retry_finishes_the_same_version(stack: PrefectStack,
                                                                            tmp_path: Path) -> None:
    root = tmp_path / "datasets"
    params = {"datasets_dir": str(root), "source": "sample", "data": {"workers": 2, "keep": "all"}}
    run = _run(stack, "bertpipe-refresh/refresh", params, SLOW_BINS)
    _, crashed_s = _kill_when(stack, run, lambda: any(root.glob("versions/*/bins/*/")), "the refresh's bins")
    TIMINGS["refresh: kill -9 -> Crashed"] = crashed_s
    assert crashed_s < 60
    half = [p.name for p in (root / "versions").iterdir()]
    assert len(half) == 1 and not (root / "latest").exists()
    _retry(stack, run)
    assert _finish(stack, run)["type"] == "COMPLETED", stack.log_text(run)[-3000:]
    assert (root / "latest").resolve().name == half[0]  # the retry resumed the same version
    assert "resuming a failed build" in stack.log_text(run)


# -- 2. deploying is safe ------------------------------------------------------------------------------------
def test_deploying_arms_nothing(stack: PrefectStack, tmp_path: Path) -> None:
    for name in ("bertpipe-data/data", "bertpipe-e2e/e2e", "bertpipe-pretrain/training", "bertpipe-refresh/refresh"):
        dep = stack.deployment(name)
        assert not [s for s in dep["schedules"] if s["active"]], (name, dep["schedules"])
        runs = stack.call("POST", "/flow_runs/filter", {"flow_runs": {"deployment_id": {"any_": [dep["id"]]}}})
        assert not [r for r in runs if r.get("auto_scheduled")], (name, runs)  # the scheduler made none
    refresh = stack.deployment("bertpipe-refresh/refresh")
    assert "datasets_dir" in refresh["parameter_openapi_schema"]["required"]
    assert refresh["parameters"]["keep_versions"] == 2 and refresh["parameters"]["data"]["keep"] == "training"
    env = {k: v for k, v in stack.env.items() if k != "BERTPIPE_PROJECT_DIR"}
    r = stack.cli("--no-prompt", "deploy", "--prefect-file", "deployments/prefect.yaml", "--all", check=False, env=env)
    assert r.returncode != 0 and "BERTPIPE_PROJECT_DIR=(unset) is not the absolute path of a bertpipe checkout" in \
        r.stdout + r.stderr, r.stdout[-2000:] + r.stderr[-2000:]


# -- 3./4. the refresh through the worker -----------------------------------------------------------------------
def _artifacts_by_key(stack: PrefectStack, run_id: str) -> dict[str, dict]:
    return {a["key"]: a for a in stack.artifacts(run_id) if a.get("key")}


def test_the_refresh_gate_reuse_and_report_through_the_worker(stack: PrefectStack, tmp_path: Path) -> None:
    from tasks.artifacts import scope_id

    root = tmp_path / "datasets"
    data = {"workers": 1, "keep": "all", "dupe_factor": 1, "n_output_shards": 2}
    results = []
    for shards in (2, 2, 3):
        run = _run(stack, "bertpipe-refresh/refresh", {"datasets_dir": str(root), "source": "sample",
                                                        "keep_versions": 1, "data": {**data, "n_output_shards": shards}},
                   JOB_ENV)
        assert _finish(stack, run)["type"] == "COMPLETED", stack.log_text(run)[-3000:]
        results.append(_result(stack, run))
        report = _artifacts_by_key(stack, run)[f"refresh-{scope_id(root)}"]["data"]
        assert "## Versions kept" in report and "## Versions removed" in report
    first, same, bins = results
    assert first["rebuilt"] and not same["rebuilt"] and same["version"] == first["version"]
    assert bins["rebuilt"] and bins["reason"].startswith("bins: its key is now")
    assert {k for k, v in bins["stages"].items() if v["calls"] > v["cached"]} == {"bins"}
    assert bins["removed"] == [{"version": first["version"], "why": "older than the kept versions",
                                "bytes": bins["removed"][0]["bytes"]}]
    assert f"`{first['version']}` | older than the kept versions" in report


def _result(stack: PrefectStack, run_id: str):
    """The run's persisted result, read as a Prefect user reads it (a subprocess of the stack's environment)."""
    code = ("import json, sys, uuid\nfrom prefect import get_client\n"
            "with get_client(sync_client=True) as c:\n"
            "    fr = c.read_flow_run(uuid.UUID(sys.argv[1]))\n"
            "print(json.dumps(fr.state.result()))\n")
    r = subprocess.run([sys.executable, "-c", code, run_id], env=stack.env, capture_output=True, text=True,
                       timeout=120, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


# -- 5. one line, early -------------------------------------------------------------------------------------------
def test_parameter_mistakes_are_one_line_before_any_task(stack: PrefectStack, golden: Path, tmp_path: Path) -> None:
    t0 = time.monotonic()
    e2e = _run(stack, "bertpipe-e2e/e2e", {"data": {"work_dir": str(tmp_path / "e"), "n_output_shard": 4}}, JOB_ENV)
    msg = _one_line_failure(stack, e2e, "data.n_output_shard is not a data parameter; did you mean "
                                        "data.n_output_shards? the data parameters are: work_dir, ")
    assert "max_seq_length" in msg
    steps = _run(stack, "bertpipe-pretrain/training", _training(golden, tmp_path / "o", -5), JOB_ENV)
    _one_line_failure(stack, steps, "max_steps must be between 1 and 2147483647, got -5")
    missing = _run(stack, "bertpipe-pretrain/training", {**_training(golden, tmp_path / "o", 5),
                                                          "train_dir": str(tmp_path / "nope")}, JOB_ENV)
    _one_line_failure(stack, missing, f"train_dir {tmp_path / 'nope'} does not exist")
    vocab = _run(stack, "bertpipe-refresh/refresh", {"datasets_dir": str(tmp_path / "d"), "source": "sample",
                                                     "vocab": str(tmp_path / "vocab.txt")}, JOB_ENV)
    _one_line_failure(stack, vocab, f"vocab {tmp_path / 'vocab.txt'}: no such vocab.txt")
    TIMINGS["4 refusals, each to Failed"] = time.monotonic() - t0

    # a work dir in use: the refusal names the deployment's parameters
    w = tmp_path / "busy"
    holder = subprocess.Popen([sys.executable, "-c", "import time; from core.lock import WorkDirLock\n"
                               f"with WorkDirLock({str(w)!r}):\n print('held', flush=True); time.sleep(300)"],
                              cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        busy = _run(stack, "bertpipe-data/data", {"work_dir": str(w)}, JOB_ENV)
        msg = _one_line_failure(stack, busy, f"work dir {w} is in use by pid {holder.pid}")
        assert "or pass wait_lock_s SECONDS), or use another work_dir" in msg and "--" not in msg, msg
    finally:
        holder.kill()
        holder.wait()

    # the refresh's datasets_dir is required: Prefect refuses the run at creation
    dep = stack.deployment("bertpipe-refresh/refresh")
    with pytest.raises(Exception) as exc:
        stack.call("POST", f"/deployments/{dep['id']}/create_flow_run", {"parameters": {"source": "sample"}})
    assert "datasets_dir" in (exc.value.read().decode() if hasattr(exc.value, "read") else str(exc.value))


# -- 6. what Prefect users expect ----------------------------------------------------------------------------------
def test_results_artifacts_cached_states_and_training_logs(stack: PrefectStack, tmp_path: Path) -> None:
    from tasks.artifacts import scope_id

    w = tmp_path / "e2e"
    code = ("import json, sys\nfrom prefect.deployments import run_deployment\n"
            "fr = run_deployment(sys.argv[1], parameters=json.loads(sys.argv[2]), timeout=1200)\n"
            "print(json.dumps({'id': str(fr.id), 'state': fr.state.type.value, 'result': fr.state.result()}))\n")
    params = {"data": {"work_dir": str(w), "workers": 1, "dupe_factor": 1, "n_output_shards": 2},
              "max_steps": 3, "options": {"eval_batch_size": 2, "tensorboard": False}}
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code, "bertpipe-e2e/e2e", json.dumps(params)], env=stack.env,
                       capture_output=True, text=True, timeout=1500, cwd=ROOT)
    TIMINGS["e2e via run_deployment"] = time.monotonic() - t0
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    assert got["state"] == "COMPLETED", str(got)[:3000]
    assert got["result"]["dataset"]["outputs"]["train_dir"].startswith(str(w)), str(got)[:2000]
    assert got["result"]["pretrain"]["summary"]["steps"] == 3
    logs = stack.log_text(got["id"])
    # the step lines and the eval's result (an eval this short logs no progress lines: tests/pretrain/test_eval_progress.py)
    assert "pretrain.train: step 3/3" in logs and "pretrain.train: step 3: eval masked-LM accuracy" in logs, logs[-3000:]
    keys = _artifacts_by_key(stack, got["id"])
    assert f"dataset-summary-{scope_id(w)}" in keys and f"stage-hdf5-{scope_id(w)}" in keys, sorted(keys)

    # the data deployment with force=["hdf5"] on that work dir: the HDF5 batches run, every other batch is Cached
    run = _run(stack, "bertpipe-data/data", {"work_dir": str(w), "workers": 1, "dupe_factor": 1,
                                             "n_output_shards": 2, "force": ["hdf5"]}, JOB_ENV)
    assert _finish(stack, run)["type"] == "COMPLETED", stack.log_text(run)[-3000:]
    states = {t["name"]: t["state"]["name"] for t in stack.task_runs(run)}
    ran = {n for n, s in states.items() if s != "Cached"}
    assert ran and all(n.startswith("tfrecord+hdf5") for n in ran) and len(states) > len(ran), states


class _Hook(http.server.BaseHTTPRequestHandler):
    got: list[bytes] = []

    def do_POST(self) -> None:  # noqa: N802
        _Hook.got.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args) -> None:
        pass


def test_a_failed_refresh_runs_its_hook_and_the_shipped_automation_notifies(stack: PrefectStack,
                                                                             tmp_path: Path) -> None:
    from tasks.artifacts import scope_id

    server = http.server.HTTPServer(("127.0.0.1", 0), _Hook)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        code = ("import sys\nfrom prefect.blocks.notifications import CustomWebhookNotificationBlock\n"
                "b = CustomWebhookNotificationBlock(name='bertpipe-test', url=sys.argv[1], "
                "json_data={'text': '{{subject}}: {{body}}'})\n"
                "print(b.save('bertpipe-test-hook', overwrite=True))\n")
        r = subprocess.run([sys.executable, "-c", code, f"http://127.0.0.1:{server.server_port}/hook"],
                           env=stack.env, capture_output=True, text=True, timeout=120, cwd=ROOT)
        assert r.returncode == 0, r.stderr[-2000:]
        block_id = r.stdout.strip().splitlines()[-1]
        spec = (ROOT / "deployments" / "automations" / "refresh-failed.yaml").read_text()
        assert "00000000-0000-0000-0000-000000000000" in spec
        (tmp_path / "auto.yaml").write_text(spec.replace("00000000-0000-0000-0000-000000000000", block_id))
        stack.cli("automation", "create", "--from-file", str(tmp_path / "auto.yaml"))

        root = tmp_path / "datasets"
        run = _run(stack, "bertpipe-refresh/refresh", {"datasets_dir": str(root), "source": "sample",
                                                       "data": {"workers": 1, "num_test_articles": 10000}}, JOB_ENV)
        state = _finish(stack, run)
        assert state["type"] == "FAILED" and "data.num_test_articles" in state["message"], state
        # (the hook's lines reach the API from the flow run's process as it ends: a second or two after the state)
        wanted = (f"refresh of {root} failed", "there is no latest version yet")
        try:
            wait_for("the failure hook's line in the run's logs",
                     lambda: all(w in stack.log_text(run) for w in wanted), 60, 1)
        except TimeoutError:
            pass  # the assertion below shows the logs
        logs = stack.log_text(run)
        assert all(w in logs for w in wanted), logs[-3000:]
        assert f"refresh-failed-{scope_id(root)}" in _artifacts_by_key(stack, run)
        t0 = time.monotonic()
        wait_for("the automation's notification", lambda: _Hook.got, 180, 1)
        TIMINGS["failed refresh -> notification"] = time.monotonic() - t0
        assert b"bertpipe refresh" in _Hook.got[0] and b"Failed" in _Hook.got[0], _Hook.got[0][:500]
    finally:
        server.shutdown()
