"""bertpipe status / verify on a finished work dir, then on one with a corrupt and a missing output."""

from __future__ import annotations

import shutil
from pathlib import Path

from bertpipe.cli import main


def test_status_and_verify(serial_run, tmp_path: Path, capsys) -> None:
    src, _ = serial_run
    w = tmp_path / "w"
    shutil.copytree(src, w, symlinks=True)
    assert main(["status", "--work-dir", str(w)]) == 0
    out = capsys.readouterr().out
    assert "current" in out and "0 not done" in out and "tfrecord" in out
    assert main(["verify", "--work-dir", str(w)]) == 0
    tf = sorted(w.glob("tfrecord/*/part-00001-of-00500/part-00001-of-00500"))[0]
    tf.write_bytes(b"x" + tf.read_bytes()[1:])
    h5 = sorted(w.glob("hdf5/*/part-00000-of-00500"))[0]
    shutil.rmtree(h5)
    capsys.readouterr()
    assert main(["verify", "--work-dir", str(w)]) == 1
    out = capsys.readouterr().out
    assert "BAD  tfrecord/" in out and "md5 mismatch" in out
    assert main(["status", "--work-dir", str(w), "--md5"]) == 1
    out = capsys.readouterr().out
    assert "corrupt" in out and "missing" in out and "part-00000-of-00500" in out


def test_status_reports_the_training_run_apart_from_the_stages(tmp_path: Path, capsys) -> None:
    from preprocessing.manifest import StageOutput

    w = tmp_path / "w"
    with StageOutput(w / "text" / "k1", "text") as st, st.open("part-00000-of-00500") as f:
        f.write(b"one.\n\n")
    (w / "pretrain" / "checkpoints" / "20").mkdir(parents=True)  # DeepSpeed's files: no manifest
    assert main(["status", "--work-dir", str(w)]) == 0
    out = capsys.readouterr().out
    assert "1 outputs, 0 not done" in out and "pretrain/: no summary.json yet" in out
    (w / "pretrain" / "summary.json").write_text('{"steps": 20, "stopped_by": "max_steps", "final_loss": 7.5}')
    assert main(["status", "--work-dir", str(w)]) == 0
    assert "20 steps (max_steps), final loss 7.5" in capsys.readouterr().out
    assert main(["verify", "--work-dir", str(w)]) == 0
