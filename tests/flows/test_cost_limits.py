"""Cost is predictable in the DAG too (issue 33, items 5 and 6): a shard count beyond what the packs can fill is
refused in one line before any shard is written, and a run stopped by a signal while pack-nvidia works leaves no
scratch folder behind (the command says its unfinished outputs were removed)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flowhelpers import run_cli

ROOT = Path(__file__).resolve().parents[2]
SHORT = ("--max-seq-length", "128", "--max-predictions-per-seq", "20", "--workers", "1")


def test_more_packed_shards_than_packs_is_one_line_and_leaves_nothing(prefect_harness, tmp_path, capsys):
    w = tmp_path / "w"
    capsys.readouterr()
    t0 = time.monotonic()
    rc = run_cli("--work-dir", w, "--target", "nvidia-packed", "--nvidia-packed-shards", "100000", *SHORT)
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if "WARNING" not in ln and ln.strip()]  # the sample's small eval set
    assert rc == 2 and len(lines) == 1 and "--shards_num 100,000: the inputs make" in lines[0], err
    assert "Traceback" not in err
    assert time.monotonic() - t0 < 120
    left = [p for p in (w / "nvidia_packed").rglob("*")] if (w / "nvidia_packed").exists() else []
    assert not [p for p in left if p.is_file() or p.name.endswith("_scratch")], left


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_during_pack_nvidia_leaves_no_scratch(sig, tmp_path):
    """At 512 the packing recipe takes seconds: the run is signalled once pack-nvidia's scratch folder exists."""
    w = tmp_path / "w"
    env = {**os.environ, "PREFECT_HOME": str(tmp_path / "ph"), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    proc = subprocess.Popen([sys.executable, "-m", "bertpipe", "run", "--work-dir", str(w), "--target",
                             "nvidia-packed", "--workers", "1", "-q"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and proc.poll() is None:
            if list(w.glob("nvidia_packed/*/.pack_nvidia_scratch")):
                break
            time.sleep(0.05)
        assert proc.poll() is None, "the run ended before pack-nvidia started: " + proc.communicate()[1][-2000:]
        time.sleep(0.5)
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode in (130, 143), (proc.returncode, err[-3000:])
    assert "unfinished outputs were removed" in err
    assert not list(w.glob("nvidia_packed/*/.pack_nvidia_scratch")), "the scratch folder is still there"
    assert not [p for p in w.rglob(".*.tmp-*")], "temporary files are still there"
