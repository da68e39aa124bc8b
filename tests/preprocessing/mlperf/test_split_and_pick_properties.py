"""Invariants: 4-bin split is an order-keeping partition; eval picks are deterministic and evenly spaced."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bertpipe.cli import main
from core.errors import InputError, RecordError
from core.schema import BIN_BOUNDS as BINS
from preprocessing.mlperf.pick_eval_samples import PickEvalConfig, pick_indices, run_pick_eval_samples
from preprocessing.mlperf.records import RecordShape, iter_batches
from preprocessing.mlperf.split_4bins import Split4BinsConfig, run_split_4bins, shard_sizes
from preprocessing.mlperf.tfrecord import (
    count_records,
    decode_example,
    encode_example,
    iter_records,
    write_records,
)

NAMES = [("input_ids", "i4"), ("input_mask", "i1"), ("segment_ids", "i1"), ("masked_lm_positions", "i4"),
         ("masked_lm_ids", "i4"), ("next_sentence_labels", "i1")]


def write_padded(path: Path, lengths: list[int], seed: int = 0) -> dict[str, np.ndarray]:
    """A small padded MLPerf HDF5 whose rows have the given lengths; input_ids[:, 1] = row number."""
    rng = np.random.default_rng(seed)
    n = len(lengths)
    data = {
        "input_ids": rng.integers(1, 30522, (n, 512), dtype=np.int32),
        "input_mask": (np.arange(512) < np.asarray(lengths, dtype=np.int64)[:, None]).astype(np.int8),
        "segment_ids": rng.integers(0, 2, (n, 512), dtype=np.int8),
        "masked_lm_positions": rng.integers(1, 512, (n, 76), dtype=np.int32),
        "masked_lm_ids": rng.integers(0, 30522, (n, 76), dtype=np.int32),
        "next_sentence_labels": rng.integers(0, 2, n, dtype=np.int8),
    }
    data["input_ids"][:, 1] = np.arange(n)
    with h5py.File(path, "w") as f:
        for name, dtype in NAMES:
            f.create_dataset(name, data=data[name], dtype=dtype)
    return data


def read_bins(out: Path, n_shards: int) -> dict[int, list[dict[str, np.ndarray]]]:
    """Every shard's datasets (six, zero-length in an empty shard), per bin, in shard order."""
    shards: dict[int, list[dict[str, np.ndarray]]] = {}
    for b in BINS:
        shards[b] = []
        for k in range(n_shards):
            with h5py.File(out / str(b) / f"part_{k}_of_{n_shards}.hdf5", "r") as f:
                shards[b].append({name: f[name][:] for name in f})
    return shards


lengths_st = st.lists(st.one_of(st.integers(1, 512), st.sampled_from([1, 128, 129, 256, 257, 384, 385, 512])),
                      min_size=1, max_size=60)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.lists(lengths_st, min_size=1, max_size=3), n_shards=st.integers(1, 7),
       chunk_rows=st.integers(1, 40))
def test_binning_is_an_order_keeping_partition(tmp_path_factory: pytest.TempPathFactory, files: list[list[int]],
                                              n_shards: int, chunk_rows: int) -> None:
    tmp = tmp_path_factory.mktemp("split")
    inputs, rows = [], []
    for i, lengths in enumerate(files):
        inputs.append(tmp / f"part-{i}.hdf5")
        data = write_padded(inputs[-1], lengths, seed=i)
        rows += [(length, data["input_ids"][r]) for r, length in enumerate(lengths)]
    m = run_split_4bins(inputs, tmp / "out", Split4BinsConfig(n_output_shards=n_shards, chunk_rows=chunk_rows))
    assert len(m.files) == 4 * n_shards  # all 4N files, always
    seen = 0
    for lo_hi, shards in zip([(1, 128), (129, 256), (257, 384), (385, 512)], read_bins(tmp / "out", n_shards).values(),
                                  strict=True):
        expected = [ids for length, ids in rows if lo_hi[0] <= length <= lo_hi[1]]  # in input order
        assert [len(s["input_ids"]) for s in shards] == shard_sizes(len(expected), n_shards)
        got = np.concatenate([s["input_ids"][:] for s in shards])
        assert len(got) == len(expected)
        for row, ids in zip(got, expected, strict=True):
            np.testing.assert_array_equal(row, ids)  # same row, same order
        for s in shards:
            lengths = s["input_mask"][:].sum(axis=1, dtype=np.int64)
            assert ((lengths >= lo_hi[0]) & (lengths <= lo_hi[1])).all()
        seen += len(got)
    assert seen == len(rows) == m.counters["rows"]


