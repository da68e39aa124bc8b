"""Several parts' fused tfrecord+hdf5 calls in one process, their files hashed together (tasks.calls.execute_group).

A group must leave exactly what the calls leave one at a time (the same files, manifests and result rows), take
the md5s of all its files in one md5_files call, and, when a call fails, keep the manifests of the calls before
it and write none for the failed one's unfinished files.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import core.manifest.output as output
from core.manifest import load_manifest, md5_file
from core.stage import Unit
from preprocessing.mlperf.create_pretraining_data import (
    CreatePretrainingDataConfig,
    run_create_pretraining_data,
)
from preprocessing.mlperf.tfrecord_to_hdf5 import HDF5Config, run_fused, run_tfrecord_to_hdf5
from tasks.calls import Call, execute, execute_group, groups

FLAGS = dict(max_seq_length=128, max_predictions_per_seq=20, dupe_factor=2)


def _parts(text_chain: Path, tmp: Path, n: int) -> list[Path]:
    """n small parts: different stretches of the golden text (whole documents)."""
    docs = text_chain.read_text(encoding="utf-8").split("\n\n")
    out = []
    for i in range(n):
        p = tmp / "text" / f"part-{i:05d}-of-00500"
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("\n\n".join(docs[i * 5:i * 5 + 5]).strip("\n") + "\n", encoding="utf-8")
        out.append(p)
    return out


def _call(text: Path, vocab: Path, root: Path) -> Call:
    name = text.name
    cfg = CreatePretrainingDataConfig(vocab_file=str(vocab), do_lower_case=True, **FLAGS)
    tf_dir = root / "tfrecord" / "k" / name
    tf = Unit(stage="tfrecord", key="k", shard=name, out_dir=str(tf_dir), run=run_create_pretraining_data,
              args=([str(text)],), kwargs={"cfg": cfg, "output_name": name})
    h5 = Unit(stage="hdf5", key="k", shard=name, out_dir=str(root / "hdf5" / "k" / name), run=run_tfrecord_to_hdf5,
              args=(str(tf_dir / name),), kwargs={"cfg": HDF5Config(max_seq_length=128, max_predictions_per_seq=20),
                                                  "output_name": name + ".hdf5"},
              upstream_dirs=(str(tf_dir),))
    return Call(units=(tf, h5), fused=run_fused)


def _tree(root: Path) -> dict[str, str]:
    """Every file under root: its md5 (manifests without their timings)."""
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.name.startswith((".", "_stat")):  # stat records: inodes, times
            if p.name == "_manifest.json":
                d = json.loads(p.read_text())
                d.pop("seconds", None)
                out[str(p.relative_to(root))] = json.dumps(d, sort_keys=True)
            else:
                out[str(p.relative_to(root))] = md5_file(p)
    return out


def _rows(rows: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in ("seconds", "cpu", "run_wait", "dir")} | {"manifest": {
        k: v for k, v in r["manifest"].items() if k != "seconds"}} for r in rows]


def test_a_group_leaves_what_the_calls_leave_one_by_one_hashing_once(golden, shared_data, tmp_path, monkeypatch):
    parts = _parts(golden / "text_chain" / "part-00000-of-00500", tmp_path, 3)
    vocab = shared_data / "vocab.txt"
    one = [row for p in parts for row in execute(_call(p, vocab, tmp_path / "one"))]
    hashed: list[tuple[int, bool]] = []
    real = output.md5_files

    def spy(paths, *, written=False):
        paths = list(paths)
        hashed.append((len(paths), written))
        return real(paths, written=written)

    monkeypatch.setattr(output, "md5_files", spy)
    grouped = execute_group([_call(p, vocab, tmp_path / "group") for p in parts])
    # the group's 6 files (3 TFRecords, 3 HDF5s) in one md5_files call, as the group's own outputs (mapped)
    assert hashed == [(6, True)]
    assert _tree(tmp_path / "one") == _tree(tmp_path / "group")
    assert _rows(one) == _rows(grouped)
    for r in grouped:  # every row's manifest is the one on disk, with its md5s
        m = load_manifest(r["dir"])
        assert json.loads(m.to_json()) == r["manifest"]
        assert all(f.md5 == md5_file(Path(r["dir"]) / f.name) for f in m.files)
    # a second group finds everything done and writes nothing
    again = execute_group([_call(p, vocab, tmp_path / "group") for p in parts])
    assert all(r["cached"] for r in again)


def test_a_failing_call_keeps_the_manifests_of_those_before_it(golden, shared_data, tmp_path):
    parts = _parts(golden / "text_chain" / "part-00000-of-00500", tmp_path, 3)
    parts[1].write_bytes(b"\xff\xfe not utf-8 \xff\n")  # part 1 fails in its TFRecord stage
    vocab = shared_data / "vocab.txt"
    calls = [_call(p, vocab, tmp_path / "w") for p in parts]
    with pytest.raises(Exception) as err:
        execute_group(calls)
    assert parts[1].name in str(err.value)
    done = load_manifest(calls[0].units[0].out_dir), load_manifest(calls[0].units[1].out_dir)
    assert all(m is not None for m in done), "part 0 was finished: its two manifests are written"
    assert all(f.md5 == md5_file(Path(calls[0].units[1].out_dir) / f.name) for f in done[1].files)
    assert load_manifest(calls[1].units[0].out_dir) is None and load_manifest(calls[1].units[1].out_dir) is None
    assert load_manifest(calls[2].units[0].out_dir) is None, "part 2 never ran"


@pytest.mark.parametrize(("n", "workers", "sizes"), [(9, 1, [4, 4, 1]), (9, 2, [4, 4, 1]), (4, 2, [2, 2]),
                                                      (3, 4, [1, 1, 1]), (1, 1, [1])])
def test_groups_never_leave_a_worker_idle(n, workers, sizes, tmp_path):
    calls = [Call(units=(), fused=run_fused) for _ in range(n)]
    assert [len(g) for g in groups(calls, workers)] == sizes


def test_calls_of_other_stages_run_alone():
    calls = [Call(units=()), Call(units=()), Call(units=(), fused=run_fused), Call(units=(), fused=run_fused)]
    assert [len(g) for g in groups(calls, 1)] == [1, 1, 2]


@pytest.mark.parametrize(("n", "slots", "least", "batches", "group"), [
    (4, 1, 1, [1, 1, 1, 1], 0),  # a small run: a Prefect task a shard, each part's 2 files hashed together
    (4, 1, 4, [4], 4),  # BERTPIPE_BATCH_MIN=4 (the bench): one task, the 4 parts' 8 files hashed together
    (500, 16, 1, [8] * 62 + [4], 4),  # 16 workers: batches of whole groups (before: 8 calls cut into 8 lone ones)
    (500, 2, 1, [64] * 7 + [52], 4),
    (9, 2, 1, [2, 2, 2, 2, 1], 0),
    (3, 4, 4, [3], 1),  # fewer parts than slots: groups of 1, each worker busy
])
def test_the_dags_batches_hold_whole_groups_of_fused_calls(n, slots, least, batches, group, monkeypatch):
    from types import SimpleNamespace

    from flows import dag as dag_mod
    from flows.dag import DataDag

    monkeypatch.setattr(dag_mod, "BATCH_MIN", least)
    dag = SimpleNamespace(_slots=lambda: slots, inline=False)
    calls = [Call(units=(), fused=run_fused) for _ in range(n)]
    got = DataDag._batches(dag, calls, "p")
    assert [len(b.calls) for b in got] == batches and {b.group for b in got} == {group}
    for b in got:  # as a batch runs on the local pool: groups of the stage's size, whatever the workers
        sizes = [len(g) for g in groups(b.calls, slots, b.group)]
        assert sum(sizes) == len(b.calls)
        if group:
            assert set(sizes) <= {group, len(b.calls) % group}
    other = DataDag._batches(dag, [Call(units=()) for _ in range(n)], "p")  # not fused: no groups
    assert {b.group for b in other} == {0}
