"""Binned HDF5 batches: layout, rank sharding, bin-bound slicing, resumable order, bad inputs."""

from __future__ import annotations

import shutil

import h5py
import numpy as np
import pytest

from core.errors import InputError
from core.schema import HDF5_FIELDS as FIELDS
from pretrain.data import BinnedSampler, PrefetchingSampler, check_values, discover_shards
from pretrain.evaluate import EvalSet, evaluate


@pytest.fixture(scope="module")
def bins(golden):
    return discover_shards(golden / "4bins")


def test_discovers_the_golden_4bins(bins):
    assert sorted(bins) == [128, 256, 384, 512]
    assert {b: sum(s.rows for s in ss) for b, ss in bins.items()} == {128: 1535, 256: 1200, 384: 663, 512: 9208}
    assert all(len(ss) == 8 for ss in bins.values())


def test_batches_are_sliced_to_their_bin_and_rows_fit(bins):
    s = BinnedSampler(bins, micro_batch=4, rank=0, world=2, seed=1, vocab_size=30522)
    seen = set()
    for _ in range(60):
        b = s.next_batch()
        seen.add(b.bound)
        assert b.arrays["input_ids"].shape == (4, b.bound)
        lengths = b.arrays["input_mask"].sum(axis=1)
        assert (lengths <= b.bound).all() and (lengths > b.bound - 128).all()
        assert b.arrays["masked_lm_positions"].shape == (4, 76)
    assert seen == {128, 256, 384, 512}


def test_ranks_share_the_bin_order_and_split_the_files(bins):
    r0 = BinnedSampler(bins, 4, rank=0, world=2, seed=7)
    r1 = BinnedSampler(bins, 4, rank=1, world=2, seed=7)
    files0, files1 = set(), set()
    for _ in range(40):
        a, b = r0.next_batch(), r1.next_batch()
        assert a.bound == b.bound
        files0.update(a.files)
        files1.update(b.files)
    assert files0.isdisjoint(files1)
    from pretrain.data import rank_rows

    for b, shards in bins.items():  # balanced slices: mostly the rank's own files (k % 2 == r)
        for r in (0, 1):
            f, _ = rank_rows(shards, r, 2)
            assert np.mean(f % 2 == r) > 0.9, (b, r)


def test_one_epoch_reads_each_row_once(golden, tmp_path):
    one = tmp_path / "128"
    one.mkdir()
    shutil.copy(golden / "4bins/128/part_0_of_8.hdf5", one / "part_0_of_1.hdf5")
    s = BinnedSampler(discover_shards(tmp_path), micro_batch=10, rank=0, world=1, seed=3)
    ids = np.concatenate([s.next_batch().arrays["input_ids"] for _ in range(s.steps_per_epoch)])
    with h5py.File(one / "part_0_of_1.hdf5") as h:
        ref = h["input_ids"][:, :128].astype(np.int64)
    assert len(ids) == 190  # 191 rows, 19 batches of 10: the last row waits for the next epoch
    assert {r.tobytes() for r in ids} <= {r.tobytes() for r in ref}
    assert len({r.tobytes() for r in ids}) == len(ids)  # no row twice within the epoch
    assert s.next_batch().epoch == 1


def test_resume_continues_exactly(bins):
    a = BinnedSampler(bins, 4, rank=1, world=2, seed=5)
    for _ in range(13):
        a.next_batch()
    state = a.state_dict()
    expected = [a.next_batch().arrays["input_ids"] for _ in range(5)]
    b = BinnedSampler(bins, 4, rank=1, world=2, seed=5)
    b.load_state_dict(state)
    got = [b.next_batch().arrays["input_ids"] for _ in range(5)]
    assert all(np.array_equal(x, y) for x, y in zip(expected, got, strict=True))
    c = BinnedSampler(bins, 8, rank=1, world=2, seed=5)
    with pytest.raises(InputError, match="cannot be resumed"):
        c.load_state_dict(state)


