"""Issue 21's logic, fast and without Prefect or Dask: the run token (a call sees the work dir, or fails in one line
naming its host and the path), the commit gate (nothing committed once the run has ended), the flow's acceptance
of a call's result (only what it sees), the capture of the records a call logs, and pools in a daemonic process.
The same things with real Dask processes: tests/flows/test_dask_integrity.py (slow)."""

from __future__ import annotations

import json
import logging
import multiprocessing
import signal
import socket
import subprocess
import sys
import threading
import time
import warnings
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from core.lock import WorkDirLock
from core.manifest import StageOutput, load_manifest
from core.stage import Unit
from tasks import runtoken
from tasks.calls import Batch, Call, accept, capture_records, execute, execute_batch
from tasks.runtoken import RunEnded, RunToken, WorkDirNotSeen

ROOT = Path(__file__).resolve().parents[2]


def write_one(name: str, data: bytes, out_dir: Path, upstream=None) -> object:
    """A stage function: one file, logged, with a warning."""
    logging.getLogger("preprocessing.fake").info("writing %s (%d bytes)", name, len(data))
    warnings.warn(f"fake stage warning about {name} in {out_dir.name}", UserWarning, stacklevel=1)
    with StageOutput(out_dir, "fake", params={"name": name}) as out:
        with out.open(name) as f:
            f.write(data)
    return out.manifest


def _unit(work: Path, shard: str = "s1", run=write_one, data: bytes = b"x" * 100) -> Unit:
    return Unit(stage="fake", key="k", shard=shard, out_dir=str(work / "fake" / "k" / shard), run=run,
                args=("a.bin", data), pass_upstream=False)


@pytest.fixture
def work(tmp_path: Path, monkeypatch):
    # these calls stand for a pool or Dask worker's: there our libraries' records do not reach Prefect by
    # themselves (in this test process they may, once a Prefect-harness test has set up its logging)
    import tasks.calls

    monkeypatch.setattr(tasks.calls, "forwarded", lambda: False)
    w = tmp_path / "work"
    with WorkDirLock(w):
        token = runtoken.start_run(w)
        yield w, token
        runtoken.end_run(token)


def test_a_call_that_does_not_see_the_work_dir_fails_in_one_line_naming_host_and_path(tmp_path: Path) -> None:
    elsewhere = RunToken(str(tmp_path / "mnt" / "work"), "0" * 32)  # the mount is missing here
    with pytest.raises(WorkDirNotSeen) as got:
        execute(Call(units=(_unit(Path(elsewhere.work)),), run=elsewhere))
    msg = str(got.value)
    assert "\n" not in msg and socket.gethostname() in msg and str(elsewhere.path) in msg
    assert "mount the shared work dir" in msg
    assert not (tmp_path / "mnt").exists()  # nothing written into a local copy of the path


def test_a_call_started_after_its_run_ended_writes_nothing(work) -> None:
    w, token = work
    runtoken.end_run(token)
    with pytest.raises(RunEnded, match="has ended"):
        execute(Call(units=(_unit(w),), run=token))
    assert not (w / "fake").exists()


def test_a_call_of_a_live_run_commits_and_the_flow_accepts_it(work) -> None:
    w, token = work
    rows = execute(Call(units=(_unit(w),), run=token))
    assert load_manifest(rows[0]["dir"]) is not None and rows[0]["host"] == socket.gethostname()
    accept(json.loads(json.dumps(rows[0])))  # as it comes back through Prefect's JSON


def _slow_writer(name: str, data: bytes, out_dir: Path, *, started: threading.Event, go: threading.Event) -> object:
    with StageOutput(out_dir, "fake", params={"name": name}) as out:
        with out.open(name) as f:
            f.write(data)
        started.set()
        assert go.wait(30)
    return out.manifest


