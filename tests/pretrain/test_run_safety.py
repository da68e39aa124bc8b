"""What keeps a training's output dir safe, without DeepSpeed (fast, real processes): metrics.jsonl after a
resume, the output-dir lock, the ranks' lock, death with the owning command (parent-death signal, watchdog),
stale torch extension build locks. The real 2-rank runs are in test_train_safety.py (slow)."""

from __future__ import annotations

import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from core.errors import InputError
from pretrain import extensions, liveness
from pretrain.launch import output_dir_lock
from pretrain.metrics import MetricsWriter, has_eval_record, read_metrics, truncate_metrics

ROOT = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def _py(code: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], env=kw.pop("env", ENV),
                            stdout=subprocess.PIPE, text=True, **kw)


def _gone(pid: int, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not liveness.process_alive(pid):
            return True
        time.sleep(0.05)
    return False


# --- metrics.jsonl after a resume ---------------------------------------------------------------------------

def _records(path: Path, steps, evals=()) -> list[str]:
    return [json.dumps({"step": s, "loss": 10.0 - s / 10}) for s in steps] + [
        json.dumps({"step": s, "eval_mlm_accuracy": 0.01 * s}) for s in evals]


def test_a_resume_rewrites_metrics_so_each_step_is_listed_once(tmp_path):
    m = tmp_path / "metrics.jsonl"
    # a run to step 18 (eval at 15) killed after checkpoint 15, its last line cut off; earlier duplicates too
    lines = _records(m, range(1, 19), [15]) + _records(m, [3]) + ['{"step": 19, "lo']
    m.write_text("\n".join(lines))
    inode = m.stat().st_ino
    w = MetricsWriter(tmp_path, tensorboard=False, start_step=15)  # the resumed run starts after step 15
    assert m.stat().st_ino != inode  # rewritten to a temp name, then renamed
    w.write({"step": 16, "loss": 8.0})
    w.close()
    recs = read_metrics(m)
    train = [r["step"] for r in recs if "loss" in r]
    assert train == list(range(1, 17)) and [r["step"] for r in recs if "eval_mlm_accuracy" in r] == [15]
    assert has_eval_record(m, 15) and not has_eval_record(m, 16)
    assert truncate_metrics(m, 16) == 0  # nothing to drop: the file is left as it is
    assert m.stat().st_ino == os.stat(m).st_ino
    MetricsWriter(tmp_path, tensorboard=False, start_step=0).close()  # a fresh start (--overwrite)
    assert m.read_text() == ""


# --- the output dir lock -------------------------------------------------------------------------------------

HOLD = """
import sys, time
from pretrain.launch import output_dir_lock
with output_dir_lock(sys.argv[1]):
    print("held", flush=True)
    time.sleep(120)
"""


def _holder(out: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(out)], env=ENV, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_output_dir_lock_names_the_holder_and_a_killed_holders_lock_is_free(tmp_path, golden, capsys):
    out = tmp_path / "run"
    holder = _holder(out)
    try:
        with pytest.raises(InputError) as e, output_dir_lock(out):
            pass
        msg = str(e.value)
        assert f"training output dir {out} is in use by pid {holder.pid} on {socket.gethostname()}" in msg
        assert msg.endswith("wait for that training to finish, or use another --output-dir")
        with pytest.raises(InputError, match="or use another output_dir$"), output_dir_lock(out, flag="output_dir"):
            pass
        from bertpipe.cli import main  # `bertpipe train` refuses in one line, exit 2, before DeepSpeed starts

        t0 = time.monotonic()
        rc = main(["train", "--train-dir", str(golden / "4bins"), "--output-dir", str(out), "--nproc", "2",
                   "--device", "cpu", "--max-steps", "2"])
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and f"is in use by pid {holder.pid} on " in err[0], err
        assert time.monotonic() - t0 < 10
    finally:
        holder.kill()
        holder.wait()
    with output_dir_lock(out):  # the kernel dropped the dead holder's flock: nothing stale to clean up
        with output_dir_lock(out):  # re-entrant in one process (a flow, then the launch inside it)
            pass


def test_ranks_of_an_earlier_training_are_waited_for_then_named(tmp_path):
    out = tmp_path / "run"
    rank = _py("""
        import sys, time
        from pretrain.liveness import hold_ranks_lock
        f = hold_ranks_lock(sys.argv[1]); print("up", flush=True); time.sleep(120)
    """.replace("sys.argv[1]", repr(str(out))))
    try:
        assert rank.stdout.readline().strip() == "up"
        assert liveness.ranks_alive(out)
        with pytest.raises(InputError, match=r"ranks of an earlier training still run in --output-dir .*fuser -v"):
            liveness.wait_for_old_ranks(out, wait_s=0.5)
        threading.Timer(0.5, rank.kill).start()  # ranks that die while we wait: no refusal
        liveness.wait_for_old_ranks(out, wait_s=10)
    finally:
        rank.kill()
        rank.wait()
    assert not liveness.ranks_alive(out)


# --- death with the owning command ------------------------------------------------------------------------

def test_process_alive_knows_zombies_and_reused_pids():
    me = os.getpid()
    assert liveness.process_alive(me, liveness.start_time(me))
    assert not liveness.process_alive(me, "1")  # another process's start time: the pid was reused
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 5
    while liveness.process_alive(child.pid) and time.monotonic() < deadline:  # not reaped: a zombie
        time.sleep(0.02)
    assert not liveness.process_alive(child.pid)
    child.wait()
    assert liveness.parse_owner(liveness.owner_token()) == (me, liveness.start_time(me), socket.gethostname())


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="parent-death signal: Linux")
def test_the_launcher_dies_with_its_owner_even_on_kill_9():
    """An owner starts a "launcher" through the exec wrapper, in a session of its own (as pretrain/launch.py
    does), and is killed with SIGKILL: the kernel kills the launcher at once."""
    owner = _py("""
        import subprocess, sys, time
        from pretrain.liveness import exec_wrapper
        p = subprocess.Popen(exec_wrapper(["sleep", "300"]), start_new_session=True)
        print(p.pid, flush=True); time.sleep(300)
    """)
    launcher = int(owner.stdout.readline())
    deadline = time.monotonic() + 10  # (a loaded machine: the wrapper's Python takes a while to exec)
    while Path(f"/proc/{launcher}/cmdline").read_bytes().split(b"\0")[0] != b"sleep" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert Path(f"/proc/{launcher}/cmdline").read_bytes().split(b"\0")[0] == b"sleep"  # the wrapper exec'd
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    assert _gone(launcher, 5), "the launcher outlived its owner"


