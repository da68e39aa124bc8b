"""One validation of HDF5 inputs (issue 33, item 4): the rules of preprocessing/hdf5_check.py, and both packers'
command lines refusing each bad value and each bad file kind in one line naming the file, the dataset and the row
(the generated cases of the issue: positions 600 and -1, segment id 300, negative ids, masks of 5 or with a gap,
NSP labels of 2; a dangling or looping link, a FIFO, a folder named like an input)."""

from __future__ import annotations

import os
from pathlib import Path

import h5py
import numpy as np
import pytest

from bertpipe.cli import main
from core.errors import RecordError
from preprocessing.hdf5_check import check_compact, check_padded, kind_problem
from tests.preprocessing.habana.test_pack_habana import write_padded

WIDTH, PREDS = 64, 12
LENGTHS = [10, 4, 20, 30, 2, 9, 17, 40]

#: name -> (dataset, row, how to break it, what the refusal says)
BAD = {
    "position-600": ("masked_lm_positions", 3, lambda f: f["masked_lm_positions"].__setitem__((3, 0), 600),
                     "position 600 outside the row's 30 tokens"),
    "position-minus-1": ("masked_lm_positions", 2, lambda f: f["masked_lm_positions"].__setitem__((2, 1), -1),
                         "position -1 outside"),
    "segment-300": ("segment_ids", 5, lambda f: f["segment_ids"].__setitem__((5, 3), 300 if f["segment_ids"].dtype.itemsize > 1 else 2),
                    "(expected 0 or 1)"),
    "negative-id": ("input_ids", 6, lambda f: f["input_ids"].__setitem__((6, 2), -7), "token id -7 outside"),
    "mask-5": ("input_mask", 0, lambda f: f["input_mask"].__setitem__((0, 1), 5), "value 5 (expected 0 or 1)"),
    "mask-gap": ("input_mask", 7, lambda f: f["input_mask"].__setitem__((7, 50), 1), "a 1 after a 0"),
    "nsp-2": ("next_sentence_labels", 4, lambda f: f["next_sentence_labels"].__setitem__(4, 2), "value 2"),
}


def _bad_file(path: Path, case: str) -> None:
    write_padded(path, LENGTHS, width=WIDTH, preds=PREDS, seed=3)
    with h5py.File(path, "r+") as f:
        if case == "segment-300" and f["segment_ids"].dtype.itemsize == 1:
            data = f["segment_ids"][:].astype(np.int32)
            del f["segment_ids"]
            f.create_dataset("segment_ids", data=data)
        BAD[case][2](f)


def test_the_sample_rows_pass(tmp_path):
    p = tmp_path / "good.hdf5"
    write_padded(p, LENGTHS, width=WIDTH, preds=PREDS, seed=3)
    with h5py.File(p, "r") as f:
        rows = {k: f[k][:] for k in f}
    seq = check_padded(p, 0, rows, vocab_size=30522)
    assert seq.tolist() == LENGTHS


@pytest.mark.parametrize("case", sorted(BAD))
def test_check_padded_names_dataset_and_row(case, tmp_path):
    p = tmp_path / "x.hdf5"
    _bad_file(p, case)
    with h5py.File(p, "r") as f:
        rows = {k: f[k][:] for k in f}
    with pytest.raises(RecordError) as e:
        check_padded(p, 100, rows)
    name, row, _, say = BAD[case]
    msg = str(e.value)
    assert f"dataset {name!r} row {100 + row}:" in msg and say in msg and str(p) in msg and "\n" not in msg


def test_check_compact_names_the_file_row_of_gathered_rows():
    seq = np.array([3, 4, 5])
    pred = np.array([1, 2, 1])
    pos = np.array([1, 2, 3, 9])  # the third row (5 tokens) has a position 9
    with pytest.raises(RecordError, match=r"'masked_lm_positions' row 70: position 9 outside the row's 5 tokens"):
        check_compact("f.hdf5", 0, seq, pred, pos=pos, row_ids=np.array([50, 60, 70]))
    check_compact("f.hdf5", 0, seq, pred, pos=np.array([1, 2, 3, 4]), ids=np.arange(12), seg=np.zeros(12, int))
    with pytest.raises(RecordError, match=r"'input_ids' row 1: token id 40 outside 0..29"):
        check_compact("f.hdf5", 0, seq, pred, ids=np.r_[np.zeros(4, int), [40], np.zeros(7, int)], vocab_size=30)


