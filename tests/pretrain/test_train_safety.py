"""`bertpipe train` as a user kills, stops and restarts it: real 2-rank CPU DeepSpeed runs (slow).

* ``kill -9`` of the command's process group: no rank, launcher or launch.py is left within seconds, no
  checkpoint or metrics line is written after; then ``--resume`` with a damaged ``latest`` (a path out of
  checkpoints/) and a newer, incomplete tag resumes from the newest complete checkpoint and says so in one
  line, metrics.jsonl lists each step once, and a stale torch extension build lock is removed first;
* a second ``bertpipe train`` on a busy output dir is refused in one line naming the holder; SIGTERM during
  the final eval saves a checkpoint (its eval pending), and the resume runs that eval, once.

The fast counterparts (the same logic without DeepSpeed) are in test_checkpoint.py and test_run_safety.py.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")
psutil = pytest.importorskip("psutil")

from pretrain import checkpoint as ckpt  # noqa: E402
from pretrain.liveness import process_alive  # noqa: E402
from pretrain.metrics import read_metrics  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
EXTENSIONS = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or Path.home() / ".cache" / "torch_extensions")


def _argv(golden: Path, out: Path, *extra: str) -> list[str]:
    return ["train", "--train-dir", str(golden / "4bins"), "--output-dir", str(out), "--model", "tiny",
            "--device", "cpu", "--micro-batch", "4", "--nproc", "2", "--no-tensorboard", "--learning-rate", "0.05",
            *extra]


def _start(argv: list[str], log: Path, **env: str) -> subprocess.Popen:
    """`bertpipe ARGV` in a process group of its own, stdout and stderr into ``log`` (read after)."""
    f = open(log, "w")  # noqa: SIM115 - closed by the test's process end
    return subprocess.Popen([sys.executable, "-m", "bertpipe", *argv], cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "BERTPIPE_PROGRESS": "0",
                                 "TORCH_EXTENSIONS_DIR": str(EXTENSIONS), **env},
                            start_new_session=True, text=True)


def _wait_for(cond, proc: subprocess.Popen, what: str, timeout: float = 900.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if proc.poll() is not None:
            pytest.fail(f"the training ended (exit {proc.returncode}) before {what}")
        if time.monotonic() > deadline:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"never {what}")
        time.sleep(0.1)


def _training_pids(out: Path) -> list[int]:
    """Every process of a training into ``out``: DeepSpeed's runner, its launch.py and the ranks (their
    command lines name the output dir)."""
    pids = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if str(out) in " ".join(p.info["cmdline"] or []) and p.info["pid"] != os.getpid():
            pids.append(p.info["pid"])
    return pids


def _steps(out: Path) -> list[int]:
    return [r["step"] for r in read_metrics(out / "metrics.jsonl") if "loss" in r]


def test_kill_9_stops_every_rank_and_a_resume_with_a_damaged_latest_takes_the_newest_complete(golden, tmp_path):
    out = tmp_path / "run"
    proc = _start(_argv(golden, out, "--max-steps", "400", "--checkpoint-interval", "2"), tmp_path / "first.log")

    def past_a_checkpoint() -> bool:
        tag = ckpt.latest_tag(out)
        m = out / "metrics.jsonl"
        return tag is not None and int(tag) >= 4 and m.is_file() and len(_steps(out)) > int(tag)

    _wait_for(past_a_checkpoint, proc, "got past checkpoint 4")
    pids = _training_pids(out)
    assert len(pids) >= 4, pids  # runner, launch.py, 2 ranks
    os.killpg(proc.pid, signal.SIGKILL)  # the command and its process group (the launcher has its own session)
    proc.wait()
    t0 = time.monotonic()
    while any(process_alive(p) for p in pids) and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    gone_after = time.monotonic() - t0
    left = [p for p in pids if process_alive(p)]
    for p in left:
        os.kill(p, signal.SIGKILL)
    assert not left, f"still running {gone_after:.1f} s after kill -9: {left}"
    tags = sorted(p.name for p in ckpt.checkpoint_dir(out).iterdir())
    metrics = (out / "metrics.jsonl").read_bytes()
    time.sleep(5)
    assert sorted(p.name for p in ckpt.checkpoint_dir(out).iterdir()) == tags  # nothing written after
    assert (out / "metrics.jsonl").read_bytes() == metrics
    print(f"\nkill -9: {len(pids)} training processes gone within {gone_after:.2f} s")

    # what the user finds: `latest` damaged (a path out of checkpoints/), a newer tag whose save never finished
    newest = max(int(t) for _, t in ckpt.run_tags(out) if not ckpt.tag_problem(out, t))
    killed_before = max(_steps(out))
    assert killed_before > newest
    half = ckpt.checkpoint_dir(out) / str(newest + 100)
    shutil.copytree(ckpt.checkpoint_dir(out) / str(newest), half)
    (half / ckpt.COMPLETE_NAME).unlink()
    (ckpt.checkpoint_dir(out) / "latest").write_text("../../elsewhere")
    # and a build lock left by a training killed while it built DeepSpeed's op
    ext = tmp_path / "ext"
    if (EXTENSIONS / "deepspeed_shm_comm").is_dir():
        shutil.copytree(EXTENSIONS / "deepspeed_shm_comm", ext / "deepspeed_shm_comm",
                        ignore=shutil.ignore_patterns("lock"))
    baton = ext / "deepspeed_shm_comm" / "lock"
    baton.parent.mkdir(parents=True, exist_ok=True)
    baton.write_text("")
    os.utime(baton, (time.time() - 600, time.time() - 600))

    resumed = _start(_argv(golden, out, "--max-steps", "400", "--checkpoint-interval", "2", "--resume",
                           "--steps-this-run", "2"), tmp_path / "resume.log", TORCH_EXTENSIONS_DIR=str(ext))
    resumed.wait(timeout=1800)
    text = (tmp_path / "resume.log").read_text()
    assert resumed.returncode == 0, text[-3000:]
    notes = [ln for ln in text.splitlines() if "latest is damaged" in ln]
    assert len(notes) == 1, text[-3000:]  # one line (the ranks then find `latest` repaired)
    assert notes[0].startswith(f"{ckpt.checkpoint_dir(out) / 'latest'} is damaged (it holds '../../elsewhere', not a "
                               f"checkpoint tag): resuming from checkpoint {newest}, the newest complete one; newer, "
                               f"incomplete: {newest + 100} (no completion record: the save did not finish)"), notes
    assert notes[0].endswith("; checkpoints/latest now names it"), notes
    assert f"removed a stale torch extension build lock {baton}" in text and not baton.exists()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["steps"] == newest + 2 and summary["stopped_by"] == "steps_this_run"
    assert _steps(out) == list(range(1, newest + 3))  # each step once: the killed run's later steps are gone
    assert ckpt.latest_tag(out) == str(newest + 2) and not ckpt.tag_problem(out, str(newest + 2), md5=True)
    assert half.is_dir()  # newer than the run: left alone, overwritten when the run gets there
    assert not (tmp_path / "elsewhere").exists()


def _big_eval(golden: Path, path: Path, copies: int) -> Path:
    """eval_100.hdf5's rows ``copies`` times: an eval long enough to be interrupted."""
    import h5py
    import numpy as np

    with h5py.File(golden / "eval_100.hdf5") as src, h5py.File(path, "w") as dst:
        for k in src:
            dst.create_dataset(k, data=np.concatenate([src[k][:]] * copies))
    return path


