"""bertpipe status / verify on a finished work dir, then on one with a corrupt and a missing output."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bertpipe.cli import main


def test_status_and_verify(serial_run, tmp_path: Path, capsys) -> None:
    src, _ = serial_run
    w = tmp_path / "w"
    shutil.copytree(src, w, symlinks=True)
    assert main(["status", "--work-dir", str(w)]) == 0
    out = capsys.readouterr().out
    assert "current" in out and "0 of the current data set not done" in out and "tfrecord" in out
    assert main(["verify", "--work-dir", str(w)]) == 0
    tf = sorted(w.glob("tfrecord/*/part-00001-of-00500/part-00001-of-00500"))[0]
    tf.write_bytes(b"x" + tf.read_bytes()[1:])  # same size, other md5
    capsys.readouterr()
    assert main(["status", "--work-dir", str(w)]) == 1  # without --md5: the edited file is re-hashed all the same
    out = capsys.readouterr().out
    assert "corrupt" in out and "md5 mismatch" in out and "part-00001-of-00500" in out
    h5 = sorted(w.glob("hdf5/*/part-00000-of-00500"))[0]
    shutil.rmtree(h5)
    assert main(["verify", "--work-dir", str(w)]) == 1
    out = capsys.readouterr().out
    assert "BAD  tfrecord/" in out and "md5 mismatch" in out
    assert main(["status", "--work-dir", str(w), "--md5"]) == 1
    out = capsys.readouterr().out
    assert "corrupt" in out and "missing" in out and "part-00000-of-00500" in out


def test_an_interrupted_older_attempt_does_not_make_the_data_set_not_done(serial_run, tmp_path: Path,
                                                                           capsys) -> None:
    """A stage dir of another key without a manifest (a failed attempt with other parameters) is reported
    as old debris, and status still says the current data set is complete (exit 0)."""
    src, _ = serial_run
    w = tmp_path / "w"
    shutil.copytree(src, w, symlinks=True)
    (w / "text" / "0123456789abcdef").mkdir()  # what a failed attempt with other parameters leaves
    assert main(["status", "--work-dir", str(w)]) == 0
    out = capsys.readouterr().out
    assert "0 of the current data set not done; 1 in older runs' outputs" in out
    assert "0123456789abcdef incomplete" in out and " old" in out


def test_verify_refuses_a_folder_that_is_not_a_work_dir(tmp_path: Path, capsys) -> None:
    (tmp_path / "some.txt").write_text("x")
    assert main(["verify", "--work-dir", str(tmp_path)]) == 2
    assert "holds no stage outputs" in capsys.readouterr().err
    (tmp_path / "last_run.json").write_text("[1, 2]")  # not a summary: ignored, not a traceback
    assert main(["status", "--work-dir", str(tmp_path)]) == 0


def test_status_reports_the_training_run_apart_from_the_stages(tmp_path: Path, capsys) -> None:
    from core.manifest import StageOutput

    w = tmp_path / "w"
    with StageOutput(w / "text" / "k1", "text") as st, st.open("part-00000-of-00500") as f:
        f.write(b"one.\n\n")
    (w / "pretrain" / "checkpoints" / "20").mkdir(parents=True)  # DeepSpeed's files: no manifest
    assert main(["status", "--work-dir", str(w)]) == 0
    out = capsys.readouterr().out
    assert "1 outputs" in out and "0 of the current data set not done" in out
    assert "pretrain/: no summary.json yet" in out
    (w / "pretrain" / "summary.json").write_text('{"steps": 20, "stopped_by": "max_steps", "final_loss": 7.5}')
    assert main(["status", "--work-dir", str(w)]) == 0
    assert "20 steps (max_steps), final loss 7.5" in capsys.readouterr().out
    assert main(["verify", "--work-dir", str(w)]) == 0


@pytest.mark.parametrize("text", ["[1, 2]", '"a string"', "3", '{"stages": 5}', "{not json"],
                         ids=["list", "string", "number", "bad-stages", "not-json"])
def test_a_damaged_last_run_json_is_one_warning(tmp_path: Path, text: str, capsys, caplog) -> None:
    """status (and verify) read last_run.json once: a summary that is not one is said once (issue 32)."""
    (tmp_path / "last_run.json").write_text(text)
    for command in ("status", "verify"):
        caplog.clear()
        main([command, "--work-dir", str(tmp_path)])
        said = [r for r in caplog.records if "is not a bertpipe run summary" in r.getMessage()]
        assert len(said) == 1, (command, [r.getMessage() for r in said])
