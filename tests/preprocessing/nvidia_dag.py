"""Run a declared stage of the data DAG (core/stage.py) as flows/dag.py does - plan, pieces, finish, until the
manifest - in this process, without the registry or Prefect: for stages declared but not yet wired."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from core.manifest import Manifest, StageOutput, load_manifest
from core.stage import Plan, Result, Stage


def part_hdf5_result(parts: list[Path], work: Path) -> Result:
    """The ``hdf5`` stage's result for these padded part files: one shard folder and manifest per part."""
    base = work / "hdf5" / "key"
    manifests = {}
    for p in parts:
        stem = p.name[:-len(".hdf5")]
        d = base / stem
        d.mkdir(parents=True)
        shutil.copyfile(p, d / p.name)
        with StageOutput(d, "tfrecord_to_hdf5") as out:
            out.add_file(p.name)
        manifests[stem] = out.manifest
    return Result(stage="hdf5", key="key", dir=base, manifests=manifests)


def folder_result(stage: str, folder: Path) -> Result:
    m = load_manifest(folder)
    assert m is not None, folder
    return Result(stage=stage, key="key", dir=folder, manifests={"": m})


def run_pieces(stage: Stage, results: dict[str, Result], work: Path, **params: Any) -> Manifest:
    p = SimpleNamespace(workers=1, targets=(), is_sample=False, n_output_shards=None, max_seq_length=512,
                        max_predictions_per_seq=76)
    for k, v in params.items():
        setattr(p, k, v)
    cfg = stage.configure(p)
    plan = Plan(stage, p, cfg, "key", work, results, {})
    values = [u.call() for u in stage.plan(plan)]
    if stage.finish is None:  # one unit, its manifest
        assert len(values) == 1 and isinstance(values[0], Manifest), values
        return values[0]
    while True:
        out = stage.finish(plan, list(values))
        if isinstance(out, Manifest):
            return out
        values += [u.call() for u in out]