RANK = """
import os, subprocess, sys, time
from pretrain.liveness import guard_rank
if sys.argv[1] == "launcher":  # DeepSpeed's launcher: a rank and another process, then wait
    kids = [subprocess.Popen([sys.executable, "-c", CODE, "rank"]),
            subprocess.Popen(["sleep", "300"])]
    print(" ".join(str(k.pid) for k in kids), flush=True)
    time.sleep(300)
else:
    guard_rank(interval=0.2)
    while True:
        time.sleep(0.1)
"""


def test_a_rank_stops_its_whole_launch_when_the_owner_dies(tmp_path):
    """The owner (here a plain process) is killed; it stays a zombie (its parent has not reaped it): within
    a second the rank's watchdog SIGKILLs the launcher's session: launcher, rank and the other process."""
    owner = subprocess.Popen(["sleep", "300"])
    code = "CODE = " + repr(RANK) + "\n" + RANK
    env = {**ENV, liveness.OWNER_ENV: liveness.owner_token(owner.pid)}
    launcher = subprocess.Popen([sys.executable, "-c", code, "launcher"], env=env, stdout=subprocess.PIPE, text=True,
                                start_new_session=True)
    rank, other = map(int, launcher.stdout.readline().split())
    time.sleep(1.0)
    assert all(liveness.process_alive(p) for p in (launcher.pid, rank, other))  # the owner lives: nothing happens
    os.kill(owner.pid, signal.SIGKILL)  # not reaped yet: a zombie counts as dead
    t0 = time.monotonic()
    assert _gone(rank, 5) and _gone(other, 5)
    launcher.wait(timeout=5)
    print(f"\nwatchdog: launch gone {time.monotonic() - t0:.2f} s after the owner's SIGKILL")
    owner.wait()
    # without an owner on this host (started by hand, or another node's), guard_rank does nothing
    for token in ("", f"{os.getpid()}::another-host"):
        assert subprocess.run([sys.executable, "-c", "from pretrain.liveness import guard_rank; print(guard_rank())"],
                              env={**ENV, liveness.OWNER_ENV: token}, capture_output=True, text=True,
                              timeout=60).stdout.strip() == "None"


# --- stale torch extension build locks ----------------------------------------------------------------------

def _baton(root: Path, name: str, age: float) -> Path:
    d = root / "py311_cpu" / name
    d.mkdir(parents=True)
    lock = d / "lock"
    lock.write_text("")
    t = time.time() - age
    os.utime(lock, (t, t))
    return lock


def test_a_stale_build_lock_is_removed_a_live_or_young_one_is_not(tmp_path):
    stale = _baton(tmp_path, "deepspeed_shm_comm", 600)
    young = _baton(tmp_path, "fresh_op", 5)
    building = _baton(tmp_path, "building_op", 600)
    ninja = subprocess.Popen(["sleep", "60"], cwd=building.parent)  # a build: a process working in the folder
    said: list[str] = []
    try:
        assert extensions.lock_state(building)[0] == "live"
        removed = extensions.recover_stale_locks([tmp_path], say=said.append)
    finally:
        ninja.kill()
        ninja.wait()
    assert removed == [stale] and not stale.exists() and young.exists() and building.exists()
    assert said == [f"removed a stale torch extension build lock {stale} (600 s old and no process builds in "
                    f"{stale.parent}: left by a killed build)"]
    assert extensions.lock_state(building)[0] == "stale"  # its build is gone now
    assert extensions.build_roots({"TORCH_EXTENSIONS_DIR": "/x"}) == [Path("/x")]
    assert extensions.build_roots({"HOME": "/h"}) == [Path("/h/.cache/torch_extensions")]


