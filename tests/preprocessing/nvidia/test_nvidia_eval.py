"""pick-eval-samples-varlength = NVIDIA's pick_eval_samples_varlength.py: against the real script's output
(golden/nvidia_varlength, NumPy 1) and against the script re-enacted row by row on golden and made-up inputs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/preprocessing: the shared helpers
import nvidia_reference as ref  # noqa: E402

from core.errors import InputError  # noqa: E402
from preprocessing.nvidia.eval_pick import (  # noqa: E402
    DAG_STAGES,
    PickVarlenConfig,
    pick_eval_varlength_file,
    pick_rows,
    run_pick_eval_varlength,
)
from preprocessing.nvidia.md5 import hdf5_md5  # noqa: E402


def test_all_100_rows_equal_the_real_scripts_output(golden, tmp_path):
    """Picking 100 of eval_100.hdf5 keeps every row: the same file as NVIDIA's converter wrote (NumPy 1)."""
    real = golden / "nvidia_varlength" / "eval_100_varlength.numpy1.hdf5"
    m = run_pick_eval_varlength(golden / "eval_100.hdf5", tmp_path, PickVarlenConfig(num_examples_to_pick=100,
                                                                                       chunk_rows=9))
    ref.assert_same_content(tmp_path / "part_eval_10k.hdf5", real)
    assert hdf5_md5(tmp_path / "part_eval_10k.hdf5") == ref.hdf5_md5(real)
    assert m.counters == {"rows_in": 100, "picked": 100} and m.files[0].name == "part_eval_10k.hdf5"


@pytest.mark.parametrize("k", [1, 37, 99])
def test_subsets_equal_the_script(golden, tmp_path, k):
    theirs = ref.pick_eval_samples_varlength(str(golden / "eval_100.hdf5"), str(tmp_path / "ref"), k)
    pick_eval_varlength_file(golden / "eval_100.hdf5", tmp_path / "ours.hdf5",
                             PickVarlenConfig(num_examples_to_pick=k, chunk_rows=13))
    ref.assert_same_content(tmp_path / "ours.hdf5", theirs)


def test_every_length_from_1_to_512(tmp_path):
    lengths = list(range(1, 513)) + [512] * 5
    np.random.default_rng(7).shuffle(lengths)
    src = ref.write_padded(tmp_path / "eval_all.hdf5", ref.padded_rows(lengths, 7))
    theirs = ref.pick_eval_samples_varlength(str(src), str(tmp_path / "ref"), 300)
    pick_eval_varlength_file(src, tmp_path / "ours.hdf5", PickVarlenConfig(num_examples_to_pick=300, chunk_rows=64))
    ref.assert_same_content(tmp_path / "ours.hdf5", theirs)
    with h5py.File(tmp_path / "ours.hdf5", "r") as f:
        assert 512 in {len(r) for r in f["input_ids"][:]}


@pytest.mark.skipif(int(np.__version__.split(".")[0]) < 2, reason="the truncation happens under NumPy >= 2 only")
def test_the_scripts_sum_wraps_under_numpy2():
    """What the scripts do under NumPy 2: Python's sum() over an int8 row stays int8 and wraps (512 -> 0)."""
    import warnings

    row = np.ones(512, dtype=np.int8)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert sum(row) == 0  # the script's length of a full row: 0 tokens kept
    assert ref._sum_np1(row) == 512  # NumPy 1's result, which bertpipe keeps


def test_picks_and_refusals():
    assert pick_rows(10, 4).tolist() == [0, 2, 5, 7]
    assert pick_rows(5, 0).tolist() == [0, 1, 2, 3, 4]  # the DAG's "every row"
    with pytest.raises(InputError, match="would silently repeat rows"):
        pick_rows(3, 4, "eval_all.hdf5")


def test_cli_appends_hdf5_as_the_script_does(golden, tmp_path, monkeypatch):
    from bertpipe.cli import main

    monkeypatch.chdir(tmp_path)
    assert main(["pick-eval-samples-varlength", f"--input_hdf5_file={golden / 'eval_100.hdf5'}",
                 "--output_hdf5_file=part_eval_10k", "--num_examples_to_pick=100"]) == 0
    assert main(["pick-eval-samples-varlength", "--input-hdf5-file", str(golden / "eval_100.hdf5"),
                 "--output-hdf5-file", "named.hdf5", "--num-examples-to-pick", "50"]) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["named.hdf5", "part_eval_10k.hdf5"]
    assert main(["pick-eval-samples-varlength", f"--input_hdf5_file={golden / 'eval_100.hdf5'}",
                 "--output_hdf5_file=x", "--num_examples_to_pick=101"]) == 2
    assert not (tmp_path / "x.hdf5").exists()


def test_dag_declaration(golden, tmp_path):
    """The declared stage converts every row of eval_10k.hdf5 (the same rows NVIDIA's pick takes)."""
    from core.manifest import StageOutput
    from core.stage import Plan, Result

    up = tmp_path / "eval_hdf5"
    up.mkdir()
    (up / "eval_10k.hdf5").write_bytes((golden / "eval_100.hdf5").read_bytes())
    with StageOutput(up, "tfrecord_to_hdf5") as out:
        out.add_file("eval_10k.hdf5")
    res = Result(stage="eval_hdf5", key="key", dir=up, manifests={"": out.manifest})
    stage = DAG_STAGES[0]
    assert stage.when(type("P", (), {"targets": ("nvidia-4320",)})()) and not stage.when(type("P", (), {})())
    cfg = stage.configure(type("P", (), {"max_seq_length": 512, "max_predictions_per_seq": 76})())
    assert cfg.num_examples_to_pick == 0
    units = stage.plan(Plan(stage, None, cfg, "key", tmp_path, {"eval_hdf5": res}, {}))
    m = units[0].call()
    assert sorted(os.listdir(tmp_path / "nvidia_eval" / "key" / "eval_varlength")) == ["part_eval_10k.hdf5"]
    ref.assert_same_content(tmp_path / "nvidia_eval" / "key" / "eval_varlength" / "part_eval_10k.hdf5",
                            golden / "nvidia_varlength" / "eval_100_varlength.numpy1.hdf5")
    assert m.counters["picked"] == 100
