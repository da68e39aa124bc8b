"""A signal at the very end of a command (issue 33.8): after its work, while the process exits, SIGTERM and Ctrl-C
still give 143 / 130 in one line (or, once the exit's own cleanup has run, the command's code), never a death by
signal (-15 / -2, which is what the default handlers give once main() has returned).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "PYTHONPATH": str(ROOT), "BERTPIPE_PROGRESS": "0"}

# main() as the process's command line, then the signal sent by the process itself: after main() returned, before
# the interpreter's exit (deterministic, unlike a signal from outside)
LATE = """
import os, signal, sys
from bertpipe.cli import main
sig = sys.argv[2]
sys.argv = ["bertpipe", "status", "--work-dir", sys.argv[1]]
rc = main()
os.kill(os.getpid(), getattr(signal, sig))
sys.exit(rc)
"""


def _late(tmp_path: Path, sig: str) -> subprocess.CompletedProcess:
    (tmp_path / "w").mkdir(exist_ok=True)
    return subprocess.run([sys.executable, "-c", LATE, str(tmp_path / "w"), sig],
                          cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("sig,rc,word", [("SIGTERM", 143, "terminated (SIGTERM)"), ("SIGINT", 130, "interrupted")])
def test_a_signal_after_main_returned_exits_143_or_130_in_one_line(tmp_path, sig, rc, word):
    r = _late(tmp_path, sig)
    assert r.returncode == rc, (r.returncode, r.stderr[-2000:])
    assert r.stderr.strip().splitlines()[-1] == f"bertpipe status: {word} as it ended; its outputs are complete"
    assert "Traceback" not in r.stderr


def test_main_called_in_process_leaves_the_handlers_as_they_were(tmp_path):
    """A caller's main() (tests, embedding): the handlers it had come back; nothing is hooked to its exit."""
    from bertpipe.cli import main

    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)
    (tmp_path / "w").mkdir()
    main(["status", "--work-dir", str(tmp_path / "w"), "-q"])
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)) == before


def _habana_input(d: Path) -> Path:
    d.mkdir()
    rng = np.random.default_rng(0)
    lengths = rng.integers(8, 129, 600)
    mask = (np.arange(128) < lengths[:, None]).astype(np.int8)
    pos = np.zeros((600, 20), np.int32)
    for i, n in enumerate(lengths):
        pos[i, :3] = [1, 2, int(n) - 1]
    with h5py.File(d / "x_training_0.hdf5", "w") as f:
        f["input_ids"] = (rng.integers(1000, 30000, (600, 128)) * mask).astype(np.int32)
        f["input_mask"] = mask
        f["segment_ids"] = np.zeros((600, 128), np.int8)
        f["masked_lm_positions"] = pos
        f["masked_lm_ids"] = np.where(pos > 0, 2000, 0).astype(np.int32)
        f["next_sentence_labels"] = rng.integers(0, 2, 600).astype(np.int8)
    return d


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_pack_habana_signalled_at_its_very_end_is_never_killed_by_it(tmp_path, sig):
    """The signal as its last line is printed (and a little later): 143 / 130 in one line, or 0 once the exit's
    cleanup ran; never -15 / -2; the packs, metadata and manifest are there either way."""
    inp = _habana_input(tmp_path / "in")
    for k, delay in enumerate((0.0,)):
        out = tmp_path / f"out{k}"
        p = subprocess.Popen([sys.executable, "-m", "bertpipe", "pack-habana", "--input_dir", str(inp), "--output_dir",
                              str(out), "--max_sequence_length", "128", "--max_predictions_per_sequence", "20",
                              "--workers", "2"], cwd=tmp_path, env=ENV, stderr=subprocess.PIPE, text=True,
                             start_new_session=True)
        lines = []
        for line in p.stderr:
            lines.append(line)
            if "metadata:" in line:  # the command's last line
                time.sleep(delay)
                try:
                    os.kill(p.pid, sig)
                except ProcessLookupError:
                    pass
        p.wait(timeout=120)
        want = 143 if sig == signal.SIGTERM else 130
        assert p.returncode in (0, want), (delay, p.returncode, "".join(lines)[-2000:])
        assert not any("Traceback" in x for x in lines), "".join(lines)[-2000:]
        if p.returncode == want:
            assert "as it ended; its outputs are complete" in lines[-1], lines[-1]
        assert (out / "mixed_strategies_part_0.hdf5").is_file()
        assert out.with_name(f"{out.name}_metadata.json").is_file() and out.with_name(f"{out.name}.manifest.json").is_file()