def test_one_bin_folder_keeps_its_bound(golden):
    bins = discover_shards(golden / "4bins" / "256")
    assert list(bins) == [256] and len(bins[256]) == 8
    assert BinnedSampler(bins, 2).next_batch().arrays["input_ids"].shape == (2, 256)


def test_plain_padded_file(golden):
    bins = discover_shards(golden / "eval_100.hdf5")
    assert list(bins) == [512] and bins[512][0].rows == 100
    b = BinnedSampler(bins, 8).next_batch()
    assert b.arrays["input_ids"].shape == (8, 512)


def _copy_bins(golden, tmp_path):
    dst = tmp_path / "4bins"
    shutil.copytree(golden / "4bins", dst)
    return dst


def test_missing_shard_is_named(golden, tmp_path):
    d = _copy_bins(golden, tmp_path)
    (d / "256/part_3_of_8.hdf5").unlink()
    with pytest.raises(InputError, match=r"missing HDF5 shard .*256/part_3_of_8\.hdf5"):
        discover_shards(d)


def test_corrupt_shard_is_named(golden, tmp_path):
    d = _copy_bins(golden, tmp_path)
    bad = d / "384/part_5_of_8.hdf5"
    bad.write_bytes(bad.read_bytes()[:1000])
    with pytest.raises(InputError, match=r"cannot read HDF5 shard .*384/part_5_of_8\.hdf5"):
        discover_shards(d)


def test_shard_without_a_dataset_is_named(golden, tmp_path):
    d = _copy_bins(golden, tmp_path)
    with h5py.File(d / "128/part_1_of_8.hdf5", "a") as h:
        del h["masked_lm_ids"]
    with pytest.raises(InputError, match=r"part_1_of_8\.hdf5 lacks dataset\(s\) masked_lm_ids"):
        discover_shards(d)


def test_vocab_mismatch_is_refused(bins, golden):
    s = BinnedSampler(bins, 4, vocab_size=1000)
    with pytest.raises(InputError, match="is >= the model's vocab_size 1000"):
        s.next_batch()
    with pytest.raises(InputError, match=r"eval_100.hdf5 row \d+ is >= the model's vocab_size 1000"):
        EvalSet(golden / "eval_100.hdf5", 8, vocab_size=1000)


def test_eval_accuracy_is_a_micro_average(golden):
    full = EvalSet(golden / "eval_100.hdf5", 16)
    halves = [EvalSet(golden / "eval_100.hdf5", 16, rank=r, world=2) for r in (0, 1)]
    assert sum(len(h.data["input_ids"]) for h in halves) == 100
    # an oracle that gets exactly the masked tokens of odd-numbered batches right
    calls = []

    def oracle(batch):
        n = float((batch["masked_lm_positions"] != 0).sum())
        calls.append(n)
        return (n if len(calls) % 2 else 0.0), n, 1.0

    r = evaluate(oracle, full)
    total = float((full.data["masked_lm_positions"] != 0).sum())
    assert r["eval_masked_tokens"] == total == sum(calls)
    assert r["eval_mlm_accuracy"] == pytest.approx(sum(calls[0::2]) / total)  # tokens, not batches, averaged
    assert r["eval_mlm_accuracy"] != pytest.approx(0.5)
    assert all(set(b) == set(FIELDS) for b in full.batches())
    assert all(b["input_ids"].shape[1] >= b["input_mask"].sum(axis=1).max() for b in full.batches())


