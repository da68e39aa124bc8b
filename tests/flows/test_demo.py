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


def test_demo_stands_for_run_e2e_with_the_sample_settings() -> None:
    import argparse

    from bertpipe.commands import demo
    from bertpipe.commands.run import train_options

    p = argparse.ArgumentParser()
    demo.add_arguments(p)
    ns = demo.run_args(p.parse_args([]))
    assert (ns.flow, ns.work_dir, ns.nproc, ns.max_steps, ns.source, ns.text_dir) == ("e2e", "work/demo", 2, 40, "sample", None)
    assert train_options(ns) == {"learning_rate": 0.05}
    assert demo.run_args(p.parse_args(["--no-train"])).flow == "data"