def test_sigterm_during_the_final_eval_saves_a_checkpoint_and_a_busy_output_dir_is_refused(golden, tmp_path):
    out = tmp_path / "run"
    big = _big_eval(golden, tmp_path / "eval_4000.hdf5", 40)
    argv = _argv(golden, out, "--max-steps", "2", "--checkpoint-interval", "0", "--eval-file", str(big),
                 "--eval-batch-size", "1")
    proc = _start(argv, tmp_path / "first.log")
    _wait_for(lambda: (out / "launcher.log").is_file(), proc, "started the launcher")
    t0 = time.monotonic()
    second = subprocess.run([sys.executable, "-m", "bertpipe", *argv], cwd=ROOT, capture_output=True, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=120)
    lines = second.stderr.strip().splitlines()
    assert second.returncode == 2 and len(lines) == 1, second.stderr[-2000:]
    assert f"training output dir {out} is in use by pid {proc.pid} on {socket.gethostname()}" in lines[0]
    print(f"\nsecond train on a busy output dir refused in {time.monotonic() - t0:.1f} s: {lines[0]}")

    _wait_for(lambda: "step 2: evaluating 4000 samples" in (out / "launcher.log").read_text(), proc,
              "started the final eval")
    os.kill(proc.pid, signal.SIGTERM)
    proc.wait(timeout=600)
    text = (tmp_path / "first.log").read_text()
    assert proc.returncode == 143, text[-3000:]
    assert text.strip().splitlines()[-1] == f"training stopped by SIGTERM: checkpoint 2 saved in {out}; add --resume " \
                                            "to continue", text[-2000:]
    assert "step 2: eval stopped by SIGTERM" in text
    summary = json.loads((out / "summary.json").read_text())
    assert summary["stopped_by"] == "sigterm" and summary["eval_pending"] and summary["steps"] == 2
    assert ckpt.latest_tag(out) == "2" and not ckpt.tag_problem(out, "2", md5=True)
    assert not [r for r in read_metrics(out / "metrics.jsonl") if "eval_mlm_accuracy" in r]

    resumed = _start([*argv, "--resume", "--max-eval-samples", "400"], tmp_path / "resume.log")
    resumed.wait(timeout=1800)
    text = (tmp_path / "resume.log").read_text()
    assert resumed.returncode == 0, text[-3000:]
    assert "resumed from checkpoint 2 at step 2 (its eval, stopped by SIGTERM, runs first)" in text
    evals = [r for r in read_metrics(out / "metrics.jsonl") if "eval_mlm_accuracy" in r]
    assert [r["step"] for r in evals] == [2] and evals[0]["eval_masked_tokens"] > 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_eval_mlm_accuracy"] == evals[0]["eval_mlm_accuracy"] and not summary["eval_pending"]
    assert _steps(out) == [1, 2]


