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


# -- a full disk (issue 33, items 5-6): one line naming the path, nothing left, the same bytes once space returns --
class SmallDisk:
    """A tmpfs of ``size`` mounted at ``where`` (root only; the test skips in one line where it cannot mount)."""

    def __init__(self, where: Path, size: str) -> None:
        self.where = where
        where.mkdir(parents=True, exist_ok=True)
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True,
                           text=True)
        if r.returncode != 0:
            pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.strip()[:80]}): full-disk tests need root")

    def close(self) -> None:
        subprocess.run(["umount", "-l", str(self.where)], check=True)  # lazy: a memory map may still hold it


def _files(d: Path) -> list[str]:
    return sorted(p.relative_to(d).as_posix() for p in d.rglob("*") if p.is_file())


def test_a_full_disk_under_the_packers_is_one_line_and_reruns_to_the_same_bytes(prefect_harness, tmp_path, capsys):
    from flowhelpers import output_md5s

    targets = ("--target", "nvidia-packed", "--target", "habana-packed")
    clean = tmp_path / "clean"
    assert run_cli("--work-dir", clean, *targets, *SHORT) == 0
    w = tmp_path / "w"
    disks = [SmallDisk(w / "nvidia_packed", "1200k"), SmallDisk(w / "habana_packed", "300k")]
    try:
        for _ in range(2):  # nvidia-packed's disk fills first; then habana-packed's (the other stage is done)
            capsys.readouterr()
            rc = run_cli("--work-dir", w, *targets, *SHORT)
            err = capsys.readouterr().err
            lines = [ln for ln in err.splitlines() if ln.strip() and "WARNING" not in ln]
            assert rc == 2 and len(lines) == 1 and "no space left on the device while writing " in lines[0], err
            assert "Traceback" not in err
            full = disks[0] if "/nvidia_packed/" in lines[0] else disks[1]
            assert _files(full.where) == [], "partial output was left on the full disk"
            disks.remove(full)
            full.close()
    finally:
        for d in disks:
            d.close()
    assert run_cli("--work-dir", w, *targets, *SHORT) == 0
    assert output_md5s(w) == output_md5s(clean)


@pytest.mark.parametrize("packer", ["pack-nvidia", "pack-habana"])
def test_a_full_disk_under_a_packer_command_is_one_line(packer, tmp_path):
    import numpy as np

    from tests.preprocessing.habana.test_pack_habana import write_padded

    d = tmp_path / "in"
    d.mkdir()
    lengths = np.random.default_rng(5).integers(1, 129, 2500).tolist()
    write_padded(d / "part-00000-of-00500_training.hdf5", lengths, width=128, preds=20, seed=5)
    disk = SmallDisk(tmp_path / "small", "700k")
    try:
        out = disk.where / "o"
        argv = (["pack-nvidia", "--input_hdf5", str(d), "--output_hdf5", str(out), "--max_seq_length", "128",
                 "--shards_num", "8", "--workers", "2"] if packer == "pack-nvidia" else
                ["pack-habana", "--input_dir", str(d), "--output_dir", str(out), "--max_sequence_length", "128",
                 "--max_predictions_per_sequence", "20"])
        r = subprocess.run([sys.executable, "-m", "bertpipe", *argv, "-q"], cwd=ROOT, capture_output=True, text=True,
                           timeout=300)  # the real command, in a process of its own
        lines = [ln for ln in r.stderr.splitlines() if ln.strip() and " WARNING " not in ln]
        assert r.returncode == 2 and len(lines) == 1, r.stderr
        assert "no space left on the device while writing " in lines[0] and str(disk.where) in lines[0], r.stderr
        assert [f for f in _files(disk.where) if not f.endswith((".manifest.json", "_metadata.json"))] == []
    finally:
        disk.close()
