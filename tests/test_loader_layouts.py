"""The reference trainers find our data: split-4bins' output and `bertpipe export-dataset` trees, walked with
each trainer's discovery rule and read as each reads a shard (tests/loader_rules.py). The data DAG's own
train_dir is checked the same way in tests/flows/test_loader_layouts_dag.py."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from bertpipe.cli import build_parser, main
from tests.loader_rules import SIX, flat_training_files, mlperf_eval_files, rows_of, samsung_bins

N = 64  # shards per bin for 100 rows: most shards of every bin are empty


@pytest.fixture(scope="module")
def split_out(golden: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`bertpipe split-4bins` over eval_100.hdf5 (100 rows) into 4 x 64 shards."""
    d = tmp_path_factory.mktemp("split")
    (d / "h5").mkdir()
    shutil.copy(golden / "eval_100.hdf5", d / "h5" / "part-00000-of-00500.hdf5")
    assert main(["split-4bins", "--input_dir", str(d / "h5"), "--output_dir", str(d / "4bins"),
                 "--n_output_shards", str(N), "-q"]) == 0
    return d / "4bins"


def _work_dir(root: Path, bins: Path, golden: Path, shared_data: Path) -> Path:
    """A work dir as `bertpipe run` leaves it: bins/<key>/data/<bin>/..., eval HDF5, vocab, last_run.json."""
    work = root / "work"
    data = work / "bins" / "k1" / "data"
    shutil.copytree(bins, data)
    (work / "eval_hdf5" / "k2").mkdir(parents=True)
    shutil.copy(golden / "eval_100.hdf5", work / "eval_hdf5" / "k2" / "eval_10k.hdf5")
    (work / "vocab" / "k3").mkdir(parents=True)  # every output of a run lies in its work dir (last_run.json checks)
    shutil.copy(shared_data / "vocab.txt", work / "vocab" / "k3" / "vocab.txt")
    outputs = {"train_dir": str(data), "eval_hdf5": str(work / "eval_hdf5" / "k2" / "eval_10k.hdf5"),
               "vocab": str(work / "vocab" / "k3" / "vocab.txt")}
    (work / "last_run.json").write_text(json.dumps({"work_dir": str(work), "stages": {}, "outputs": outputs}))
    return work


def _export(*args: object) -> int:
    return main(["export-dataset", *map(str, args), "-q"])


# -- split-4bins (the reference's layout) ------------------------------------------------------------------
def test_split_output_holds_only_the_bin_folders(split_out: Path) -> None:
    assert sorted(p.name for p in split_out.iterdir()) == ["128", "256", "384", "512"]  # no manifest in there
    manifest = split_out.with_name(split_out.name + ".manifest.json")
    m = json.loads(manifest.read_text())
    assert m["stage"] == "split_4bins" and len(m["files"]) == 4 * N
    bins = samsung_bins(split_out)  # int(name) of every entry: a stray file would raise ValueError here
    assert [b for b, _ in bins] == [128, 256, 384, 512]
    assert all([Path(f).name for f in files] == sorted(f"part_{k}_of_{N}.hdf5" for k in range(N)) for _, files in bins)
    rows = [rows_of(f) for _, files in bins for f in files]
    assert sum(rows) == 100 and rows.count(0) > 0  # empty shards read as length 0


def test_every_shard_has_the_six_datasets(split_out: Path) -> None:
    import h5py

    for f in sorted(split_out.rglob("*.hdf5")):
        with h5py.File(f, "r") as h:
            assert sorted(h.keys()) == sorted(SIX), f
            n = h["input_ids"].shape[0]
            assert {h[k].shape[0] for k in SIX} == {n}
            assert h["input_ids"].shape[1:] == (512,) and h["masked_lm_ids"].shape[1:] == (76,), f


def test_samsung_rule_rejects_a_manifest_beside_the_bins(split_out: Path, tmp_path: Path) -> None:
    """The failure the layout avoids: a `_manifest.json` among the bins is a ValueError in Samsung's sort."""
    d = tmp_path / "bins"
    shutil.copytree(split_out, d)
    (d / "_manifest.json").write_text("{}")
    with pytest.raises(ValueError):
        samsung_bins(d)


# -- export-dataset -----------------------------------------------------------------------------------------
def test_export_samsung(split_out: Path, golden: Path, shared_data: Path, tmp_path: Path) -> None:
    work = _work_dir(tmp_path, split_out, golden, shared_data)
    out = tmp_path / "out"
    assert _export("--layout", "samsung", "--work-dir", work, out) == 0
    bins = samsung_bins(out / "train")
    assert [b for b, _ in bins] == [128, 256, 384, 512] and all(len(files) == N for _, files in bins)
    for b, files in bins:
        for f in files:
            assert Path(f).is_symlink() and Path(f).resolve() == (work / "bins/k1/data" / str(b) / Path(f).name).resolve()
    assert sum(rows_of(f) for _, files in bins for f in files) == 100
    evals = mlperf_eval_files(out / "eval")
    assert [Path(f).name for f in evals] == ["part_eval_10k.hdf5"] and rows_of(evals[0]) == 100
    assert (out / "vocab.txt").read_text() == (shared_data / "vocab.txt").read_text()
    assert json.loads((out / "bertpipe_export.json").read_text())["complete"] is True