@pytest.mark.parametrize(("n_rows", "n_shards"), [(0, 4), (3, 4), (4, 4), (9, 4), (1, 1)])
def test_shard_sizes_follow_the_reference_rule(n_rows: int, n_shards: int) -> None:
    sizes = shard_sizes(n_rows, n_shards)
    assert len(sizes) == n_shards and sum(sizes) == n_rows
    assert sizes == sorted(sizes) and max(sizes) - min(sizes) <= 1


def test_small_and_empty_bins_do_not_crash(tmp_path: Path) -> None:
    """Reference: IndexError for 0 < rows < shards. Here: leading 0-row shards, with zero-length datasets."""
    write_padded(tmp_path / "part-0.hdf5", [10, 20, 300])  # bin 128: 2 rows, 256: none, 384: 1, 512: none
    m = run_split_4bins([tmp_path / "part-0.hdf5"], tmp_path / "out", Split4BinsConfig(n_output_shards=4))
    assert m.counters["empty_shards"] == 2 + 4 + 3 + 4
    shards = read_bins(tmp_path / "out", 4)
    assert [len(s["input_ids"]) for s in shards[128]] == [0, 0, 1, 1]
    assert [len(s["input_ids"]) for s in shards[256] + shards[512]] == [0] * 8
    assert [len(s["input_ids"]) for s in shards[384]] == [0, 0, 0, 1]


def test_every_shard_has_the_six_datasets(tmp_path: Path) -> None:
    """An empty shard has the six datasets with zero rows: same names, order, dtypes and widths as a full one
    (NVIDIA's, Habana's and Samsung's readers index f['input_ids'] and read it as length 0)."""
    from pretrain.data import inspect_shard

    write_padded(tmp_path / "part-0.hdf5", [10, 20, 300])
    run_split_4bins([tmp_path / "part-0.hdf5"], tmp_path / "out", Split4BinsConfig(n_output_shards=4))
    full = tmp_path / "out" / "128" / "part_3_of_4.hdf5"
    for b in BINS:
        for k in range(4):
            path = tmp_path / "out" / str(b) / f"part_{k}_of_4.hdf5"
            with h5py.File(path, "r") as f, h5py.File(full, "r") as g:
                assert list(f) == list(g) == sorted(name for name, _ in NAMES)
                n = f["input_ids"].shape[0]
                for name, dtype in NAMES:
                    assert f[name].dtype == np.dtype(dtype) and f[name].shape[1:] == g[name].shape[1:], (path, name)
                    assert f[name].shape[0] == n
            assert inspect_shard(path, None).rows == n


@pytest.mark.parametrize("workers", [1, 2])
def test_same_bytes_for_any_worker_count_and_chunk_size(tmp_path: Path, workers: int) -> None:
    """Counts, then shard groups written in parallel: the files are those of one process reading 4096 rows at a
    time (small shards built in memory), whatever the worker count, group cut, chunk size or HDF5 driver."""
    import preprocessing.mlperf.split_4bins as sp
    from core.manifest import md5_file

    rng = np.random.default_rng(7)
    inputs = []
    for i in range(4):  # rows of every bin in every file, one file with a single bin, small files
        n = [300, 7, 120, 1][i]
        lengths = rng.integers(1, 513, n).tolist() if i != 1 else [500] * n
        inputs.append(tmp_path / f"part-{i}.hdf5")
        write_padded(inputs[-1], lengths, seed=i)
    ref = run_split_4bins(inputs, tmp_path / "ref", Split4BinsConfig(n_output_shards=9))
    want = {f.name: f.md5 for f in ref.files}
    old = (sp.ROWS_PER_GROUP, sp.OPEN_SHARDS, sp.OPEN_INPUTS, sp.IN_MEMORY_BYTES)
    try:  # many groups, each writing shards in several sub-groups, re-opening inputs, straight to disk
        sp.ROWS_PER_GROUP, sp.OPEN_SHARDS, sp.OPEN_INPUTS, sp.IN_MEMORY_BYTES = 5, 2, 1, 0
        m = run_split_4bins(inputs, tmp_path / "par", Split4BinsConfig(n_output_shards=9, chunk_rows=13),
                            workers=workers)
    finally:
        sp.ROWS_PER_GROUP, sp.OPEN_SHARDS, sp.OPEN_INPUTS, sp.IN_MEMORY_BYTES = old
    assert {f.name: f.md5 for f in m.files} == want and len(want) == 36
    assert all(md5_file(tmp_path / "par" / name) == md5 for name, md5 in want.items())
    assert m.counters == ref.counters
    assert not [p for p in (tmp_path / "par").rglob(".*.tmp-*")]


