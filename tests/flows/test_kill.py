"""kill -9 of `bertpipe run` in the middle of the shard stages: its worker processes and Prefect's temporary
server go away with it, nothing half-written counts as done, and the re-run gives the serial bytes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from flowhelpers import FAST, output_md5s

from bench.kill_campaign import descendants as _descendants  # the campaign's process-tree walk

ROOT = Path(__file__).resolve().parents[2]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split()[2] == "Z")


def test_kill_9_during_shards_then_rerun(serial_run, three_part_text: Path, shared_data: Path,
                                         tmp_path: Path) -> None:
    _, serial = serial_run
    w = tmp_path / "w"
    cmd = [str(Path(sys.executable).parent / "bertpipe"), "run", "--text-dir", str(three_part_text), "--vocab",
           str(shared_data / "vocab.txt"), "--work-dir", str(w), *FAST[:-2], "--workers", "2", "-q"]
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "home")}
    env.pop("PREFECT_API_URL", None)
    run = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 180
    while not any(w.glob("tfrecord/*/*/")) and time.monotonic() < deadline and run.poll() is None:
        time.sleep(0.05)
    family = _descendants(run.pid)
    assert run.poll() is None and family, "the run ended before it could be killed"
    run.send_signal(signal.SIGKILL)
    run.wait()
    time.sleep(4)  # the reaper polls every second, pool workers every 0.5 s
    assert not [p for p in family if _alive(p)], "processes of the killed run survived it"
    assert subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True).returncode == 0
    assert output_md5s(w) == serial