def test_a_rank_waiting_on_a_build_lock_says_so_within_seconds(tmp_path, caplog):
    lock = _baton(tmp_path, "deepspeed_shm_comm", 600)
    done = threading.Event()
    with caplog.at_level(logging.INFO, logger="pretrain.extensions"):
        extensions.watch_build_locks(done, after_s=0.3, interval=0.1, roots=[tmp_path])
        deadline = time.monotonic() + 5
        while not caplog.records and time.monotonic() < deadline:
            time.sleep(0.05)
        done.set()
    assert caplog.records, "nothing said about the lock"
    msg = caplog.records[0].getMessage()
    assert caplog.records[0].levelname == "WARNING" and str(lock) in msg and f"rm {lock}" in msg


# --- a rank's error ends the whole training: one line, nothing left (issue 33, item 6) --------------------------

FAILING_LAUNCH = r"""
import os, subprocess, sys, time
# a "launcher" with two "ranks": one in its own session (as torchrun's workers), blocked as in a collective,
# the other fails after a moment with its one error line, a traceback-like chatter before it
blocked = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True)
print(blocked.pid, file=open(sys.argv[1], "w"), flush=True)
failing = subprocess.Popen([sys.executable, "-c", '''
import sys, time
time.sleep(1.5)
print("Traceback (most recent call last):", file=sys.stderr)
print("  File x, line 1", file=sys.stderr)
print("pretrain/train.py [rank 1]: error: bad training data in /d/part_1.hdf5 row 17: input_ids holds the "
      "negative token id -5 (column 3); re-create the file", file=sys.stderr, flush=True)
sys.exit(2)
'''])
failing.wait()
print("pretrain/train.py [rank 0]: error: lost contact with another rank (RuntimeError: Connection closed by peer)",
      file=sys.stderr, flush=True)
time.sleep(300)  # a launcher that never notices
"""


@pytest.mark.parametrize("mode", ["quiet", "callback"])
def test_a_rank_error_ends_every_rank_and_the_launch_with_its_one_line(tmp_path, monkeypatch, capfd, mode):
    import pretrain.launch as launch_mod
    from pretrain.launch import launch
    from pretrain.train_config import TrainConfig

    script, pid_file = tmp_path / "launcher.py", tmp_path / "blocked.pid"
    script.write_text(FAILING_LAUNCH)
    monkeypatch.setattr(launch_mod, "build_command", lambda cfg, nproc, **kw: [sys.executable, str(script),
                                                                                 str(pid_file)])
    monkeypatch.delenv(launch_mod.VERBOSE_ENV, raising=False)
    lines: list[str] = []
    t0 = time.monotonic()
    rc = launch(TrainConfig(train_dir=str(tmp_path), output_dir=str(tmp_path / "out"), device="cpu"), 2, check=False,
                on_output=lines.append if mode == "callback" else None)
    took = time.monotonic() - t0
    assert rc == 2 and took < 30, (rc, took)
    blocked = int(pid_file.read_text())
    assert _gone(blocked, 5), "the blocked rank (a session of its own) was left running"
    out, err = capfd.readouterr()
    # the console: that line only; a callback (Prefect's logs) gets every line up to it, none after
    shown = (lines[-1:] if mode == "callback" else err.splitlines())
    assert sum("error:" in line for line in lines) == (1 if mode == "callback" else 0)
    assert shown == ["pretrain/train.py [rank 1]: error: bad training data in /d/part_1.hdf5 row 17: input_ids "
                     "holds the negative token id -5 (column 3); re-create the file"], shown
    log = (tmp_path / "out" / "launcher.log").read_text()
    assert "Traceback" in log and "row 17" in log


def test_a_rank_that_raises_ends_at_once_in_one_line_even_with_a_thread_left(tmp_path):
    """pretrain/train.py's main: an exception (here with a non-daemon thread still running, as a rank whose
    peers are gone can have) prints its traceback then one error line and ends the process at once."""
    code = textwrap.dedent(f"""
        import sys, threading, time
        import pretrain.train as t
        threading.Thread(target=time.sleep, args=(300,)).start()  # would keep the interpreter alive at exit
        def boom(cfg):
            raise IndexError("index 30600 is out of bounds for dimension 0 with size 30528")
        t.train = boom
        sys.exit(t.main(["--train-dir", {str(tmp_path)!r}, "--output-dir", {str(tmp_path / 'o')!r}]))
    """)
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True, text=True, timeout=120)
    lines = r.stderr.strip().splitlines()
    assert r.returncode == 1 and time.monotonic() - t0 < 60, r.stderr[-2000:]
    assert lines[-1] == ("pretrain/train.py [rank 0]: error: IndexError: index 30600 is out of bounds for dimension 0 "
                         "with size 30528 (traceback: launcher.log)"), lines
    assert "Traceback (most recent call last)" in r.stderr