def test_groups_cover_every_shard_once() -> None:
    from preprocessing.mlperf.split_4bins import Layout, group_count

    counts = [{"kind": "counts", "file": f"f{i}", "rows": 10, "chunk_rows": 4, "chunks": [[1, 2, 1, 0], [0, 0, 4, 0],
                                                                                            [1, 1, 0, 0]]}
              for i in range(3)]
    lay = Layout(counts, 5)
    assert lay.totals == [6, 9, 15, 0] and lay.rows == 30
    for n_groups in (1, 2, 3, 5, 9):
        groups = lay.groups(n_groups)
        assert [k for g in groups for k in range(g.k0, g.k1)] == list(range(5))
        for g in groups:  # a group reads only chunks holding its rows, in input order
            assert all(any(c[4][b] for b in range(4)) for c in g.chunks)
    assert group_count(10, 2048, 2) == 8 and group_count(0, 1, 4) == 1
    # full size: groups of 8 shards (32 files hashed side by side), not one shard (4 files of unequal size) a group
    assert group_count(156_725_653, 2048, 2) == 256 and group_count(156_725_653, 2048, 64) == 256
    assert group_count(742_380, 8, 1) == 1 and group_count(742_380, 8, 2) == 2  # one group a worker at least
    assert group_count(742_380, 64, 2) == 8 and group_count(10**8, 2048, 300) == 300  # at most one shard a group


def test_hdf5_missing_a_dataset(tmp_path: Path) -> None:
    write_padded(tmp_path / "part-0.hdf5", [10, 20])
    with h5py.File(tmp_path / "part-0.hdf5", "a") as f:
        del f["segment_ids"]
    with pytest.raises(InputError, match=r"part-0\.hdf5 has no dataset 'segment_ids'"):
        run_split_4bins([tmp_path / "part-0.hdf5"], tmp_path / "out", Split4BinsConfig(n_output_shards=2))
    assert main(["pack-varlength", "--input", str(tmp_path / "part-0.hdf5"), "--output", str(tmp_path / "v.hdf5")]) == 2
    assert not (tmp_path / "v.hdf5").exists()


def test_row_with_zero_length_is_refused(tmp_path: Path) -> None:
    write_padded(tmp_path / "part-0.hdf5", [10, 0, 20])
    with pytest.raises(RecordError, match=r"part-0\.hdf5: row 1 has sequence length 0"):
        run_split_4bins([tmp_path / "part-0.hdf5"], tmp_path / "out", Split4BinsConfig(n_output_shards=1))


def test_output_folder_with_foreign_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "in").mkdir()
    write_padded(tmp_path / "in" / "part-0.hdf5", [10, 200])
    out = tmp_path / "out"
    assert main(["split-4bins", "--input_dir", str(tmp_path / "in"), "--output_dir", str(out),
                 "--n_output_shards", "2"]) == 0
    assert main(["split-4bins", "--input_dir", str(tmp_path / "in"), "--output_dir", str(out),
                 "--n_output_shards", "2"]) == 0  # re-run into its own output: fine
    (out / "notes.txt").write_text("mine")
    assert main(["split-4bins", "--input_dir", str(tmp_path / "in"), "--output_dir", str(out),
                 "--n_output_shards", "2"]) == 2
    err = capsys.readouterr().err
    assert "already holds files that split-4bins would not write (notes.txt)" in err
    (out / "notes.txt").unlink()
    assert main(["split-4bins", "--input_dir", str(tmp_path / "in"), "--output_dir", str(out),
                 "--n_output_shards", "3"]) == 2  # a previous run with another N is foreign too
    assert "128/part_0_of_2.hdf5" in capsys.readouterr().err
    assert (out / "128" / "part_1_of_2.hdf5").exists()


# -- eval picks ----------------------------------------------------------------------------------
@given(n=st.integers(1, 5000), k=st.integers(1, 5000))
def test_picks_are_deterministic_sized_and_evenly_spaced(n: int, k: int) -> None:
    if k > n:
        return
    picks = pick_indices(n, k)
    assert picks == pick_indices(n, k) and len(picks) == k
    assert picks[0] == 0 and all(0 <= p < n for p in picks)
    gaps = np.diff(picks)
    assert (gaps >= 1).all()  # no record twice
    if len(gaps):
        assert gaps.max() - gaps.min() <= 1 and abs(gaps.mean() - n / k) < 1  # evenly spaced
    assert picks == [int(i * (n / k)) for i in range(k)]


def test_picked_records_are_the_source_records(golden: Path, tmp_path: Path) -> None:
    m = run_pick_eval_samples(golden / "eval_100.tfrecord", tmp_path, PickEvalConfig(num_examples_to_pick=7),
                              output_name="e.tfrecord")
    src = list(iter_records(golden / "eval_100.tfrecord"))
    assert list(iter_records(tmp_path / "e.tfrecord")) == [src[i] for i in pick_indices(100, 7)]
    assert m.counters == {"records_in": 100, "requested": 7, "picked": 7, "kept_all_records": 0}
    assert sum(len(b["input_ids"]) for _, b in iter_batches(tmp_path / "e.tfrecord", RecordShape())) == 7


