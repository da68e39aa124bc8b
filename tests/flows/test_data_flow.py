"""The data flow end to end: golden bytes, cached re-runs that run nothing, one-shard redo, --only.

`bertpipe run` is called in-process (workers=1: the stage functions run in this process, so a
monkeypatched stage function proves that nothing ran) against a session-wide temporary Prefect server.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from flowhelpers import (
    FAST,
    assert_h5_equal,
    last_flow_run_task_states,
    last_run,
    manifest_mtimes,
    output_md5s,
    run_cli,
)

import preprocessing.mlperf.create_pretraining_data as cpd
import preprocessing.mlperf.pick_eval_samples as pick
import preprocessing.mlperf.split_4bins as bins
import preprocessing.mlperf.tfrecord_to_hdf5 as h5
import preprocessing.text.text_import as text_import

WORK_FUNCTIONS = [(cpd, "run_create_pretraining_data"), (h5, "run_tfrecord_to_hdf5"), (bins, "run_split_4bins"),
                  (pick, "run_pick_eval_samples"), (text_import, "run_import_text")]


def _forbid_work(monkeypatch: pytest.MonkeyPatch) -> None:
    def boom(*a, **k):
        raise AssertionError("a stage work function ran although its outputs were cached")

    for module, name in WORK_FUNCTIONS:
        monkeypatch.setattr(module, name, boom)


def test_golden_text_chain_then_everything_cached(prefect_harness, golden: Path, shared_data: Path,
                                                  tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    w = tmp_path / "w"
    args = ["--text-dir", golden / "text_chain", "--vocab", shared_data / "vocab.txt", "--work-dir", w,
            "--n-output-shards", "8", "--workers", "1"]
    assert run_cli(*args) == 0
    s = last_run(w)["stages"]
    part = "part-00000-of-00500"
    tf = Path(s["tfrecord"]["dir"]) / part / part
    assert tf.read_bytes() == (golden / "sample.tfrecord").read_bytes()  # 512/76/dupe 10, seed 12345
    assert s["tfrecord"]["instances"] == 12606
    assert_h5_equal(Path(s["hdf5"]["dir"]) / part / f"{part}.hdf5", golden / "sample.hdf5")
    golden_bins = sorted((golden / "4bins").rglob("*.hdf5"))
    assert len(golden_bins) == 32
    for g in golden_bins:
        assert_h5_equal(Path(last_run(w)["outputs"]["train_dir"]) / g.relative_to(golden / "4bins"), g)
    assert sorted(p.name for p in Path(last_run(w)["outputs"]["train_dir"]).iterdir()) == ["128", "256", "384", "512"]
    assert (Path(s["eval_hdf5"]["dir"]) / "eval_10k.hdf5").is_file()
    assert all(st["cached"] == 0 for st in s.values())

    before, md5s = manifest_mtimes(w), output_md5s(w)
    _forbid_work(monkeypatch)
    assert run_cli(*args) == 0
    s2 = last_run(w)["stages"]
    assert set(s2) == set(s) and all(st["cached"] == st["calls"] for st in s2.values())
    assert manifest_mtimes(w) == before and output_md5s(w) == md5s


def test_one_broken_shard_is_redone_alone(serial_run, three_part_text: Path, shared_data: Path,
                                          tmp_path: Path) -> None:
    src, md5s = serial_run
    w = tmp_path / "w"
    shutil.copytree(src, w, symlinks=True)
    s = last_run(w)["stages"]
    assert s["tfrecord"]["calls"] == 3 and s["hdf5"]["calls"] == 3
    tf1 = Path(s["tfrecord"]["dir"].replace(str(src), str(w))) / "part-00001-of-00500" / "part-00001-of-00500"
    data = bytearray(tf1.read_bytes())
    data[100] ^= 0xFF  # same size, other md5
    tf1.write_bytes(bytes(data))
    h2 = Path(s["hdf5"]["dir"].replace(str(src), str(w))) / "part-00002-of-00500" / "part-00002-of-00500.hdf5"
    h2.unlink()
    before = manifest_mtimes(w)
    args = ["--text-dir", three_part_text, "--vocab", shared_data / "vocab.txt", "--work-dir", w, *FAST]
    assert run_cli(*args) == 0
    changed = {k for k, t in manifest_mtimes(w).items() if before.get(k) != t}
    assert {k.split("/")[0] + "/" + k.split("/")[2] for k in changed} == {
        "tfrecord/part-00001-of-00500", "hdf5/part-00002-of-00500"}
    assert output_md5s(w) == md5s  # the same bytes again
    s2 = last_run(w)["stages"]
    assert (s2["tfrecord"]["cached"], s2["hdf5"]["cached"], s2["bins"]["cached"]) == (2, 2, 1)
    for name in ("tfrecord", "hdf5"):  # where each redone stage's seconds went: CPU, waits for a core, the rest
        st = s2[name]
        assert 0 < st["cpu_seconds"] and 0 <= st["run_wait_seconds"] <= st["seconds"], st
    redone = s2["tfrecord"]["redone"] + s2["hdf5"]["redone"]  # the run says why it redid them
    assert any(r.startswith("part-00001-of-00500: md5 mismatch for ") for r in redone), redone
    assert any(r.startswith("part-00002-of-00500: ") and "part-00002-of-00500.hdf5 is missing" in r for r in redone)
    runs = last_run(w)["task_runs"]  # Prefect task runs submitted, per (chained) stage
    # the bins (same inputs: cached) are found done in the flow itself: a stage written as pieces needs no task
    assert 1 <= runs["tfrecord+hdf5"] <= 3 and "bins" not in runs, runs
    assert last_run(w)["wall_seconds"] > 0
    states = last_flow_run_task_states()  # Prefect's view: the untouched shards hit its cache
    assert states["tfrecord+hdf5[part-00001-of-00500]"] == "Completed"
    assert states["tfrecord+hdf5[part-00002-of-00500]"] == "Completed"
    assert states["tfrecord+hdf5[part-00000-of-00500]"] == "Cached" and "bins" not in states


def test_only_runs_a_stage_and_what_it_needs(prefect_harness, three_part_text: Path, shared_data: Path,
                                             tmp_path: Path, capsys) -> None:
    """--only X runs X and whatever X reads that is not done; last_run.json always names the whole data set
    that is done (train_dir, eval_hdf5, vocab), even after a run of one stage."""
    w = tmp_path / "w"
    base = ["--text-dir", three_part_text, "--vocab", shared_data / "vocab.txt", "--work-dir", w, *FAST]
    assert run_cli(*base, "--only", "text") == 0
    assert sorted(p.name for p in w.iterdir() if p.is_dir()) == ["text"]
    assert run_cli(*base, "--only", "create-pretraining-data") == 0  # the library's name works too
    assert sorted(p.name for p in w.iterdir() if p.is_dir()) == ["text", "tfrecord", "vocab"]
    assert run_cli(*base, "--only", "bins") == 0  # hdf5 (not done) runs too, tfrecord is found done
    s = last_run(w)["stages"]
    assert (s["tfrecord"]["cached"], s["hdf5"]["cached"], s["bins"]["cached"]) == (3, 0, 0)
    assert "eval_hdf5" not in last_run(w)["outputs"]  # the eval branch was never run
    assert run_cli(*base) == 0
    full = last_run(w)["outputs"]
    assert run_cli(*base, "--only", "bins") == 0
    assert last_run(w)["outputs"] == full  # train_dir, eval_hdf5, vocab, text_dir: the whole data set
    assert set(last_run(w)["stages"]) == {"text", "vocab", "tfrecord", "hdf5", "bins", "eval_tfrecord", "eval_10k",
                                           "eval_hdf5"}
    capsys.readouterr()
    assert run_cli(*base, "--only", "download") == 2
    assert "not part of this run (--text-dir was given)" in capsys.readouterr().err
    assert run_cli(*base, "--only", "nonsense") == 2
    assert "--only: unknown stage 'nonsense'; the data stages are: download, extract, text" in capsys.readouterr().err


def test_an_error_inside_the_dag_names_the_cli_flag(prefect_harness, tmp_path: Path, capsys) -> None:
    """The same error as in a deployment run (test_refresh: data.num_test_articles), spelled for the CLI."""
    assert run_cli("--work-dir", tmp_path / "w", "--only", "text", "--num-test-articles", "10000",
                   "--workers", "1") == 2
    err = capsys.readouterr().err
    assert "lower --num-test-articles" in err and err.count("\n") == 1
