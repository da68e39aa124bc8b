"""Golden tests of stages 8-10 against the reference's own outputs (../shared/data/golden)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from bertpipe.cli import main
from core.manifest import md5_file
from core.schema import BIN_BOUNDS as BINS
from preprocessing.mlperf.split_4bins import Split4BinsConfig, run_split_4bins
from preprocessing.mlperf.tfrecord_to_hdf5 import run_tfrecord_to_hdf5
from preprocessing.nvidia.varlength import run_pack_varlength

MLPERF_ORDER = ["input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
                "next_sentence_labels"]
GOLDEN_VERSIONS = ("3.14.0", "1.14.6")  # h5py / HDF5 that wrote the golden files (data/README.md)
SAME_HDF5 = (h5py.version.version, h5py.version.hdf5_version) == GOLDEN_VERSIONS
needs_golden_hdf5 = pytest.mark.skipif(not SAME_HDF5, reason=f"HDF5 bytes depend on the library: installed h5py "
                                       f"{h5py.version.version} / HDF5 {h5py.version.hdf5_version}, golden files "
                                       f"made with {GOLDEN_VERSIONS[0]} / {GOLDEN_VERSIONS[1]}")


def creation_order(f: h5py.File) -> list[str]:
    """Dataset names in the order their raw data lies in the file (= the order they were written)."""
    return sorted(f, key=lambda k: f[k].id.get_offset() or 0)


def assert_same_content(ours: Path, golden: Path, *, order: list[str] | None = None) -> None:
    with h5py.File(ours, "r") as a, h5py.File(golden, "r") as b:
        assert sorted(a) == sorted(b)
        if order is not None:
            assert creation_order(a) == creation_order(b) == order
        for k in b:
            da, db = a[k], b[k]
            assert (da.dtype, da.shape, da.chunks, da.compression) == (db.dtype, db.shape, db.chunks, db.compression), k
            assert da.id.get_create_plist().get_layout() == h5py.h5d.CONTIGUOUS or da.shape[0] == 0, k
            assert h5py.check_vlen_dtype(da.dtype) == h5py.check_vlen_dtype(db.dtype), k
            if h5py.check_vlen_dtype(db.dtype) is None:
                np.testing.assert_array_equal(da[:], db[:], err_msg=k)
            else:
                for i, (x, y) in enumerate(zip(da[:], db[:], strict=True)):
                    assert x.dtype == y.dtype and np.array_equal(x, y), f"{k} row {i}"


def test_pick_eval_samples_cli_is_byte_identical(golden: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval_100.tfrecord"
    assert main(["pick-eval-samples", f"--input_tfrecord={golden / 'sample.tfrecord'}",
                 f"--output_tfrecord={out}", "--num_examples_to_pick=100"]) == 0
    assert md5_file(out) == md5_file(golden / "eval_100.tfrecord")


@pytest.mark.parametrize("name", ["eval_100", "sample"])
def test_tfrecord_to_hdf5_matches_samsung(golden: Path, tmp_path: Path, name: str) -> None:
    m = run_tfrecord_to_hdf5(golden / f"{name}.tfrecord", tmp_path, output_name=f"{name}.hdf5")
    assert m.counters["records"] == {"eval_100": 100, "sample": 12606}[name]
    assert_same_content(tmp_path / f"{name}.hdf5", golden / f"{name}.hdf5", order=MLPERF_ORDER)
    assert m.file(f"{name}.hdf5").md5 == md5_file(tmp_path / f"{name}.hdf5")


@needs_golden_hdf5
@pytest.mark.parametrize("name", ["eval_100", "sample"])
def test_tfrecord_to_hdf5_bytes(golden: Path, tmp_path: Path, name: str) -> None:
    assert main(["tfrecord-to-hdf5", "--input", str(golden / f"{name}.tfrecord"), "--output",
                 str(tmp_path / "x.hdf5")]) == 0
    assert md5_file(tmp_path / "x.hdf5") == md5_file(golden / f"{name}.hdf5")


@pytest.fixture(scope="module")
def split8(golden: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("4bins")
    m = run_split_4bins([golden / "sample.hdf5"], out, Split4BinsConfig(n_output_shards=8, chunk_rows=1000))
    assert m.counters == {"rows": 12606, "rows_128": 1535, "rows_256": 1200, "rows_384": 663, "rows_512": 9208,
                          "empty_shards": 0}
    assert len(m.files) == 32
    return out


def test_split_4bins_matches_samsung_content(golden: Path, split8: Path) -> None:
    ours = sorted(p.relative_to(split8) for p in split8.rglob("*.hdf5"))
    theirs = sorted(p.relative_to(golden / "4bins") for p in (golden / "4bins").rglob("*.hdf5"))
    assert ours == theirs and len(ours) == 4 * 8
    assert {p.parent.name for p in ours} == {str(b) for b in BINS}
    for rel in ours:
        assert_same_content(split8 / rel, golden / "4bins" / rel)


@needs_golden_hdf5
def test_split_4bins_bytes(golden: Path, split8: Path) -> None:
    for p in (golden / "4bins").rglob("*.hdf5"):
        assert md5_file(split8 / p.relative_to(golden / "4bins")) == md5_file(p), p


def test_split_4bins_cli(golden: Path, tmp_path: Path) -> None:
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "part-00000-of-00500.hdf5").symlink_to(golden / "eval_100.hdf5")
    (tmp_path / "in" / "other.hdf5").symlink_to(golden / "sample.hdf5")  # not part*: ignored, as the reference
    assert main(["split-4bins", f"--input_dir={tmp_path / 'in'}", "--output-dir", str(tmp_path / "out"),
                 "--n_output_shards=2"]) == 0
    rows = 0
    for p in (tmp_path / "out").rglob("*.hdf5"):
        with h5py.File(p) as f:
            rows += f["input_ids"].shape[0]
    assert rows == 100


def test_pack_varlength_matches_nvidia_numpy1(golden: Path, tmp_path: Path) -> None:
    m = run_pack_varlength([golden / "eval_100.hdf5"], tmp_path)
    assert m.counters == {"rows": 100, "files": 1}
    assert_same_content(tmp_path / "eval_100.hdf5", golden / "nvidia_varlength" / "eval_100_varlength.numpy1.hdf5")


def test_pack_varlength_keeps_full_length_rows(golden: Path, tmp_path: Path) -> None:
    """The NumPy-2 pitfall: an int8 sum of a 512-token mask wraps to 0; full rows must stay 512 long."""
    assert main(["pack-varlength", "--input", str(golden / "eval_100.hdf5"), "--output", str(tmp_path / "v.hdf5")]) == 0
    with h5py.File(golden / "eval_100.hdf5") as src, h5py.File(tmp_path / "v.hdf5") as dst:
        full = np.flatnonzero(src["input_mask"][:].sum(axis=1, dtype=np.int64) == 512)
        assert full.size > 10
        assert all(len(dst["input_ids"][i]) == 512 for i in full)


def test_tfrecord_to_hdf5_cli_glob_to_directory(golden: Path, tmp_path: Path) -> None:
    (tmp_path / "tf").mkdir()
    for name in ("eval_100.tfrecord", "edge.tfrecord", "sample_128.tfrecord"):
        (tmp_path / "tf" / name).symlink_to(golden / name)
    out = tmp_path / "h5"
    assert main(["tfrecord-to-hdf5", "--input", str(tmp_path / "tf" / "e*.tfrecord"), "--output", f"{out}/"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["_manifest.json", "edge.tfrecord.hdf5", "eval_100.tfrecord.hdf5"]
    assert md5_file(out / "eval_100.tfrecord.hdf5") == md5_file(golden / "eval_100.hdf5") or not SAME_HDF5
    with h5py.File(out / "edge.tfrecord.hdf5") as f:
        assert f["input_ids"].shape == (538, 512)
    # 128-token records need the matching flags; with them the layout is (N, 128) / (N, 20)
    assert main(["tfrecord-to-hdf5", "--input", str(tmp_path / "tf" / "sample_128.tfrecord"), "--output",
                 str(tmp_path / "s128.hdf5"), "--max_seq_length=128", "--max-predictions-per-seq", "20"]) == 0
    with h5py.File(tmp_path / "s128.hdf5") as f:
        assert (f["input_ids"].shape, f["masked_lm_ids"].shape) == ((8362, 128), (8362, 20))


def test_tfrecord_to_hdf5_cli_directory_takes_part_files(golden: Path, tmp_path: Path) -> None:
    """As Samsung's run_trans_tfrecord_to_hdf5.sh: every file of the directory whose name contains "part"."""
    (tmp_path / "tf").mkdir()
    (tmp_path / "tf" / "part-00000-of-00500").symlink_to(golden / "eval_100.tfrecord")
    (tmp_path / "tf" / "eval.md5").write_text("not a TFRecord\n")
    assert main(["tfrecord-to-hdf5", "--input", str(tmp_path / "tf"), "--output", str(tmp_path / "h5")]) == 0
    assert sorted(p.name for p in (tmp_path / "h5").iterdir()) == ["_manifest.json", "part-00000-of-00500.hdf5"]
    assert_same_content(tmp_path / "h5" / "part-00000-of-00500.hdf5", golden / "eval_100.hdf5", order=MLPERF_ORDER)
