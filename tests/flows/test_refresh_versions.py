"""The refresh's gate, reuse and retention (issue 24.3, 24.4), in-process on the built-in sample (slow: a few
refreshes of the whole data DAG).

The gate sees every input: a data parameter (n_output_shards), the vocab, a stage's code version, a damaged
``latest``, ``force``; nothing changed → no rebuild. A new version reuses the previous one's outputs by hard link
(a change of n_output_shards runs only the bins; the older version keeps its bytes). ``keep_versions`` prunes
older and half-built versions, never ``latest`` nor one a training reads."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from flowhelpers import output_md5s

pytestmark = pytest.mark.slow

DATA = {"workers": 1, "n_output_shards": 2, "dupe_factor": 1, "keep": "all"}


def _ran(r: dict) -> dict[str, int]:
    return {k: v["calls"] - v["cached"] for k, v in r.get("stages", {}).items() if v["calls"] - v["cached"]}


def _refresh(root: Path, **kw):
    from flows.refresh_flow import refresh_flow

    return refresh_flow(datasets_dir=str(root), source="sample", **{"data": DATA, **kw})


def test_the_gate_sees_parameters_code_and_damage_and_reuses_the_rest(prefect_harness, tmp_path: Path,
                                                                      monkeypatch) -> None:
    root = tmp_path / "datasets"
    r1 = _refresh(root)
    assert r1["rebuilt"] and _ran(r1)["bins"] > 0
    v1 = root / "versions" / r1["version"]
    v1_files = output_md5s(v1)

    assert not _refresh(root)["rebuilt"]  # nothing changed

    # a data parameter: only the bins are cut again, everything else is hard links to v1
    r2 = _refresh(root, data={**DATA, "n_output_shards": 3})
    assert r2["rebuilt"] and r2["reason"].startswith("bins: its key is now"), r2["reason"]
    assert set(_ran(r2)) == {"bins"}, _ran(r2)
    assert r2["reused"] and r2["previous"] == r1["version"]
    v2 = root / "versions" / r2["version"]
    assert output_md5s(v1) == v1_files  # the older version keeps its bytes
    hdf5 = next(v2.glob("hdf5/*/*/*.hdf5"))
    assert os.stat(hdf5).st_nlink == 2 and os.path.samefile(hdf5, v1 / hdf5.relative_to(v2))
    bins = json.loads((v2 / "last_run.json").read_text())["stages"]["bins"]
    assert len(list(Path(bins["dir"], "data", "128").iterdir())) == 3
    assert [p.name for p in (v2 / "bins").iterdir()] == [bins["key"]]  # the unused linked key is gone
    assert r2["kept"] == [{"version": r2["version"], "why": "latest"},
                          {"version": r1["version"], "why": "one of the 2 newest complete versions"}]

    # the code version of a stage (its STAGE_VERSION)
    from dataclasses import replace

    from preprocessing import registry

    monkeypatch.setattr(registry, "STAGES", tuple(replace(s, version=s.version + "-next") if s.name == "eval_10k"
                                                  else s for s in registry.STAGES))
    r3 = _refresh(root, data={**DATA, "n_output_shards": 3}, keep_versions=1)
    assert r3["rebuilt"] and r3["reason"].startswith("eval_10k: its key is now"), r3["reason"]
    assert set(_ran(r3)) <= {"eval_10k", "eval_hdf5"} and "eval_10k" in _ran(r3), _ran(r3)
    assert {r["version"] for r in r3["removed"]} == {r1["version"], r2["version"]}  # keep_versions=1
    assert not v1.exists() and not v2.exists()
    monkeypatch.undo()

    # a damaged latest is never "unchanged": the damaged shard is rebuilt into a new version
    v3 = root / "versions" / r3["version"]
    monkeypatch.setattr(registry, "STAGES", tuple(replace(s, version=s.version + "-next") if s.name == "eval_10k"
                                                  else s for s in registry.STAGES))
    victim = next(v3.glob("tfrecord/*/*/part-*"))
    with open(victim, "r+b") as f:
        f.seek(100)
        f.write(b"\xff\xfe")
    r4 = _refresh(root, data={**DATA, "n_output_shards": 3}, keep_versions=1)
    assert r4["rebuilt"] and "md5 mismatch" in r4["reason"], r4["reason"]
    assert _ran(r4) == {"tfrecord": 1, "hdf5": 1}, _ran(r4)  # that shard only (TFRecord and HDF5: one fused call)
    v4 = root / "versions" / r4["version"]
    from tasks.workdir import check_dir

    assert check_dir((v4 / victim.relative_to(v3)).parent, check_md5=True)[0] == "done"
    assert not v3.exists()  # keep_versions=1: the damaged version went once latest had moved
    r5 = _refresh(root, data={**DATA, "n_output_shards": 3}, keep_versions=1, force=True)
    assert r5["rebuilt"] and r5["reason"] == "force=true" and not r5["reused"]
    assert all(v["cached"] == 0 for v in r5["stages"].values()), r5["stages"]


def test_keep_versions_never_removes_a_version_a_training_reads(prefect_harness, tmp_path: Path) -> None:
    from core.readlock import reading

    root = tmp_path / "datasets"
    r1 = _refresh(root, data={**DATA, "stages": ["text", "vocab"]})
    v1 = root / "versions" / r1["version"]
    (root / "versions" / "20000101T000000-deadbeef").mkdir()  # a half-built version of another request
    with reading(v1 / "text"):  # a training reads v1 (from a path inside it)
        r2 = _refresh(root, data={**DATA, "stages": ["text", "vocab"], "vocab_size": 1000}, keep_versions=1)
        assert r2["rebuilt"] and v1.is_dir()
        assert {"version": r1["version"], "why": "a training reads it (its read lock is held)"} in r2["kept"]
        assert [r["version"] for r in r2["removed"]] == ["20000101T000000-deadbeef"]
    r3 = _refresh(root, data={**DATA, "stages": ["text", "vocab"], "vocab_size": 1000}, keep_versions=1)
    assert not r3["rebuilt"] and [r["version"] for r in r3["removed"]] == [r1["version"]] and not v1.exists()