def test_a_call_running_when_its_run_ends_commits_no_manifest(work) -> None:
    w, token = work
    started, go = threading.Event(), threading.Event()
    u = Unit(stage="fake", key="k", shard="s1", out_dir=str(w / "fake" / "k" / "s1"), run=_slow_writer,
             args=("a.bin", b"y" * 10), kwargs={"started": started, "go": go}, pass_upstream=False)
    errors: list[BaseException] = []

    def call() -> None:
        try:
            execute(Call(units=(u,), run=token))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    t = threading.Thread(target=call)
    t.start()
    assert started.wait(30)
    runtoken.end_run(token)  # the flow stops (SIGTERM, a failure): the token goes first
    go.set()
    t.join(30)
    assert len(errors) == 1 and isinstance(errors[0], RunEnded), errors
    assert not (Path(u.out_dir) / "_manifest.json").exists()
    assert "not committed" in str(errors[0]) and "\n" not in str(errors[0])


def test_a_manifest_written_while_the_run_ended_is_taken_back(work, monkeypatch: pytest.MonkeyPatch) -> None:
    """The race: the gate passes, the token goes during the manifest's write: the manifest is removed again."""
    import core.manifest.output as cm  # the room whose StageOutput writes the manifest

    w, token = work
    real = cm.atomic_write_text

    def write_then_end(path, text, **kw):
        real(path, text, **kw)
        if str(path).endswith("_manifest.json"):
            runtoken.end_run(token)

    monkeypatch.setattr(cm, "atomic_write_text", write_then_end)
    with pytest.raises(RunEnded):
        execute(Call(units=(_unit(w),), run=token))
    assert not (w / "fake" / "k" / "s1" / "_manifest.json").exists()


def test_the_flow_refuses_a_result_it_cannot_see(work) -> None:
    w, token = work
    row = execute(Call(units=(_unit(w),), run=token))[0]
    d = Path(row["dir"])
    (d / "a.bin").write_bytes(b"short")  # another size than the call wrote
    with pytest.raises(WorkDirNotSeen, match=r"does not find its files as listed.*a\.bin"):
        accept(row)
    (d / "_manifest.json").unlink()  # as on a head without the worker's disk
    with pytest.raises(WorkDirNotSeen) as got:
        accept(row)
    assert "does not find its manifest" in str(got.value) and "\n" not in str(got.value)
    assert f"ran on host {socket.gethostname()}" in str(got.value)
    other = execute(Call(units=(_unit(w, data=b"z" * 7),), run=token))[0]
    with pytest.raises(WorkDirNotSeen, match="another manifest"):
        accept({**other, "manifest": row["manifest"]})


def test_a_new_run_removes_stale_tokens_and_a_killed_run_loses_its_token_within_a_second(tmp_path: Path) -> None:
    w = tmp_path / "w"
    w.mkdir()
    (w / ".bertpipe-run-deadbeef").write_text("{}")
    code = ("import sys, time; sys.path.insert(0, sys.argv[2]); from tasks import runtoken; "
            "t = runtoken.start_run(sys.argv[1]); print(t.path, flush=True); time.sleep(60)")
    p = subprocess.Popen([sys.executable, "-c", code, str(w), str(ROOT)], stdout=subprocess.PIPE, text=True)
    try:
        path = Path(p.stdout.readline().strip())
        assert path.exists() and not (w / ".bertpipe-run-deadbeef").exists()
        p.send_signal(signal.SIGKILL)
        p.wait(10)
        t0 = time.monotonic()
        while path.exists() and time.monotonic() - t0 < 10:
            time.sleep(0.05)
        assert not path.exists(), "the token outlived its run (kill -9)"
        assert time.monotonic() - t0 < 3
    finally:
        if p.poll() is None:
            p.kill()


def test_records_of_a_call_are_captured_with_its_warnings_and_apart_from_another_calls(work) -> None:
    """Two calls at once in two threads (a Dask worker with --nthreads 2): each gets its own records."""
    w, token = work
    sinks: dict[str, list] = {"s1": [], "s2": []}
    both = threading.Barrier(2)

    def call(shard: str) -> None:
        with capture_records(sinks[shard]):
            both.wait(10)
            logging.getLogger("preprocessing.fake").warning("call %s starts", shard)
            both.wait(10)
            execute(Call(units=(_unit(w, shard),), run=token))

    threads = [threading.Thread(target=call, args=(s,)) for s in sinks]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    for shard, other in (("s1", "s2"), ("s2", "s1")):
        text = [f"{lvl} {name}: {msg}" for lvl, name, msg in sinks[shard]]
        assert f"{logging.WARNING} preprocessing.fake: call {shard} starts" in text, text
        assert not any(f"call {other}" in t for t in text), text
        assert any(t.startswith(f"{logging.INFO} preprocessing.fake: writing a.bin") for t in text), text
        assert any("py.warnings" in t and "fake stage warning about a.bin" in t for t in text), text