def test_prefetching_keeps_the_order_and_the_consumed_position(bins):
    plain = BinnedSampler(bins, 4, rank=0, world=2, seed=9)
    pre = PrefetchingSampler(BinnedSampler(bins, 4, rank=0, world=2, seed=9), depth=3)
    for _ in range(6):
        assert np.array_equal(plain.next_batch().arrays["input_ids"], pre.next_batch().arrays["input_ids"])
    state = pre.state_dict()
    assert state == plain.state_dict()  # 6 consumed, although more were read ahead
    pre.close()
    resumed = PrefetchingSampler(BinnedSampler(bins, 4, rank=0, world=2, seed=9))
    resumed.load_state_dict(state)
    assert np.array_equal(resumed.next_batch().arrays["input_ids"], plain.next_batch().arrays["input_ids"])
    resumed.close()


def test_prefetching_raises_the_readers_error(bins):
    pre = PrefetchingSampler(BinnedSampler(bins, 4, vocab_size=1000))
    with pytest.raises(InputError, match="vocab_size 1000"):
        pre.next_batch()
    pre.close()


def test_more_ranks_than_files_split_rows(bins):
    from pretrain.data import rank_rows

    shards = bins[384]  # 8 files, 663 rows
    parts = [rank_rows(shards, r, 16) for r in range(16)]
    pairs = [set(zip(f.tolist(), r.tolist(), strict=True)) for f, r in parts]
    assert sum(len(p) for p in pairs) == 663 and len(set().union(*pairs)) == 663  # a partition of the rows
    samplers = [BinnedSampler({384: shards}, 2, rank=r, world=16) for r in (0, 15)]
    assert samplers[0].steps_per_epoch == samplers[1].steps_per_epoch == 663 // 16 // 2


def _epoch_rows(bins, micro, world, seed=4):
    """(bin, file, row) of every sample all ranks read in one epoch (from the samplers' plans, no reading)."""
    seen = []
    for r in range(world):
        s = BinnedSampler(bins, micro, rank=r, world=world, seed=seed)
        for b, n in s.batches_per_bin.items():
            files, rows = s._rows[b]
            pick = s._perm(b, len(rows))[:n * micro]
            seen += [(b, int(f), int(x)) for f, x in zip(files[pick], rows[pick], strict=True)]
    return seen


@pytest.mark.parametrize(("world", "micro"), [(2, 4), (3, 8), (3, 32), (5, 7), (16, 2), (16, 32)])
def test_an_epoch_drops_fewer_than_ranks_x_micro_rows_per_bin(bins, world, micro):
    seen = _epoch_rows(bins, micro, world)
    assert len(set(seen)) == len(seen)  # no row twice in an epoch, across all ranks
    for b, shards in bins.items():
        total = sum(s.rows for s in shards)
        read = sum(1 for x in seen if x[0] == b)
        assert 0 <= total - read < world * micro, (b, total, read)
    steps = {BinnedSampler(bins, micro, rank=r, world=world).steps_per_epoch for r in range(world)}
    assert len(steps) == 1  # every rank runs the same number of steps


def test_ranks_slices_partition_each_bin(bins):
    from pretrain.data import rank_rows

    for world in (2, 3, 16):
        for shards in bins.values():
            parts = [set(zip(*(a.tolist() for a in rank_rows(shards, r, world)), strict=True)) for r in range(world)]
            sizes = [len(p) for p in parts]
            assert max(sizes) - min(sizes) <= 1 and sum(sizes) == sum(s.rows for s in shards)
            assert len(set().union(*parts)) == sum(sizes)


def test_the_dropped_rows_change_with_the_epoch(golden, tmp_path):
    one = tmp_path / "128"
    one.mkdir()
    shutil.copy(golden / "4bins/128/part_0_of_8.hdf5", one / "part_0_of_1.hdf5")  # 191 rows
    s = BinnedSampler(discover_shards(tmp_path), micro_batch=10, rank=0, world=1, seed=3)
    dropped = []
    for epoch in (0, 1, 2):
        s.epoch = epoch
        dropped.append(int(s._perm(128, 191)[190]))
    assert len(set(dropped)) > 1


# --- bad values: refused in one line naming the file and the row (issue 33, item 6) -------------------------

ROWS = 16


