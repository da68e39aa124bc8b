"""The data DAG writes part i's TFRecord and padded HDF5 in one fused call (Stage.fused) when both are due, and
the separate hdf5 stage (``--force hdf5``: only the HDF5 is due) remakes exactly the same files and manifests."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from flowhelpers import FAST, manifest_mtimes, output_md5s, run_cli

import preprocessing.mlperf.tfrecord_to_hdf5 as h5
from preprocessing.mlperf import cpd_fast


def _hdf5_manifests(work: Path) -> dict[str, dict]:
    out = {}
    for p in sorted((work / "hdf5").rglob("_manifest.json")):
        d = json.loads(p.read_text(encoding="utf-8"))
        d.pop("seconds")
        out[p.relative_to(work).as_posix()] = d
    return out


@pytest.mark.skipif(not cpd_fast.available(), reason="the C extension cannot be built here")
def test_dag_fuses_tfrecord_and_hdf5_and_force_hdf5_remakes_the_same(prefect_harness, three_part_text: Path,
                                                                      shared_data: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    fused_calls: list[str] = []
    real = h5._fused_hdf5

    def counting(engine, n, src, *a, **k):
        fused_calls.append(src.name)
        return real(engine, n, src, *a, **k)

    monkeypatch.setattr(h5, "_fused_hdf5", counting)
    w = tmp_path / "w"
    args = ["--text-dir", three_part_text, "--vocab", shared_data / "vocab.txt", "--work-dir", w, *FAST]
    assert run_cli(*args) == 0  # workers=1: the calls run in this process
    assert sorted(fused_calls) == [f"part-{i:05d}-of-00500" for i in range(3)]
    md5s, manifests = output_md5s(w), _hdf5_manifests(w)
    assert len(manifests) == 3
    mtimes = manifest_mtimes(w)

    def boom(*a, **k):
        raise AssertionError("only the hdf5 stage was due: the fused call must not run")

    monkeypatch.setattr(h5, "_fused_hdf5", boom)
    assert run_cli(*args, "--force", "hdf5") == 0
    assert output_md5s(w) == md5s
    assert _hdf5_manifests(w) == manifests
    redone = {k for k, t in manifest_mtimes(w).items() if t != mtimes[k]}
    assert {k.split("/")[0] for k in redone} == {"hdf5"} and len(redone) == 3  # the separate stage ran, alone
