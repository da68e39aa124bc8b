"""bench/bench_scale.py end to end on a small part (slow): every step prints its breakdown (compute, md5, system
time, fsync waits), the split's 2 workers give the 1 worker's bytes, the projection is printed, and a target's stage
is timed through the DAG too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_scale_prints_each_steps_breakdown_and_the_projection(shared_data: Path, tmp_path: Path) -> None:
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", DS_ACCELERATOR="cpu")
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_scale.py"), "--real-part-only", "--real-mb",
                          "0.4", "--group", "2", "--shards", "16", "--only-stages", "nvidia_4320", "--memory", "free",
                          "--vocab",
                          str(shared_data / "vocab.txt"), "--keep-work", str(tmp_path / "w")],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert "a part, 2 in one group" in text
    assert text.count("= compute") >= 3 and "fsync waits" in text and "page faults" in text
    assert "bytes identical" in text
    assert "from CPU time:" in text and "from the DAG's stage seconds" in text
    assert (tmp_path / "w" / "real" / "fused" / "hdf5" / "part-00001-of-00500").is_dir()
    # the target pass through the DAG: the same run again with nvidia-varlength, its chop's seconds, projected
    assert "--target nvidia-varlength --nvidia-shards 1 (" in text
    chop = next(ln for ln in text.splitlines() if ln.startswith("  nvidia_4320 ") and "a part:" in ln)
    assert "= CPU " in chop and "1 files" in chop
    line = next(ln for ln in text.splitlines() if "--target nvidia-varlength " in ln and "by rows" in ln)
    assert "from the DAG's stage seconds +" in line
    summary = (tmp_path / "w" / "real-work" / "last_run.json").read_text()
    assert '"nvidia_4320"' in summary and '"bins"' in summary


@pytest.mark.slow
def test_bench_scale_prints_a_target_stages_floor_and_baseline(shared_data: Path, tmp_path: Path) -> None:
    """--targets-only: the chop's figures and its floor (its input read, its files' sizes written and hashed, in
    a child of its own), the floor projected per target, and with --base the same stage run with that tree's code
    (here this tree: every file the same); with --target-workers 2, its speed-up and the machine's busy cores;
    with --repeat 3, every run's CPU, their bytes compared, the median run reported."""
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", DS_ACCELERATOR="cpu")
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_scale.py"), "--targets-only", "--real-mb", "0.4",
                          "--only-stages", "nvidia_4320", "--memory", "free", "--vocab", str(shared_data / "vocab.txt"),
                          "--keep-work", str(tmp_path / "w"), "--base", str(ROOT), "--target-workers", "2",
                          "--repeat", "3"],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    line = next(ln for ln in text.splitlines() if "its floor, moving its bytes and nothing else" in ln)
    assert " + write its " in line and " + their md5s " in line and "x its floor" in line
    assert "its floor (reading, writing and hashing its bytes alone) +" in text
    assert not list((tmp_path / "w").rglob("floor-*"))  # the floor's files removed
    base = next(ln for ln in text.splitlines() if "against the baseline tree" in ln)
    assert "files IDENTICAL (every byte)" in base and "x it" in base
    assert (tmp_path / "w" / "targets" / "nvidia_4320.base").is_dir()
    # 2 workers against 1: the same bytes, and what the machine's cores did during each run
    assert "2 workers: " in text and "bytes identical" in text
    busy = next(ln for ln in text.splitlines() if "the machine's busy cores (/proc/stat)" in ln)
    assert "during the 1-worker run" in busy and "during the 2-worker run: at most" in busy
    assert "scratch as at full size (--scratch full-size): the full set's ~" in text
    # --repeat 3: three runs' CPU, the same bytes each time, the extra runs' outputs removed
    runs = next(ln for ln in text.splitlines() if "3 runs, each stage's in turn" in ln)
    cpus = [float(x) for x in runs.split(": ", 1)[1].split(" CPU-s")[0].split(", ")]
    assert len(cpus) == 3 and all(c > 0 for c in cpus)
    assert "bytes identical in every run" in runs and "the median run's figures below" in runs
    reported = next(ln for ln in text.splitlines() if ln.startswith("nvidia_4320 "))
    assert float(reported.split(" cpu ", 1)[1].split(" s", 1)[0]) == pytest.approx(sorted(cpus)[1], abs=0.006)
    assert not (tmp_path / "w" / "targets" / "nvidia_4320.r1").exists()