def test_more_picks_than_records(golden: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "cli.tfrecord"
    assert main(["pick-eval-samples", "--input-tfrecord", str(golden / "eval_100.tfrecord"), "--output-tfrecord",
                 str(out), "--num-examples-to-pick", "101"]) == 2
    assert "holds 100 records, fewer than --num_examples_to_pick=101" in capsys.readouterr().err
    assert not out.exists()
    with pytest.raises(InputError):
        run_pick_eval_samples(golden / "eval_100.tfrecord", tmp_path / "s", PickEvalConfig(num_examples_to_pick=101))
    with caplog.at_level("WARNING"):
        m = run_pick_eval_samples(golden / "eval_100.tfrecord", tmp_path / "dag",
                                  PickEvalConfig(num_examples_to_pick=10000, allow_fewer=True))
    assert "keeping every record once" in caplog.text
    assert m.counters == {"records_in": 100, "requested": 10000, "picked": 100, "kept_all_records": 1}
    assert (tmp_path / "dag" / "eval_10k.tfrecord").read_bytes() == (golden / "eval_100.tfrecord").read_bytes()


def test_pick_validates_picked_records(golden: Path, tmp_path: Path) -> None:
    """A picked record that would not parse in the reference (FixedLenFeature) is refused, by index."""
    payloads = list(iter_records(golden / "eval_100.tfrecord"))[:10]
    ex = decode_example(payloads[5])
    payloads[5] = encode_example([(k, v, k == "masked_lm_weights") for k, v in ex.items() if k != "segment_ids"])
    write_records(tmp_path / "t.tfrecord", payloads)
    assert count_records(tmp_path / "t.tfrecord") == 10
    run_pick_eval_samples(tmp_path / "t.tfrecord", tmp_path / "ok", PickEvalConfig(num_examples_to_pick=3))  # 0 3 6
    with pytest.raises(RecordError, match=r"t\.tfrecord: record 5 has no feature 'segment_ids'"):
        run_pick_eval_samples(tmp_path / "t.tfrecord", tmp_path / "bad", PickEvalConfig(num_examples_to_pick=2))


# -- stage chaining: inputs verified against the upstream manifest --------------------------------
def test_chained_stages_verify_upstream(golden: Path, tmp_path: Path) -> None:
    from core.errors import ChecksumError, ManifestError
    from preprocessing.mlperf.tfrecord_to_hdf5 import run_tfrecord_to_hdf5
    from preprocessing.nvidia.varlength import run_pack_varlength

    picked = run_pick_eval_samples(golden / "sample.tfrecord", tmp_path / "pick", PickEvalConfig(num_examples_to_pick=50),
                                   output_name="eval.tfrecord")
    h5 = run_tfrecord_to_hdf5(tmp_path / "pick" / "eval.tfrecord", tmp_path / "h5", output_name="part-0.hdf5",
                              upstream=[picked])
    assert h5.upstream == {f"pick_eval_samples:{picked.key}": picked.digest}
    split = run_split_4bins([tmp_path / "h5" / "part-0.hdf5"], tmp_path / "bins", Split4BinsConfig(n_output_shards=1),
                            upstream=[h5])
    assert split.counters["rows"] == 50
    packed = run_pack_varlength([tmp_path / "h5" / "part-0.hdf5"], tmp_path / "var", upstream=[h5])
    assert packed.counters["rows"] == 50
    with pytest.raises(ManifestError, match="not listed in the upstream"):
        run_pack_varlength([golden / "eval_100.hdf5"], tmp_path / "var2", upstream=[h5])
    data = bytearray((tmp_path / "pick" / "eval.tfrecord").read_bytes())
    data[100] ^= 1
    (tmp_path / "pick" / "eval.tfrecord").write_bytes(bytes(data))
    with pytest.raises(ChecksumError, match="eval.tfrecord"):
        run_tfrecord_to_hdf5(tmp_path / "pick" / "eval.tfrecord", tmp_path / "h5", output_name="part-0.hdf5",
                             upstream=[picked])


def test_stage_key_ignores_execution_only_fields(tmp_path: Path) -> None:
    write_padded(tmp_path / "part-0.hdf5", [10, 200, 300, 500])
    keys = [run_split_4bins([tmp_path / "part-0.hdf5"], tmp_path / f"o{i}", cfg).key for i, cfg in enumerate(
        [Split4BinsConfig(n_output_shards=1, chunk_rows=1), Split4BinsConfig(n_output_shards=1, chunk_rows=99),
         Split4BinsConfig(n_output_shards=2)])]
    assert keys[0] == keys[1] != keys[2]
    assert (tmp_path / "o0" / "512" / "part_0_of_1.hdf5").read_bytes() == (tmp_path / "o1" / "512" /
                                                                          "part_0_of_1.hdf5").read_bytes()