@pytest.mark.parametrize("layout", ["nvidia-dle", "habana"])
def test_export_flat_layouts(layout: str, split_out: Path, golden: Path, shared_data: Path, tmp_path: Path) -> None:
    from pretrain.data import discover_shards

    work = _work_dir(tmp_path, split_out, golden, shared_data)
    out = tmp_path / "out"
    assert _export("--layout", layout, "--work-dir", work, out) == 0
    files = flat_training_files(out / "train")
    assert sorted(os.listdir(out / "train")) == [Path(f).name for f in files]  # nothing else in the flat folder
    rows = [rows_of(f) for f in files]
    assert sum(rows) == 100 and min(rows) > 0  # every non-empty shard, no empty one (RandomSampler refuses those)
    nonempty = sum(rows_of(f) > 0 for f in sorted((work / "bins/k1/data").rglob("*.hdf5")))
    assert len(files) == nonempty
    assert {Path(f).resolve().parent.name for f in files} <= {"128", "256", "384", "512"}
    assert [Path(f).name for f in mlperf_eval_files(out / "eval")] == ["part_eval_10k.hdf5"]
    assert sum(s.rows for ss in discover_shards(out / "train").values() for s in ss) == 100  # our trainer too


def test_export_refuses_a_foreign_folder_and_replaces_a_previous_export(split_out: Path, golden: Path,
                                                                       shared_data: Path, tmp_path: Path,
                                                                       capsys) -> None:
    work = _work_dir(tmp_path, split_out, golden, shared_data)
    out = tmp_path / "out"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert _export("--layout", "samsung", "--work-dir", work, out) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and str(out) in err and "--overwrite" in err
    assert sorted(os.listdir(out)) == ["notes.txt"]
    assert _export("--layout", "samsung", "--work-dir", work, out, "--overwrite") == 0
    assert (out / "notes.txt").read_text() == "mine" and len(samsung_bins(out / "train")) == 4

    assert _export("--layout", "nvidia-dle", "--work-dir", work, out) == 0  # a previous export: replaced, no flag
    assert flat_training_files(out / "train") and not any((out / "train" / str(b)).exists() for b in (128, 512))
    assert json.loads((out / "bertpipe_export.json").read_text())["layout"] == "nvidia-dle"
    assert not [p for p in out.iterdir() if p.name.startswith(".tmp-export-")]


def test_export_errors_are_one_line(split_out: Path, golden: Path, shared_data: Path, tmp_path: Path,
                                    capsys) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    capsys.readouterr()
    assert _export("--layout", "samsung", "--work-dir", empty, tmp_path / "o1") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "last_run.json" in err and "bertpipe run" in err

    work = _work_dir(tmp_path, split_out, golden, shared_data)
    for bad in (work / "exports", work / "bins/k1/data/128", ""):  # inside what it exports, or no folder at all
        assert _export("--layout", "samsung", "--work-dir", work, bad, "--overwrite") == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and "OUT" in err
    assert sorted(os.listdir(work / "bins/k1/data")) == ["128", "256", "384", "512"]
    (work / "bins/k1/data/256" / f"part_3_of_{N}.hdf5").unlink()
    assert _export("--layout", "nvidia-dle", "--work-dir", work, tmp_path / "o2") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "256" in err and not (tmp_path / "o2").exists()

    with pytest.raises(SystemExit) as exc:  # argparse: choices
        main(["export-dataset", "--layout", "tpu", str(tmp_path / "o3")])
    assert exc.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_export_help_and_default_work_dir() -> None:
    from preprocessing.params import DataParams

    p, _ = build_parser("export-dataset")
    text = p.format_help()
    assert all(w in text for w in ("samsung", "nvidia", "habana", "--work-dir", "--overwrite", "OUT"))
    assert p.parse_args(["--layout", "samsung", "x"]).work_dir == Path(DataParams().work_dir)


def test_no_layout_hands_padded_rows_to_a_variable_length_reader(split_out: Path, golden: Path, shared_data: Path,
                                                                  tmp_path: Path, capsys) -> None:
    """A run that built the 4-bin set only: the NVIDIA MLPerf and packed layouts refuse in one line naming the
    --target to build, and make nothing (NVIDIA's MLPerf reader would give padded rows an all-ones mask)."""
    work = _work_dir(tmp_path, split_out, golden, shared_data)
    for layout, target in (("nvidia", "--target nvidia-varlength"), ("nvidia-packed", "--target nvidia-packed"),
                           ("habana-packed", "--target habana-packed")):
        capsys.readouterr()
        assert _export("--layout", layout, "--work-dir", work, tmp_path / layout) == 2
        err = capsys.readouterr().err.strip()
        assert len(err.splitlines()) == 1 and target in err and "samsung-4bins" in err, err
        assert not (tmp_path / layout).exists()
    assert _export("--layout", "nvidia", "--target", "samsung-4bins", "--work-dir", work, tmp_path / "o") == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nvidia-4320 or nvidia-varlength or nvidia-2048" in err
