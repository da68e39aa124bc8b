"""--keep training: TFRecords and padded HDF5 are deleted once what reads them is done; status and verify say
so; a re-run rebuilds nothing; a stage that needs them again gets them rebuilt under the same keys."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from flowhelpers import FAST, last_run, output_md5s, run_cli

from bertpipe.cli import main
from core.manifest import MANIFEST_NAME


def _files(work: Path, stage: str) -> list[Path]:
    return [p for p in (work / stage).rglob("*") if p.is_file() and not p.name.startswith(("_", "."))]


def test_keep_training_drops_intermediates_and_rebuilds_them_on_demand(serial_run, three_part_text: Path,
                                                                       shared_data: Path, tmp_path: Path,
                                                                       capsys) -> None:
    _, serial = serial_run
    w = tmp_path / "w"
    base = ["--text-dir", three_part_text, "--vocab", shared_data / "vocab.txt", "--work-dir", w, *FAST]
    assert run_cli(*base, "--keep", "training") == 0
    for stage in ("tfrecord", "hdf5", "eval_tfrecord", "eval_10k"):
        assert _files(w, stage) == [], stage  # the data went, the manifests stayed
        assert list((w / stage).rglob(MANIFEST_NAME))
    # part i's TFRecord went as soon as part i's HDF5 was written, before the bins began (so the TFRecords never
    # all sit on disk at once); the padded HDF5, which the bins read, went after them
    bins = [p.stat().st_mtime_ns for p in (w / "bins").rglob("*.hdf5")]
    tf_dropped = [p.stat().st_mtime_ns for p in (w / "tfrecord").rglob("_dropped.json")]
    h5_dropped = [p.stat().st_mtime_ns for p in (w / "hdf5").rglob("_dropped.json")]
    assert len(tf_dropped) == len(h5_dropped) == 3 and bins
    assert max(tf_dropped) < min(bins) and min(h5_dropped) > max(bins)
    kept = {k: v for k, v in serial.items() if k.split("/")[0] in ("text", "vocab", "bins", "eval_hdf5")}
    assert output_md5s(w) == kept  # what training reads: the very bytes of a run that keeps everything
    summary = last_run(w)
    assert summary["stages"]["hdf5"]["dropped"] == 3 and {"train_dir", "eval_hdf5", "vocab"} <= set(summary["outputs"])

    capsys.readouterr()
    assert main(["status", "--work-dir", str(w)]) == 0
    out = capsys.readouterr().out
    assert "3 dropped" in out and "3 shards dropped by --keep training" in out
    assert main(["verify", "--work-dir", str(w)]) == 0
    assert "drop hdf5/" in capsys.readouterr().out

    assert run_cli(*base, "--keep", "training") == 0  # nothing needs them: nothing is rebuilt
    assert all(s["cached"] == s["calls"] for s in last_run(w)["stages"].values())
    assert _files(w, "hdf5") == []

    eval_file = Path(last_run(w)["outputs"]["eval_hdf5"])
    eval_file.unlink()  # eval_hdf5 must be redone: eval_10k's file, and first eval_tfrecord's, come back
    assert run_cli(*base) == 0  # keep=all: the rebuilt intermediates stay this time
    assert eval_file.is_file(), sorted(str(p) for p in eval_file.parent.parent.rglob("*"))
    assert output_md5s(w)[str(eval_file.relative_to(w))] == serial[str(eval_file.relative_to(w))]
    assert _files(w, "eval_10k") and _files(w, "eval_tfrecord") and _files(w, "hdf5") == []
    assert json.loads((w / "last_run.json").read_text())["outputs"]["eval_hdf5"] == str(eval_file)

    shutil.rmtree(Path(last_run(w)["outputs"]["train_dir"]))  # the bins need every part's HDF5 again
    assert run_cli(*base, "--keep", "training") == 0
    assert output_md5s(w) == kept and _files(w, "hdf5") == []  # rebuilt, used, dropped again: same bytes