# --- bad data on one rank: every rank and the command end within 30 s, one line naming file and row (issue 33) ---

def _habana_packs(golden: Path, folder: Path, bad) -> tuple[Path, int]:
    """Two Habana packed files of the golden sample's first 240 rows; ``bad(arrays)`` edits the second file's
    packs (rank 1 reads that file). Returns (the second file, the packs in it)."""
    import h5py

    from core.schema import HDF5_FIELDS
    from pretrain.packing import best_fit_packs, pack_rows, sequence_lengths, write_habana

    with h5py.File(golden / "sample.hdf5") as f:
        rows = {k: f[k][:240] for k in HDF5_FIELDS}
    packed = pack_rows(rows, best_fit_packs(sequence_lengths(rows), 512, 3), 512)
    folder.mkdir()
    half = len(packed["input_ids"]) // 2
    first, second = ({k: v[:half] for k, v in packed.items()}, {k: v[half:] for k, v in packed.items()})
    bad(second)
    write_habana(folder / "mixed_strategies_part_0.hdf5", first)
    write_habana(folder / "mixed_strategies_part_1.hdf5", second)
    return folder / "mixed_strategies_part_1.hdf5", len(second["input_ids"])


def _padded_bins(golden: Path, folder: Path, bad) -> tuple[Path, int]:
    """The golden 4 bins with ``bad(arrays)`` applied to the last rows of 512/part_5_of_8 (rank 1's share, past
    the preflight's sample)."""
    import h5py

    shutil.copytree(golden / "4bins", folder)
    path = folder / "512" / "part_5_of_8.hdf5"
    with h5py.File(path, "a") as h:
        n = h["input_ids"].shape[0]
        arrays = {k: h[k][:] for k in h}
        bad(arrays, n)
        for k in h:
            h[k][...] = arrays[k]
    return path, n


def _negative_id(a):  # Habana packs with a negative token id in every pack of the file
    a["input_ids"][:, 2] = -5


def _mask_5(a):
    a["input_mask"][:, 1] = 5


def _position_600(a, n):
    a["masked_lm_positions"][n - 40:, 0] = 600


@pytest.mark.parametrize("case", ["habana negative id", "habana input_mask 5", "padded masked position 600"])
def test_bad_data_on_one_rank_ends_every_rank_and_the_command_within_30_s_in_one_line(golden, tmp_path, case):
    out = tmp_path / "run"
    if case.startswith("habana"):
        bad, packs = _habana_packs(golden, tmp_path / "packed", _negative_id if "negative" in case else _mask_5)
        argv = ["train", "--train-dir", str(tmp_path / "packed"), "--output-dir", str(out), "--model", "tiny",
                "--device", "cpu", "--micro-batch", "2", "--nproc", "2", "--no-tensorboard", "--max-steps", "400"]
        says = "input_ids holds the negative token id -5 (column 2)" if "negative" in case else "input_mask holds 5"
    else:
        bad, n = _padded_bins(golden, tmp_path / "4bins", _position_600)
        argv = _argv(tmp_path, out, "--max-steps", "4000", "--batch-mix", "one-bin")
        says = "masked_lm_positions holds 600 (column 0), outside the row's 512 columns"
    log = tmp_path / "train.log"
    proc = _start(argv, log)
    deadline = time.monotonic() + 1500
    seen = None
    while proc.poll() is None and time.monotonic() < deadline:
        if seen is None and (out / "launcher.log").is_file() and ": error: " in (out / "launcher.log").read_text():
            seen = time.monotonic()  # the first rank's error line
        if seen is not None and time.monotonic() - seen > 60:
            break
        time.sleep(0.1)
    pids = _training_pids(out)
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
        for p in pids:
            os.kill(p, signal.SIGKILL)
        pytest.fail(f"bertpipe train still runs {time.monotonic() - (seen or deadline):.0f} s after a rank's error: "
                    + log.read_text()[-3000:])
    took = time.monotonic() - seen if seen else 0.0
    text = log.read_text()
    assert proc.returncode == 2, text[-3000:]
    assert seen is not None and took < 30, (took, text[-3000:])
    errors = [ln for ln in text.splitlines() if "error" in ln.lower() or "Traceback" in ln]
    assert len(errors) == 1, text[-3000:]
    assert errors == [ln for ln in text.splitlines()[-1:]]  # the last line, nothing after it
    assert f"bad training data in {bad} row " in errors[0] and says in errors[0], errors
    assert not pids, f"left running: {pids}"
    print(f"\n{case}: the command ended {took:.1f} s after the rank's error line: {errors[0]}")