def test_execute_batch_hands_over_the_records_of_a_failed_call(work) -> None:
    w, token = work
    seen: list = []
    bad = Call(units=(_unit(w),), run=RunToken(str(w / "nowhere"), "1" * 32))
    batch = Batch(calls=(Call(units=(_unit(w, "s0"),), run=token), bad), inline=True)
    with pytest.raises(WorkDirNotSeen):
        execute_batch(batch, on_records=seen.extend)
    assert any("writing a.bin" in m for _, _, m in seen)


def test_the_local_pool_returns_the_records_and_the_error_of_a_call(work) -> None:
    from tasks.calls import shutdown_pool

    w, token = work
    seen: list = []
    try:
        out = execute_batch(Batch(calls=(Call(units=(_unit(w, "p0"),), run=token),), inline=False), workers=1,
                            on_records=seen.extend)
        assert out.results[0]["shard"] == "p0" and any("writing a.bin" in m for _, _, m in seen)
        with pytest.raises(WorkDirNotSeen):
            execute_batch(Batch(calls=(Call(units=(_unit(w, "p1"),), run=RunToken(str(w / "no"), "2" * 32)),),
                                inline=False), workers=1)
    finally:
        shutdown_pool()


def _daemonic_child(q) -> None:  # noqa: ANN001
    from core.pools import ordered_map, run_all

    try:
        q.put(("ok", list(ordered_map(abs, [-1, -2, -3], 2)), run_all(pow, [(2, 3), (3, 2)], 2)))
    except BaseException as exc:  # noqa: BLE001
        q.put(("error", repr(exc)))


def test_a_daemonic_process_runs_pool_work_in_itself() -> None:
    """A Dask worker under its nanny is a daemonic process: Python refuses it children; the work runs in it."""
    ctx = multiprocessing.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_daemonic_child, args=(q,), daemon=True)
    p.start()
    got = q.get(timeout=120)
    p.join(30)
    assert got == ("ok", [1, 2, 3], [8, 9])


class _Health(BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802
        self.send_response(200 if self.path.endswith("/health") else 404)
        self.end_headers()
        self.wfile.write(b"true")

    def log_message(self, *args) -> None:  # noqa: ANN002
        pass


def test_the_worker_probe_names_what_it_cannot_reach(work, tmp_path: Path) -> None:
    w, token = work
    server = HTTPServer(("127.0.0.1", 0), _Health)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        api = f"http://127.0.0.1:{server.server_address[1]}/api"
        assert runtoken.probe_worker(api, token, 5.0, (str(w),)) == {"host": socket.gethostname(), "api": "",
                                                                     "work": "", "inputs": ""}
    finally:
        server.shutdown()
    got = runtoken.probe_worker(api, RunToken(str(tmp_path / "x"), "3" * 32), 2.0, (str(tmp_path / "text"),))
    assert got["api"].startswith(f"GET {api}/health failed")
    assert got["work"] == f"{tmp_path / 'x' / ('.bertpipe-run-' + '3' * 32)} is not there"
    assert got["inputs"] == f"{tmp_path / 'text'} is not there"



def test_a_signal_wrapped_by_a_serializer_comes_out_as_the_signal() -> None:
    """SIGTERM inside pydantic's serializer (Prefect serializing a task's context on submit) arrives as a
    PydanticSerializationError naming TerminationSignal: the run must still stop as on SIGTERM (one line, 143)."""
    from prefect.exceptions import TerminationSignal

    from flows.dag import _signal_behind

    got = _signal_behind(RuntimeError("Error calling function `_ser_model`: TerminationSignal: "))
    assert isinstance(got, TerminationSignal)
    try:
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt:
            raise OSError("cleanup failed") from None
    except OSError as exc:
        assert isinstance(_signal_behind(exc), KeyboardInterrupt)  # the interrupt behind an error while stopping
    assert _signal_behind(ValueError("a bad input")) is None
    assert _signal_behind(KeyboardInterrupt()) is None  # already the signal
