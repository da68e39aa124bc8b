"""Work-dir lock: a second holder is refused with a message naming the first; a kill -9 frees it at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.errors import InputError
from core.lock import LOCK_NAME, WorkDirLock

ROOT = Path(__file__).resolve().parents[2]
HOLD = "import sys, time; from core.lock import WorkDirLock\nwith WorkDirLock(sys.argv[1]):\n print('held', flush=True); time.sleep(60)"


def _holder(work: Path) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", HOLD, str(work)], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "held"
    return p


def test_second_run_refused_then_lock_free_after_kill_9(tmp_path: Path) -> None:
    p = _holder(tmp_path)
    try:
        with pytest.raises(InputError, match=rf"in use by pid {p.pid} .*--wait-lock"):
            with WorkDirLock(tmp_path):
                pass
        t0 = time.monotonic()
        with pytest.raises(InputError):
            with WorkDirLock(tmp_path, wait_s=1.0):
                pass
        assert time.monotonic() - t0 >= 1.0
    finally:
        os.kill(p.pid, signal.SIGKILL)
        p.wait()
    assert str(p.pid) in (tmp_path / LOCK_NAME).read_text()  # stale content left by the killed holder ...
    with WorkDirLock(tmp_path):  # ... yet the lock is free: flock died with its process
        assert str(os.getpid()) in (tmp_path / LOCK_NAME).read_text()


def test_reentrant_in_one_process_and_waiting(tmp_path: Path) -> None:
    with WorkDirLock(tmp_path), WorkDirLock(tmp_path / "." ):
        pass
    p = _holder(tmp_path)
    try:
        t0 = time.monotonic()
        subprocess.Popen(["sh", "-c", f"sleep 1; kill {p.pid}"])
        with WorkDirLock(tmp_path, wait_s=30):  # waits until the holder ends
            waited = time.monotonic() - t0
            # taken only once the holder is gone: it has already exited (at worst not yet reaped), killed by
            # our TERM; a lock taken while it still ran would time out here (it lives until the kill at 1 s)
            assert p.wait(timeout=0.5) == -signal.SIGTERM
            assert waited >= 0.9
    finally:
        if p.poll() is None:
            p.kill()
        p.wait()


def test_second_bertpipe_run_on_a_busy_work_dir_refuses_at_once(tmp_path: Path) -> None:
    p = _holder(tmp_path)
    try:
        r = subprocess.run([str(Path(sys.executable).parent / "bertpipe"), "run", "--work-dir", str(tmp_path)],
                           cwd=ROOT, capture_output=True, text=True, timeout=120)
    finally:
        p.kill()
        p.wait()
    assert r.returncode == 2
    assert f"work dir {tmp_path} is in use by pid {p.pid}" in r.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == [LOCK_NAME]  # nothing was started or written
