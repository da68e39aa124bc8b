"""`bertpipe demo` (the README's main job): the whole data DAG on the built-in sample, then a short training
run (slow: DeepSpeed's start-up)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import h5py
import pytest

from bertpipe.cli import main
from core.manifest import MANIFEST_NAME, verify_manifest


def articles(path: Path) -> list[str]:
    return [b for b in re.split(r"\n\n+", path.read_text(encoding="utf-8")) if b.strip()]


def test_demo_data_dag_on_the_builtin_sample(prefect_harness, tmp_path: Path, capsys) -> None:
    work = tmp_path / "demo"
    assert main(["demo", "--work-dir", str(work), "--no-train", "--workers", "1", "-q"]) == 0
    printed = capsys.readouterr().out
    out = json.loads((work / "last_run.json").read_text())["outputs"]
    assert out["train_dir"] in printed and out["eval_hdf5"] in printed
    # every stage of the DAG ran and its manifest verifies
    manifests = list(work.rglob(MANIFEST_NAME))
    stages = {m.relative_to(work).parts[0] for m in manifests}
    assert {"download", "extract", "text", "vocab", "tfrecord", "hdf5", "bins", "eval_tfrecord", "eval_10k",
            "eval_hdf5"} <= stages, stages
    for m in manifests:
        verify_manifest(m.parent)
    text = Path(out["text_dir"])
    train, test = articles(text / "part-00000-of-00500"), articles(text / "eval.txt")
    assert len(train) + len(test) == 51 and len(test) == 5
    assert any("As of 2026, almost every light is automatic, and many towers are museums." in a for a in train + test)
    vocab = Path(out["vocab"]).read_text(encoding="utf-8").splitlines()
    # at most the sample's 8,000 (the small corpus runs out of merges first), BERT's special-token ids
    assert 1000 < len(vocab) <= 8000 and len(set(vocab)) == len(vocab)
    assert [vocab[i] for i in (0, 100, 101, 102, 103)] == ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    rows = 0
    for shard in sorted(Path(out["train_dir"]).rglob("*.hdf5")):
        with h5py.File(shard, "r") as f:
            rows += len(f["input_ids"])
    assert rows > 500  # dupe 10 over 46 articles: 950 rows in the 4 bins
    with h5py.File(out["eval_hdf5"], "r") as f:
        assert len(f["input_ids"]) > 0 and f["input_ids"].shape[1] == 512

    before = {p: p.read_bytes() for p in Path(out["train_dir"]).rglob("*.hdf5")}
    assert main(["demo", "--work-dir", str(work), "--no-train", "--workers", "2", "-q"]) == 0
    assert "all stages cached" in capsys.readouterr().out
    assert {p: p.read_bytes() for p in Path(out["train_dir"]).rglob("*.hdf5")} == before


@pytest.mark.slow
def test_demo_with_training(prefect_harness, tmp_path: Path, capsys) -> None:
    pytest.importorskip("deepspeed")
    work = tmp_path / "demo"
    assert main(["demo", "--work-dir", str(work), "--max-steps", "4", "-q"]) == 0
    s = json.loads((work / "pretrain" / "summary.json").read_text())
    assert s["steps"] == 4 and s["world_size"] == 2 and s["device"] == "cpu"
    assert s["final_eval_mlm_accuracy"] is not None
    assert "eval MLM accuracy" in capsys.readouterr().out
    # the MLPerf log (mlperf-logging from PyPI is in the default install)
    assert s["mllog"] and Path(s["mllog"]).resolve() == (work / "pretrain" / "mllog.txt").resolve()
    assert '"key": "run_stop"' in (work / "pretrain" / "mllog.txt").read_text()


def test_demo_stands_for_run_e2e_with_the_sample_settings() -> None:
    import argparse

    from bertpipe.commands import demo
    from bertpipe.commands.run import train_options

    p = argparse.ArgumentParser()
    demo.add_arguments(p)
    ns = demo.run_args(p.parse_args([]))
    assert (ns.flow, ns.work_dir, ns.nproc, ns.max_steps, ns.source, ns.text_dir) == ("e2e", "work/demo", 2, 40, "sample", None)
    assert train_options(ns) == {"learning_rate": 0.05, "overwrite": True}  # a second demo re-trains from step 1
    assert demo.run_args(p.parse_args(["--no-train"])).flow == "data"


def test_the_quiet_console_filter() -> None:
    """Without -v the demo's console handlers pass warnings, errors and the training's own lines only."""
    import logging

    from bertpipe.commands.demo import QuietConsole

    def rec(level: int, msg: str) -> logging.LogRecord:
        return logging.LogRecord("prefect.task_runs", level, __file__, 1, msg, None, None)

    f = QuietConsole()
    relayed = "08:19:47 [rank0] INFO pretrain.train: step {}/40: loss 7.5131 lr 0.03947 11.0 seq/s"
    assert f.filter(rec(logging.WARNING, "preprocessing.mlperf.pick_eval_samples: holds only 125 records"))
    assert f.filter(rec(logging.ERROR, "pretrain/train.py [rank 0]: error: boom"))
    assert f.filter(rec(logging.INFO, relayed.format(10))) and not f.filter(rec(logging.INFO, relayed.format(11)))
    assert not f.filter(rec(logging.INFO, "Finished in state Completed()"))
    assert not f.filter(rec(logging.INFO, "[2026-11-25 07:59:49,433] [INFO] [launch.py:170:main] dist_world_size=2"))


@pytest.mark.slow
def test_demo_console_is_short_and_clean(tmp_path: Path) -> None:
    """`bertpipe demo` as a user runs it (its own temporary Prefect server, no test settings): at most 60
    lines, no traceback, no example dumps; the DeepSpeed launcher's output is in pretrain/launcher.log."""
    import os
    import subprocess
    import sys

    pytest.importorskip("deepspeed")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "BERTPIPE_"))}
    env.update(PREFECT_HOME=str(tmp_path / "prefect-home"), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    work = tmp_path / "demo"
    r = subprocess.run([str(Path(sys.executable).parent / "bertpipe"), "demo", "--work-dir", str(work)],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=900)
    assert r.returncode == 0, r.stdout[-5000:]
    lines = r.stdout.splitlines()
    assert len(lines) <= 60, r.stdout
    assert "Traceback" not in r.stdout and "*** Example ***" not in r.stdout, r.stdout
    assert "bertpipe demo: done" in r.stdout and "step 40/40" in r.stdout
    assert sum(line.startswith(name + " ") for line in lines for name in ("download", "tfrecord", "bins")) == 3
    log = (work / "pretrain" / "launcher.log").read_text(encoding="utf-8")
    assert "step 17/40" in log and "step 17/40" not in r.stdout  # the other step lines are in the log