def _padded_file(golden, path, corrupt=None):
    """The first ROWS rows of the golden sample as one padded file; ``corrupt(arrays)`` edits them first."""
    with h5py.File(golden / "sample.hdf5") as f:
        arrays = {k: f[k][:ROWS] for k in FIELDS}
    if corrupt:
        corrupt(arrays)
    with h5py.File(path, "w") as h:
        for k, v in arrays.items():
            h.create_dataset(k, data=v)
    return path


def _real(arrays, row):
    return int((arrays["input_mask"][row] != 0).sum())


PADDED_CASES = {  # name: (edit of row 11, what the refusal says)
    "negative id": (lambda a: a["input_ids"].__setitem__((11, 3), -7), "input_ids holds the negative token id -7"),
    "id past vocab": (lambda a: a["input_ids"].__setitem__((11, 3), 40000), "token id 40000 in .* is >= the model"),
    "mask 5": (lambda a: a["input_mask"].__setitem__((11, 2), 5), "input_mask holds 5"),
    "segment 2": (lambda a: a["segment_ids"].__setitem__((11, 2), 2), "segment_ids holds 2"),
    "position 600": (lambda a: a["masked_lm_positions"].__setitem__((11, 0), 600),
                     r"masked_lm_positions holds 600 \(column 0\), outside the row's 512 columns"),
    "position -1": (lambda a: a["masked_lm_positions"].__setitem__((11, 0), -1), "masked_lm_positions holds -1"),
    "position past the tokens": (lambda a: a["masked_lm_positions"].__setitem__((11, 0), _real(a, 11) + 2),
                                 "past the row's real tokens"),
    "masked id -1": (lambda a: a["masked_lm_ids"].__setitem__((11, 0), -1), "masked_lm_ids holds the negative"),
    "nsp label 3": (lambda a: a["next_sentence_labels"].__setitem__(11, 3), "next_sentence_labels holds 3"),
}


@pytest.mark.parametrize("case", sorted(PADDED_CASES))
def test_a_bad_value_is_refused_naming_the_file_and_row(golden, tmp_path, case):
    edit, says = PADDED_CASES[case]
    bad = _padded_file(golden, tmp_path / "bad.hdf5", edit)
    s = BinnedSampler(discover_shards(bad), ROWS, vocab_size=30528)  # one batch: every row
    with pytest.raises(InputError) as err:
        s.next_batch()
    msg = str(err.value)
    assert "\n" not in msg and f"{bad} row 11" in msg, msg
    import re

    assert re.search(says, msg), msg
    good = _padded_file(golden, tmp_path / "good.hdf5")  # the same rows unedited pass
    BinnedSampler(discover_shards(good), ROWS, vocab_size=30528).next_batch()


def test_a_bad_row_in_a_later_batch_of_a_4bin_file_is_named_with_its_row_in_the_file(golden, tmp_path):
    d = _copy_bins(golden, tmp_path)
    path = d / "512/part_2_of_8.hdf5"
    with h5py.File(path, "a") as h:
        row = h["input_ids"].shape[0] - 3
        ids = h["input_ids"][row]
        ids[1] = -2
        h["input_ids"][row] = ids
    s = BinnedSampler(discover_shards(d), 8, vocab_size=30528)
    with pytest.raises(InputError, match=rf"{path} row {row} \(epoch 0 batch \d+\): input_ids holds the negative"):
        for _ in range(s.steps_per_epoch):
            s.next_batch()


PACKED_CASES = {  # Habana's packed layout (the batch layout of both packed readers)
    "mask 5": (lambda a: a["input_mask"].__setitem__((5, 1), 5), r"input_mask holds 5 \(column 1\); packed rows"),
    "negative id": (lambda a: a["input_ids"].__setitem__((5, 1), -1), "input_ids holds the negative token id -1"),
    "position 600": (lambda a: a["positions"].__setitem__((5, 1), 600), "positions holds 600"),
    "masked position 600": (lambda a: a["masked_lm_positions"].__setitem__((5, 0), 600),
                            "masked_lm_positions holds 600"),
    "nsp position -1": (lambda a: a["next_sentence_positions"].__setitem__((5, 0), -1),
                        "next_sentence_positions holds -1"),
    "nsp weight 2": (lambda a: a["next_sentence_weights"].__setitem__((5, 0), 2), "next_sentence_weights holds 2"),
}