def _packer_argv(packer: str, d: Path, out: Path) -> list[str]:
    if packer == "pack-habana":
        return ["pack-habana", "--input_dir", str(d), "--output_dir", str(out), "--max_sequence_length", str(WIDTH),
                "--max_predictions_per_sequence", str(PREDS)]
    return ["pack-nvidia", "--input_hdf5", str(d), "--output_hdf5", str(out), "--max_seq_length", str(WIDTH),
            "--shards_num", "2"]


def _cli(argv: list[str], capsys) -> tuple[int, str]:
    capsys.readouterr()
    try:
        rc = main(argv)
    except SystemExit as exc:
        rc = exc.code
    return rc, capsys.readouterr().err.strip()


@pytest.mark.parametrize("packer", ["pack-habana", "pack-nvidia"])
@pytest.mark.parametrize("case", sorted(BAD))
def test_packers_refuse_bad_values_in_one_line(packer, case, tmp_path, capsys):
    d = tmp_path / "in"
    d.mkdir()
    name = "part-00000-of-00500_training.hdf5"
    _bad_file(d / name, case)
    argv = _packer_argv(packer, d, tmp_path / "o")
    rc, err = _cli(argv, capsys)
    lines = err.splitlines()
    ds, row, _, say = BAD[case]
    assert rc != 0 and len(lines) == 1, err
    if packer == "pack-nvidia" and case == "segment-300":  # its int8 store's range check speaks first
        assert f"row {row}: segment_ids holds a value outside int8" in lines[0] and name in lines[0], lines[0]
    elif not (packer == "pack-habana" and case in ("mask-5", "mask-gap")):  # a length check may speak first
        assert f"dataset {ds!r} row {row}:" in lines[0] and say in lines[0] and name in lines[0], lines[0]
    else:
        assert f"row {row}" in lines[0] and name in lines[0], lines[0]
    assert not list((tmp_path / "o").glob("*.hdf5")) if (tmp_path / "o").exists() else True


def _plant(d: Path, kind: str, name: str) -> None:
    p = d / name
    if kind == "dangling-link":
        os.symlink(d / "nowhere", p)
    elif kind == "looping-link":
        os.symlink(p, p)
    elif kind == "fifo":
        os.mkfifo(p)
    else:
        p.mkdir()


@pytest.mark.parametrize("packer", ["pack-habana", "pack-nvidia"])
@pytest.mark.parametrize("kind,say", [("dangling-link", "dangling symbolic link"),
                                      ("looping-link", "cannot be followed"), ("fifo", "FIFO"),
                                      ("folder", "is a folder")])
def test_packers_refuse_an_input_named_entry_that_is_no_file(packer, kind, say, tmp_path, capsys):
    d = tmp_path / "in"
    d.mkdir()
    write_padded(d / "part-00000-of-00500_training.hdf5", LENGTHS, width=WIDTH, preds=PREDS, seed=3)
    _plant(d, kind, "part-00001-of-00500_training.hdf5")
    assert kind_problem(d / "part-00001-of-00500_training.hdf5")
    argv = _packer_argv(packer, d, tmp_path / "o")
    rc, err = _cli(argv, capsys)
    lines = err.splitlines()
    assert rc == 2 and len(lines) == 1 and say in lines[0] and "part-00001-of-00500_training.hdf5" in lines[0], err
    assert not (tmp_path / "o").exists() or not any((tmp_path / "o").iterdir())


# -- cost is predictable (issue 33, item 5) -------------------------------------------------------------------------
@pytest.mark.parametrize("argv,say", [
    (["pack-nvidia", "--max_seq_length", "512", "--max_seq_per_sample", "5"],
     "--max_seq_per_sample 5 at --max_seq_length 512 makes 25,287,483 packing strategies"),
    (["pack-nvidia", "--max_seq_length", "512", "--max_seq_per_sample", "8"], "use --max_seq_per_sample 3 or less"),
    (["pack-habana", "--max_sequence_length", "512", "--max_sequences_per_pack", "4"],
     "--max_sequences_per_pack 4 at --max_sequence_length 512 makes 959,631 packing strategies"),
    (["pack-nvidia", "--max_seq_length", "64", "--shards_num", "100000"],
     "--shards_num 100,000: the inputs make"),
])
def test_flags_beyond_what_the_input_can_use_are_refused_before_work(argv, say, tmp_path, capsys):
    import time

    d = tmp_path / "in"
    d.mkdir()
    write_padded(d / "part-00000-of-00500_training.hdf5", LENGTHS, width=max(WIDTH, 64), preds=PREDS, seed=3)
    io = (["--input_dir", str(d), "--output_dir", str(tmp_path / "o")] if argv[0] == "pack-habana"
          else ["--input_hdf5", str(d), "--output_hdf5", str(tmp_path / "o")])
    t0 = time.monotonic()
    rc, err = _cli([*argv, *io], capsys)
    assert time.monotonic() - t0 < 30
    lines = err.splitlines()
    assert rc == 2 and len(lines) == 1 and say in lines[0], err
    assert not (tmp_path / "o").exists() or not [p for p in (tmp_path / "o").rglob("*")], "files were left"