@pytest.mark.slow
def test_bench_scale_computes_a_packers_recipe_once_untimed(shared_data: Path, tmp_path: Path) -> None:
    """A packer's recipe (NNLS, from the lengths alone: once at full size) is computed in a first untimed run;
    the timed runs load it and count the CPU it took, so their own steps follow the memory fill directly."""
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", DS_ACCELERATOR="cpu")
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_scale.py"), "--targets-only", "--real-mb", "0.4",
                          "--only-stages", "nvidia_packed", "--memory", "free", "--vocab", str(shared_data / "vocab.txt"),
                          "--keep-work", str(tmp_path / "w"), "--repeat", "2"],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    assert "nvidia_packed: its packing recipe computed first, in an untimed run" in text
    targets = tmp_path / "w" / "targets"
    assert len(list((targets / "recipe-cache").glob("recipe_preprocessing.nvidia.pack_*.pkl"))) == 1
    assert not (targets / "nvidia_packed.warm").exists()
    runs = next(ln for ln in text.splitlines() if "2 runs, each stage's in turn" in ln)
    cpus = [float(x) for x in runs.split(": ", 1)[1].split(" CPU-s")[0].split(", ")]
    assert len(cpus) == 2 and all(0 < c < 30 for c in cpus) and "besides the recipe" in runs
    line = next(ln for ln in text.splitlines() if ln.startswith("nvidia_packed "))
    nnls = float(line.split("NNLS", 1)[1].split(" s in", 1)[0])
    rounds = int(line.split(" s in ", 1)[1].split(" round", 1)[0])
    recipe = float(line.split("the recipe in all", 1)[1].split(" s)", 1)[0])
    assert rounds >= 1 and 0 < nnls <= recipe  # the loaded run's figures, counted once
    assert "--target nvidia-packed     by rows   +" in text and "(recipe 0.0" in text


@pytest.mark.slow
def test_bench_scale_steady_times_a_stages_second_run_in_its_process(shared_data: Path, tmp_path: Path) -> None:
    """--steady: the timed run is the stage's second in its process (its first untimed, its output removed), with
    every buffer the first made ready (none made in it), the first run's CPU and peak printed beside it, the recipe
    counted once; the projection names each stage's once-a-process cost."""
    env = dict(os.environ, PREFECT_SERVER_ANALYTICS_ENABLED="false", DS_ACCELERATOR="cpu")
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_scale.py"), "--targets-only", "--real-mb", "0.4",
                          "--only-stages", "nvidia_packed,nvidia_4320", "--memory", "free", "--vocab",
                          str(shared_data / "vocab.txt"), "--keep-work", str(tmp_path / "w"), "--steady"],
                         env=env, cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    text = out.stdout
    targets = tmp_path / "w" / "targets"
    for what in ("nvidia_packed", "nvidia_4320"):
        line = next(ln for ln in text.splitlines() if ln.startswith(f"{what} "))
        steady = next(ln for ln in text.splitlines()[text.splitlines().index(line):] if "--steady: " in ln)
        first = float(steady.split("its first run took ", 1)[1].split(" CPU-s", 1)[0])
        assert first > 0 and "CPU-s once a process" in steady
        fig = json.loads((targets / f"{what}.json").read_text())
        assert fig["first_cpu"] == pytest.approx(first, abs=0.006)
        assert not (targets / f"{what}.first").exists()  # the first run's output removed
        # every buffer the timed run uses was made before it (pack-nvidia's groups' too, which its count and
        # scatter free in a plain second run); the peak printed is the first run's
        assert fig["steady_new_buffers"] == 0
        assert fig["first_peak_mb"] > 0 and "The peak RSS is the first run's" in steady
    packed = json.loads((targets / "nvidia_packed.json").read_text())
    assert packed["nnls_rounds"] >= 1 and 0 < packed["nnls_cpu"] <= packed["recipe_cpu"]  # once, not twice
    assert "(--steady: each stage's CPU from its second run in its process" in text
    assert "nvidia_packed " in text.split("(--steady: ", 1)[1]