@pytest.mark.parametrize("case", sorted(PACKED_CASES))
def test_a_bad_value_in_a_habana_pack_is_refused_naming_the_file_and_pack(golden, tmp_path, case):
    from pretrain.packing import best_fit_packs, pack_rows, sequence_lengths, training_sampler, write_habana

    with h5py.File(golden / "sample.hdf5") as f:
        rows = {k: f[k][:60] for k in FIELDS}
    packed = pack_rows(rows, best_fit_packs(sequence_lengths(rows), 512, 3), 512)
    n = len(packed["input_ids"])
    edit, says = PACKED_CASES[case]
    edit(packed)
    (tmp_path / "p").mkdir()
    path = tmp_path / "p" / "mixed_strategies_part_0.hdf5"
    write_habana(path, packed)
    s, layout = training_sampler(str(tmp_path / "p"), True, n, vocab_size=30528)
    assert layout == "habana"
    with pytest.raises(InputError, match=f"{path} row 5 .*{says}"):
        s.next_batch()


def test_the_check_is_cheap(bins):
    s = BinnedSampler(bins, 32, vocab_size=30528)
    arrays = s.next_batch().arrays
    import time

    t0 = time.perf_counter()
    for _ in range(20):
        check_values(arrays, 30528, str)
    assert (time.perf_counter() - t0) / 20 < 0.02  # (~0.3 ms for 32 rows of 512 here)


def test_the_preflight_names_a_bad_row_before_any_rank_starts(golden, tmp_path):
    from pretrain.launch import preflight
    from pretrain.train_config import TrainConfig

    bad = _padded_file(golden, tmp_path / "bad.hdf5", lambda a: a["input_mask"].__setitem__((4, 0), 5))
    cfg = TrainConfig(train_dir=str(bad), output_dir=str(tmp_path / "o"), model="tiny", device="cpu")
    with pytest.raises(InputError, match=f"bad training data in {bad} row 4: input_mask holds 5"):
        preflight(cfg)


@pytest.mark.parametrize(("dataset", "slot", "value", "says"), [
    ("input_ids", 1, -5, r"input_ids holds the negative token id -5 \(column 1\)"),
    ("masked_lm_positions", 0, 600, r"masked_lm_positions holds 600 \(column 0\), outside the row's 512 columns"),
    ("segment_ids", 0, 3, r"segment_ids holds 3 \(column 0\)"),
])
def test_a_bad_value_in_an_nvidia_pack_is_refused_naming_the_file_and_pack(golden, tmp_path, dataset, slot, value,
                                                                            says):
    from pretrain.packing import best_fit_packs, pack_rows, sequence_lengths, training_sampler, write_nvidia

    with h5py.File(golden / "sample.hdf5") as f:
        rows = {k: f[k][:60] for k in FIELDS}
    packed = pack_rows(rows, best_fit_packs(sequence_lengths(rows), 512, 3), 512)
    (tmp_path / "p").mkdir()
    path = tmp_path / "p" / "output_0"
    write_nvidia(path, packed)
    with h5py.File(path, "a") as h:  # NVIDIA's vlen rows, edited in place
        row = np.array(h[dataset][5])
        row[slot] = value
        h[dataset][5] = row
    s, layout = training_sampler(str(tmp_path / "p"), True, len(packed["input_ids"]), vocab_size=30528)
    assert layout == "nvidia"
    with pytest.raises(InputError, match=f"{path} row 5 .*{says}"):
        s.next_batch()