def test_empty_shards_up_to_nvidias_count_are_still_written(tmp_path):
    from preprocessing.nvidia.pack import MAX_EMPTY_SHARDS_TO, check_shards

    check_shards(MAX_EMPTY_SHARDS_TO, 3)  # as NVIDIA's script: 3 packs in 4,320 shards
    check_shards(10**6, 10**6)
    with pytest.raises(Exception, match="use at most 4,320"):
        check_shards(MAX_EMPTY_SHARDS_TO + 1, 3)


# -- the same rules for every reader of padded rows (issue 33, item 4) ----------------------------------------------
READERS = {
    "chop-hdf5": lambda d, o: ["chop-hdf5", "--input_hdf5_dir", str(d), "--output_hdf5_dir", str(o), "--num_shards",
                               "2", "--max_seq_length", str(WIDTH), "--max_predictions_per_seq", str(PREDS)],
    "chop-hdf5-varlength": lambda d, o: ["chop-hdf5", "--input_hdf5_dir", str(d), "--output_hdf5_dir", str(o),
                                         "--num_shards", "2", "--max_seq_length", str(WIDTH),
                                         "--max_predictions_per_seq", str(PREDS), "--varlength"],
    "pack-varlength": lambda d, o: ["pack-varlength", "--input", str(d / "part-00000-of-00500.hdf5"), "--output",
                                    str(o / "x.hdf5"), "--max_seq_length", str(WIDTH), "--max_predictions_per_seq",
                                    str(PREDS)],
    "pick-eval-samples-varlength": lambda d, o: ["pick-eval-samples-varlength", "--input_hdf5_file",
                                                 str(d / "part-00000-of-00500.hdf5"), "--output_hdf5_file",
                                                 str(o / "eval.hdf5"), "--num_examples_to_pick", str(len(LENGTHS)),
                                                 "--max_seq_length", str(WIDTH), "--max_predictions_per_seq",
                                                 str(PREDS)],
}


@pytest.mark.parametrize("reader", sorted(READERS))
@pytest.mark.parametrize("case", ["position-600", "negative-id", "mask-5", "nsp-2", "segment-300"])
def test_every_reader_of_padded_rows_refuses_the_same_values(reader, case, tmp_path, capsys):
    d = tmp_path / "in"
    d.mkdir()
    (tmp_path / "o").mkdir()
    name = "part-00000-of-00500.hdf5"
    _bad_file(d / name, case)
    rc, err = _cli(READERS[reader](d, tmp_path / "o"), capsys)
    lines = err.splitlines()
    ds, row, _, say = BAD[case]
    assert rc == 2 and len(lines) == 1, err
    assert f"dataset {ds!r} row {row}:" in lines[0] and say in lines[0] and name in lines[0], lines[0]
    assert not [p for p in (tmp_path / "o").rglob("*.hdf5")], "an output was left"


def test_the_shuffle_refuses_compact_rows_by_the_same_rules(tmp_path):
    """shuffle-samples reads NVIDIA's variable-length rows: the compact form of the same rules."""
    with pytest.raises(RecordError, match=r"'segment_ids' row 12: value 3 \(expected 0 or 1\)"):
        check_compact("s.hdf5", 10, np.array([2, 3, 2]), np.array([1, 1, 1]), seg=np.array([0, 1, 0, 0, 1, 0, 3]))


@pytest.mark.parametrize("case", sorted(BAD))
def test_training_refuses_what_the_preprocessing_commands_refuse(case, tmp_path):
    """The same rules in train's batches and preflight (pretrain/data.py check_values; pretrain does not import
    preprocessing, so the rules live twice and this test holds them together): every generated bad row that the
    commands refuse, training refuses too, naming the same row. The one exception is a gap in input_mask, which
    the model reads as the mask it is (training checks values, not the prefix form)."""
    from core.errors import InputError
    from pretrain.data import check_values

    p = tmp_path / "x.hdf5"
    _bad_file(p, case)
    with h5py.File(p, "r") as f:
        rows = {k: f[k][:] for k in f}
    with pytest.raises(RecordError):
        check_padded(p, 0, rows)
    _, row, _, _ = BAD[case]
    if case == "mask-gap":
        return
    with pytest.raises(InputError, match=rf"bad training data in {p.name} row {row}\b"):
        check_values(rows, 30522, lambda i: f"{p.name} row {i}")
