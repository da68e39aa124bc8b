"""pack-habana: Habana's ``pack_pretraining_data_pytorch.py``, exact, and what Habana's trainer reads.

Exactness: bertpipe's (vectorized) packer against ``habana_reference.pack``, a row-by-row re-enactment of the script
(same seeds, real NumPy/SciPy), on inputs made from the golden sample and on made-up ones: every dataset's name,
dtype, shape and values, the pack order, the files' bytes (both written by this h5py), the metadata. The default
suite packs at max_sequence_length 128 or less (SciPy's NNLS on the 512-length strategy matrix, 22,102 columns,
takes 25-180 s a round on a shared 2-core machine); the golden sample at 512 and every length 1..512 are ``slow``.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import h5py
import numpy as np
import pytest

from bertpipe.cli import main
from core.errors import InputError, RecordError
from preprocessing import pack_fast
from preprocessing.habana.pack import (
    DAG_STAGES,
    PACKED_DATASETS,
    HabanaPackConfig,
    configure,
    packing_recipe,
    packing_strategies,
    run_pack_habana,
    training_files,
)
from tests import loader_rules
from tests.preprocessing import habana_reference as ref

PADDED = (("input_ids", "i4"), ("input_mask", "i1"), ("segment_ids", "i1"), ("masked_lm_positions", "i4"),
          ("masked_lm_ids", "i4"), ("next_sentence_labels", "i1"))


def write_padded(path: Path, lengths, *, width: int, preds: int, seed: int, first_id: int = 0,
                 bert_segments: bool = False) -> None:
    """Padded MLPerf-style rows of these lengths: [CLS] first, row number ``first_id + i`` as token 1 (so every
    sequence is unique), about 15 % of the other positions masked (at most ``preds``), random NSP labels; segment
    ids random 0/1, or (``bert_segments``) a BERT instance's: 0s then 1s."""
    rng = np.random.default_rng(seed)
    lengths = np.asarray(lengths, dtype=np.int64)
    n = len(lengths)
    mask = (np.arange(width) < lengths[:, None]).astype(np.int8)
    ids = rng.integers(1000, 30000, (n, width), dtype=np.int32) * mask
    ids[:, 0] = 101
    ids[:, 1] = np.where(lengths > 1, 30000 + first_id + np.arange(n), 0)
    seg = (rng.integers(0, 2, (n, width)) * mask).astype(np.int8)
    if bert_segments:
        first_b = 1 + (rng.random(n) * lengths).astype(np.int64)  # [CLS] A... in segment 0, then B... in 1
        seg = ((np.arange(width) >= first_b[:, None]) * mask).astype(np.int8)
    pos = np.zeros((n, preds), np.int32)
    mids = np.zeros((n, preds), np.int32)
    for i, ln in enumerate(lengths.tolist()):
        k = min(preds, ln - 1, max(1, round(ln * 0.15)))
        if k > 0:
            pos[i, :k] = np.sort(rng.choice(np.arange(1, ln), size=k, replace=False))
            mids[i, :k] = rng.integers(1000, 30000, k)
    data = {"input_ids": ids, "input_mask": mask, "segment_ids": seg, "masked_lm_positions": pos,
            "masked_lm_ids": mids, "next_sentence_labels": rng.integers(0, 2, n).astype(np.int8)}
    with h5py.File(path, "w") as f:
        for name, dt in PADDED:
            f.create_dataset(name, data=data[name], dtype=dt)


def split_into(path_in: Path, folder: Path, rows: np.ndarray, width: int, parts: int) -> None:
    """The rows ``rows`` of a padded file, narrowed to ``width`` columns, as ``parts`` *training* files."""
    folder.mkdir(parents=True, exist_ok=True)
    with h5py.File(path_in, "r") as f:
        cols = {name: f[name][:] for name, _ in PADDED}
    for k, chunk in enumerate(np.array_split(rows, parts)):
        with h5py.File(folder / f"golden_training_{k}.hdf5", "w") as g:
            for name, dt in PADDED:
                v = cols[name][chunk]
                g.create_dataset(name, data=v[:, :width] if name in ("input_ids", "input_mask", "segment_ids") else v,
                                 dtype=dt)


def read_all(path: Path) -> dict[str, np.ndarray]:
    with h5py.File(path, "r") as f:
        return {name: f[name][:] for name in f}


def assert_same_packs(ours: Path, theirs: Path, files: int, *, same_bytes: bool = True) -> None:
    """Both folders hold ``files`` mixed_strategies_part_<i>.hdf5 with the same nine datasets (name, dtype,
    shape, values), gzip-compressed, and nothing else; and the same bytes (both written by this h5py)."""
    names = [f"mixed_strategies_part_{i}.hdf5" for i in range(files)]
    assert sorted(p.name for p in ours.iterdir()) == sorted(names)
    assert sorted(p.name for p in theirs.iterdir()) == sorted(names)
    for n in names:
        a, b = read_all(ours / n), read_all(theirs / n)
        assert a.keys() == b.keys() == {d[0] for d in PACKED_DATASETS}
        for k in a:
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, (n, k)
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{n}:{k}")
        with h5py.File(ours / n, "r") as f:
            assert [f[name].compression for name, _, _ in PACKED_DATASETS] == ["gzip"] * 9
        if same_bytes:  # the same bytes: the same datasets created in the same order with the same settings
            assert hashlib.md5((ours / n).read_bytes()).digest() == hashlib.md5((theirs / n).read_bytes()).digest(), n


def pack_both(in_dir: Path, tmp: Path, **kw) -> tuple[Path, dict, object]:
    """bertpipe (CLI layout: the folder, the manifest and metadata beside it) and the re-enactment."""
    cfg = HabanaPackConfig(max_sequence_length=kw.get("L", 512), max_predictions_per_sequence=kw.get("P", 80),
                           max_sequences_per_pack=kw.get("S", 3), seed=kw.get("seed", 42),
                           local_rank=kw.get("local_rank", -1), keep_partial_last=kw.get("keep_partial_last", True))
    ours = tmp / "ours"
    m = run_pack_habana(training_files(in_dir), ours, cfg, manifest_name="../ours.manifest.json")
    info = ref.pack(in_dir, tmp / "theirs", **kw)
    return ours, info, m


# -- inputs ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def golden_128(golden: Path, tmp_path_factory) -> Path:
    """The golden sample's rows of length <= 128 (1,535 real rows), 128 columns wide, in 3 *training* files;
    beside them a file and a folder that the script skips."""
    d = tmp_path_factory.mktemp("golden128") / "in"
    with h5py.File(golden / "sample.hdf5", "r") as f:
        lengths = f["input_mask"][:].sum(axis=1, dtype=np.int64)
    split_into(golden / "sample.hdf5", d, np.flatnonzero(lengths <= 128), 128, 3)
    write_padded(d / "eval_part.hdf5", [5, 9], width=128, preds=76, seed=1)  # no "training" in the name
    return d


@pytest.fixture(scope="module")
def every_128(tmp_path_factory) -> Path:
    """Every length 1..128 thirty times and 6,000 random lengths, shuffled, in four files of uneven size:
    about 4,900 packs, one whole file of 4,480 and a partial one."""
    d = tmp_path_factory.mktemp("every128") / "in"
    d.mkdir()
    rng = np.random.default_rng(7)
    lengths = np.concatenate([np.tile(np.arange(1, 129), 30), rng.integers(1, 129, 6000)])
    rng.shuffle(lengths)
    first = 0
    for k, chunk in enumerate(np.split(lengths, [100, 5000, 9000])):
        write_padded(d / f"wiki_training_{k}.hdf5", chunk, width=128, preds=20, seed=k, first_id=first)
        first += len(chunk)
    return d


@pytest.fixture(scope="module")
def packed_every(every_128: Path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("packed_every")
    return (*pack_both(every_128, tmp, L=128, P=20, keep_partial_last=True), tmp)


# -- exactness ------------------------------------------------------------------------------------------------------
def test_golden_rows_pack_as_the_script_packs(golden_128, tmp_path):
    ours, info, m = pack_both(golden_128, tmp_path, L=128, P=76, keep_partial_last=True)
    assert info["packs"] == m.counters["packs"] > 700 and info["files"] == m.counters["files"] == 1
    assert_same_packs(ours, tmp_path / "theirs", 1)
    meta = json.loads((tmp_path / "ours_metadata.json").read_text())
    assert meta["avg_seq_per_sample"] == pytest.approx(info["avg_seq_per_sample"], rel=1e-15)
    assert meta["original_number_of_samples"] == 1535 and meta["new_number_of_samples"] == info["packs"]
    assert set(meta) == {"number_of_sequences_dropped", "number_of_strategies_utilized", "new_number_of_samples",
                         "original_number_of_samples", "compression_ratio", "expected_speed_up",
                         "theoretical_speed_up", "avg_seq_per_sample", "padding_tokens_packed_dataset",
                         "padding_tokens_original_dataset", "packing_efficiency", "top_8_strategies"}
    assert (tmp_path / "ours.manifest.json").is_file()
    # the script itself (no partial file) writes nothing for fewer than 4,480 packs; so does keep_partial_last=False
    m2 = run_pack_habana(training_files(golden_128), tmp_path / "strict",
                         HabanaPackConfig(max_sequence_length=128, max_predictions_per_sequence=76,
                                          keep_partial_last=False), manifest_name="../strict.manifest.json")
    info2 = ref.pack(golden_128, tmp_path / "theirs_strict", L=128, P=76)
    assert info2["files"] == m2.counters["files"] == 0 and list((tmp_path / "strict").iterdir()) == []
    assert m2.counters["dropped_packs"] == info["packs"] and m2.counters["dropped_sequences"] == 1535


def test_every_length_several_files_as_the_script(packed_every):
    ours, info, m, tmp = packed_every
    assert info["files"] == m.counters["files"] == 2 and info["packs"] == m.counters["packs"]
    assert m.counters["sequences"] == 30 * 128 + 6000
    assert_same_packs(ours, tmp / "theirs", 2)


@pytest.mark.parametrize("other", [None, 1])
def test_bert_segments_kept_as_one_number_a_row_pack_as_the_script(other, tmp_path, monkeypatch):
    """Rows whose segment ids are 0s then 1s (a BERT instance's) are kept in the scratch as one number a row and
    filled back, in groups one after another in one process (the buffers used again): the script's files, byte
    for byte; an input with other segment ids (``other``) keeps its values beside them."""
    import preprocessing.habana.pack as hp

    d = tmp_path / "in"
    d.mkdir()
    rng = np.random.default_rng(17)
    lengths = np.concatenate([np.tile(np.arange(1, 129), 30), rng.integers(1, 129, 6000)])
    rng.shuffle(lengths)
    first = 0
    for k, chunk in enumerate(np.split(lengths, [2000, 2100, 7000])):
        write_padded(d / f"wiki_training_{k}.hdf5", chunk, width=128, preds=20, seed=k, first_id=first,
                     bert_segments=k != other)
        first += len(chunk)
    kept = []
    real = hp.save_segments
    monkeypatch.setattr(hp, "save_segments", lambda sd, stem, v, b, direct=False: (
        kept.append((stem, b is not None)), real(sd, stem, v, b, direct))[1])
    ours, info, m = pack_both(d, tmp_path, L=128, P=20, keep_partial_last=True)
    # (without the C loop every input keeps its values: the same files)
    assert sorted(set(kept)) == [(f"in_{k:05d}", pack_fast.available() and k != other) for k in range(4)]
    assert info["files"] == m.counters["files"] == 2
    assert_same_packs(ours, tmp_path / "theirs", 2)


def test_keep_partial_last_false_writes_the_scripts_files_exactly(packed_every, every_128, tmp_path):
    _ours, info, _m, tmp = packed_every
    m = run_pack_habana(training_files(every_128), tmp_path / "strict",
                        HabanaPackConfig(max_sequence_length=128, max_predictions_per_sequence=20,
                                         keep_partial_last=False), manifest_name="../strict.manifest.json")
    assert m.counters["files"] == 1 and m.counters["packs"] == 4480
    assert m.counters["dropped_packs"] == info["packs"] - 4480 > 0
    (tmp_path / "theirs").mkdir()  # the script's files: the whole ones
    (tmp_path / "theirs" / "mixed_strategies_part_0.hdf5").write_bytes(
        (tmp / "theirs" / "mixed_strategies_part_0.hdf5").read_bytes())
    assert_same_packs(tmp_path / "strict", tmp_path / "theirs", 1)


def test_workers_and_groups_write_the_same_bytes(packed_every, every_128, tmp_path):
    """Two processes, one file a group (group_files = 1, blocks of one file's rows): the same files, hashed in the
    workers; and one process writing both files as one group."""
    _ours, _info, m, _tmp = packed_every
    m2 = run_pack_habana(training_files(every_128), tmp_path / "w2",
                         HabanaPackConfig(max_sequence_length=128, max_predictions_per_sequence=20, chunk_rows=4480,
                                          group_files=1),
                         manifest_name="../w2.manifest.json", workers=2)
    assert [(f.name, f.md5) for f in m2.files] == [(f.name, f.md5) for f in m.files] and len(m.files) == 2
    assert m2.key == m.key  # chunk_rows, group_files and workers are not in the key
    m1 = run_pack_habana(training_files(every_128), tmp_path / "w1",
                         HabanaPackConfig(max_sequence_length=128, max_predictions_per_sequence=20, group_files=1),
                         manifest_name="../w1.manifest.json")
    assert [(f.name, f.md5) for f in m1.files] == [(f.name, f.md5) for f in m.files] and m1.key == m.key
    assert [hashlib.md5(p.read_bytes()).hexdigest() for p in sorted((tmp_path / "w2").iterdir())] == [
        f.md5 for f in m.files]


@pytest.mark.parametrize("case", ["three-ones", "one-max", "leftover-L", "two-a-pack", "four-a-pack", "rank-2"])
def test_tiny_sets_as_the_script(case, tmp_path):
    """Tiny sets take the recipe's rare branches: a round that rounds to nothing (the gradient step), the
    lengths left over after the rounds (two-length strategies, a length-L one alone)."""
    d = tmp_path / "in"
    d.mkdir()
    kw = {"three-ones": dict(L=32, lengths=[1, 1, 1]), "one-max": dict(L=24, lengths=[24]),
          "leftover-L": dict(L=48, lengths=np.repeat(np.arange(1, 49), [
              0, 2, 1, 1, 2, 0, 3, 3, 3, 2, 0, 1, 4, 3, 1, 0, 2, 2, 3, 3, 4, 3, 2, 2, 0, 2, 1, 0, 1, 3, 2, 2, 3, 2, 1, 3,
              0, 0, 4, 4, 0, 2, 2, 2, 4, 2, 4, 4])),
          "two-a-pack": dict(L=24, S=2, lengths=np.arange(1, 25).repeat(3)),
          "four-a-pack": dict(L=24, S=4, lengths=np.arange(1, 25).repeat(3)),
          "rank-2": dict(L=24, local_rank=2, lengths=np.arange(1, 25).repeat(2))}[case]
    lengths = np.asarray(kw.pop("lengths"))
    np.random.default_rng(3).shuffle(lengths)
    for k, chunk in enumerate(np.array_split(lengths, 2)):
        write_padded(d / f"t_training_{k}.hdf5", chunk, width=kw["L"], preds=8, seed=k, first_id=1000 * k)
    ours, info, m = pack_both(d, tmp_path, P=8, keep_partial_last=True, **kw)
    assert_same_packs(ours, tmp_path / "theirs", 1)
    recipe = packing_recipe(lengths, kw["L"], kw.get("S", 3))
    if case == "three-ones":
        assert recipe.rounds == ["gradient"]
    if case == "leftover-L":
        assert recipe.leftover  # lengths given [l, L - l] after the rounds (48 alone too, with this SciPy)
    check_packs(ours, d, kw["L"], kw.get("S", 3), P=8)


def test_the_seed_and_local_rank_decide_the_packs(golden_128, tmp_path):
    """seed + local_rank is the seed (42 - 1 = 41 by default): seed 40 with rank 1 packs as the default."""
    files = training_files(golden_128)
    got = {}
    for name, seed, rank in (("a", 42, -1), ("b", 40, 1), ("c", 42, 0)):
        run_pack_habana(files, tmp_path / name, HabanaPackConfig(max_sequence_length=128, max_predictions_per_sequence=76,
                                                                 seed=seed, local_rank=rank),
                        manifest_name=f"../{name}.manifest.json")
        got[name] = read_all(tmp_path / name / "mixed_strategies_part_0.hdf5")["input_ids"]
    np.testing.assert_array_equal(got["a"], got["b"])
    assert not np.array_equal(got["a"], got["c"])


@pytest.mark.parametrize("chunk", [64, 100_000])
def test_scattered_rows_come_back_by_place(every_128, chunk, tmp_path):
    """Each input's rows, scattered into scratch sorted by their place (some rows in no written pack), come back
    compact and in place order for any range of places, read in blocks of any size."""
    from preprocessing.habana.pack import RowRuns, SegmentRuns, _gather, read_inputs, scatter_input

    inputs = read_inputs(training_files(every_128), HabanaPackConfig(max_sequence_length=128))
    cols = {}
    for p in inputs.files:
        for name, v in read_all(Path(p)).items():
            cols.setdefault(name, []).append(v)
    full = {name: np.concatenate(v) for name, v in cols.items()}
    n = len(inputs.seq)
    rng = np.random.default_rng(0)
    kept = rng.permutation(n)[: n - 50]  # 50 rows held by no written pack
    place = np.full(n, -1, np.int64)
    place[kept] = np.arange(len(kept))
    st = inputs.starts
    for k, path in enumerate(inputs.files):
        got = scatter_input(k, path, place[st[k]:st[k + 1]], inputs.seq[st[k]:st[k + 1]],
                            inputs.pred[st[k]:st[k + 1]], str(tmp_path), chunk)
        assert got == int((place[st[k]:st[k + 1]] >= 0).sum())
    for q0, q1 in ((0, len(kept)), (17, 18), (100, 2345), (len(kept) - 5, len(kept))):
        got = _gather(str(tmp_path), len(inputs.files), q0, q1)
        rows = kept[q0:q1]
        seq, pred = inputs.seq[rows], inputs.pred[rows]
        assert np.array_equal(got["seq"], seq) and np.array_equal(got["pred"], pred)
        assert np.array_equal(got["next_sentence_labels"], full["next_sentence_labels"].reshape(-1)[rows])
        for name, lens in (("input_ids", seq), ("segment_ids", seq), ("masked_lm_positions", pred),
                           ("masked_lm_ids", pred)):
            want = np.concatenate([full[name][r, :m] for r, m in zip(rows, lens, strict=True)])
            v = got[name]
            if isinstance(v, (RowRuns, SegmentRuns)):  # the C path: left where read, one run (or two) a row
                v = v.values(lens)
            np.testing.assert_array_equal(v, want, err_msg=name)


def plain_assignment(seq, recipe, cfg):
    """The assignment as first written (the script's steps on whole arrays: the lists concatenated and indexed by
    their permutations, np.random.permutation, a stable argsort for each pack's rank): what the pieces must equal."""
    from preprocessing.pyrandom import Shuffles

    depth, L = cfg.max_sequences_per_pack, cfg.max_sequence_length
    shuffles = Shuffles(cfg.rng_seed)
    by_len = {}
    for i, v in enumerate(seq.tolist()):
        by_len.setdefault(v, []).append(i)
    for v in range(1, L + 1):
        by_len.setdefault(v, [])
    lists = {}
    for v, rows in by_len.items():
        items = np.array(rows + [-1] * int(recipe.padding[v - 1]), dtype=np.int64)
        lists[v] = items[shuffles.permutation(len(items))] if len(items) > 1 else items
    order = np.random.RandomState(cfg.rng_seed).permutation(int(recipe.mixture.sum()))
    strat = np.repeat(np.arange(len(recipe.strategies)), recipe.mixture)[order]
    ranges, at = {}, {}
    for s_, st in enumerate(recipe.strategies):  # each strategy's range of each length's list, strategy order
        for v in sorted(set(st)):
            k = st.count(v) * int(recipe.mixture[s_])
            ranges[s_, v] = (at.get(v, 0), at.get(v, 0) + k)
            at[v] = at.get(v, 0) + k
    slots = np.full((len(strat), depth), -1, dtype=np.int64)
    for p, s_ in enumerate(strat.tolist()):  # each pack pops the last unused slot of its range, per length
        for k, v in enumerate(recipe.strategies[s_]):
            a, b = ranges[s_, v]
            slots[p, k] = lists[v][b - 1]
            ranges[s_, v] = (a, b - 1)
    return slots


@pytest.mark.parametrize("L,S", [(128, 3), (64, 2)])
def test_assignment_in_pieces_and_to_a_file_is_the_same(L, S, tmp_path):
    """assign_packs in pieces of any size (1 pack, fewer than a file's, several, one piece for all), in memory or
    written to a file as they are made: the plain assignment's packs; the rows' places (row_places, read from the
    file in pieces) as the stage took them from the whole array."""
    from preprocessing.habana.pack import PACKS_PER_FILE, assign_packs, pack_files, row_places

    rng = np.random.default_rng(L)
    n = 3000
    seq = np.minimum(rng.integers(1, L + 40, n), L).astype(np.uint16)  # many full-length rows, as MLPerf's
    seq[rng.integers(0, n, 30)] = rng.integers(1, 6, 30)
    cfg = HabanaPackConfig(max_sequence_length=L, max_sequences_per_pack=S, keep_partial_last=False)
    recipe = packing_recipe(seq, L, S)
    want = plain_assignment(seq, recipe, cfg)
    for piece in (1, 7, 1000, 1 << 20):
        mem = assign_packs(seq, recipe, cfg, chunk_packs=piece)
        assert mem.dtype == np.int32 and np.array_equal(mem, want), piece
        path = tmp_path / f"slots_{piece}.npy"
        got = assign_packs(seq, recipe, cfg, chunk_packs=piece, out=path)
        assert isinstance(got, np.memmap) and np.array_equal(np.load(path), want), piece
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(f"slots_{q}.npy" for q in (1, 7, 1000, 1 << 20)
                                                                       if q <= piece)  # nothing else left
    for keep in (True, False):
        cfg_k = HabanaPackConfig(max_sequence_length=L, max_sequences_per_pack=S, keep_partial_last=keep)
        bounds = pack_files(len(want), cfg_k)  # one partial file, or none
        small = [(0, 50), (50, 130), (130, len(want))]  # files of fewer packs than a piece
        for bnds in (bounds, small):
            written = bnds[-1][1] if bnds else 0
            held = want[:written]
            place = np.full(n, -1, np.int64)
            ids = held[held >= 0]
            place[ids] = np.arange(len(ids))
            first = np.concatenate([[0], np.cumsum((held >= 0).sum(axis=1))])
            for piece in (1, 33, 1 << 20):
                for slots in (want.astype(np.int32), np.load(tmp_path / "slots_7.npy", mmap_mode="r")):
                    pl = row_places(slots, n, bnds, chunk_packs=piece)
                    assert np.array_equal(pl.place, place) and pl.place.dtype == np.int32
                    assert pl.file_first.tolist() == [int(first[a]) for a, _ in bnds] + [len(ids)]
                    assert pl.dropped_sequences == int((want[written:] >= 0).sum())
                    assert pl.empty_packs == int((held < 0).all(axis=1).sum())
    assert len(want) < PACKS_PER_FILE  # (one partial file, or none without keep_partial_last)


def test_strategies_in_the_scripts_order():
    got = packing_strategies(8, 3)
    assert got == [tuple(s) for s in ref.strategies_of(0, 1, 8, 3)]
    assert got[:4] == [(1, 1, 6), (1, 2, 5), (1, 3, 4), (1, 7)] and got[-1] == (8,)
    assert len(packing_strategies(512, 3)) == 22102
    assert packing_strategies(512, 3) == [tuple(s) for s in ref.strategies_of(0, 1, 512, 3)]


# -- invariants and Habana's trainer --------------------------------------------------------------------------------
def input_sequences(in_dir: Path) -> list[tuple]:
    """Every input row as (tokens, segments, masked positions, masked ids, nsp label), unpadded."""
    out = []
    for p in training_files(in_dir):
        c = read_all(p)
        lengths = c["input_mask"].sum(axis=1, dtype=np.int64).tolist()
        preds = np.count_nonzero(c["masked_lm_ids"], axis=1).tolist()
        rows = {name: c[name].tolist() for name in c}
        for i, (n, k) in enumerate(zip(lengths, preds, strict=True)):
            out.append((tuple(rows["input_ids"][i][:n]), tuple(rows["segment_ids"][i][:n]),
                        tuple(rows["masked_lm_positions"][i][:k]), tuple(rows["masked_lm_ids"][i][:k]),
                        rows["next_sentence_labels"][i]))
    return out


def check_packs(out: Path, in_dir: Path, L: int, S: int, P: int) -> None:
    """Every pack: at most S sequences (none: a pack of padding slots only, as the script makes them too), at
    most L tokens, consistent masks/positions; taken apart, the packs hold every input sequence exactly once."""
    seen = []
    for p in sorted(out.iterdir()):
        c = read_all(p)
        n = len(c["input_ids"])
        assert c["input_ids"].shape == (n, L) and c["masked_lm_positions"].shape == (n, P + S)
        assert c["next_sentence_positions"].shape == (n, S)
        k = c["next_sentence_weights"].sum(axis=1)
        assert ((0 <= k) & (k <= S)).all()
        assert (c["next_sentence_weights"] == (np.arange(S) < k[:, None])).all()
        mask = c["input_mask"]
        assert (np.diff(mask, axis=1)[mask[:, 1:] > 0] >= 0).all()  # 1..1 2..2 3..3 then 0 (nothing after a 0)
        assert ((mask == 0) | (np.arange(L) < np.count_nonzero(mask, axis=1)[:, None])).all()
        assert (mask.max(axis=1) == k).all()
        q, col = np.nonzero(mask)
        start = c["next_sentence_positions"][q, mask[q, col] - 1]
        assert (c["positions"][q, col] == col - start).all()  # positions restart at each sequence
        assert (c["input_ids"][q, start] == 101).all()  # which starts with its [CLS]
        mp = c["masked_lm_positions"]
        assert (np.count_nonzero(mp, axis=1) < P + S).all()
        rows = {name: c[name].tolist() for name in c}
        for i in range(n):
            mpi, mii = rows["masked_lm_positions"][i], rows["masked_lm_ids"][i]
            used = [t for t in range(P + S) if mpi[t] != 0]
            for j in range(int(k[i])):
                a = rows["next_sentence_positions"][i][j]
                b = a + rows["input_mask"][i].count(j + 1)
                seen.append((tuple(rows["input_ids"][i][a:b]), tuple(rows["segment_ids"][i][a:b]),
                             tuple(mpi[t] - a for t in used if a <= mpi[t] < b),
                             tuple(mii[t] for t in used if a <= mpi[t] < b), rows["next_sentence_labels"][i][j]))
    assert sorted(seen) == sorted(input_sequences(in_dir))


def test_every_sequence_once_at_most_three_a_pack(packed_every, every_128):
    ours, _info, _m, _tmp = packed_every
    check_packs(ours, every_128, 128, 3, P=20)


def test_habanas_trainer_reads_every_file(packed_every, every_128):
    """Packed mode: every regular file of --input_dir is opened with its nine datasets; masked_lm_labels keep every
    masked position (a 0 always ends the list); NSP -1 beyond the pack's sequences; the metadata beside the
    folder gives avg_seq_per_sample."""
    ours, info, m, _tmp = packed_every
    files = loader_rules.habana_packed_files(ours)
    assert [Path(f).name for f in files] == ["mixed_strategies_part_0.hdf5", "mixed_strategies_part_1.hdf5"]
    total = 0
    for f in files:
        ds = loader_rules.HabanaPackedDataset(f, max_pred_length=20)
        for i in range(len(ds)):
            ids, seg, mask, pos, labels, nsp_pos, nsp = ds[i]
            mp, mi = ds.inputs[4][i], ds.inputs[5][i]
            k = int(np.count_nonzero(mp))
            assert (labels >= 0).sum() == k  # no masked position lost
            np.testing.assert_array_equal(labels[mp[:k]], mi[:k])
            k = int(ds.inputs[8][i].sum())
            assert (nsp[k:] == -1).all() and set(nsp[:k].tolist()) <= {0, 1}
            assert ids.shape == seg.shape == mask.shape == pos.shape == labels.shape == (128,)
        total += len(ds)
    assert total == info["packs"]
    assert loader_rules.habana_avg_seq_per_sample(ours, 128) == pytest.approx(m.counters["avg_seq_per_sample"],
                                                                             abs=1e-6)
    # a padded (unpacked) file fails there, as the issue reports ("'positions' doesn't exist")
    with pytest.raises(KeyError, match="positions"):
        loader_rules.HabanaPackedDataset(training_files(every_128)[0], 20)


def test_uncompressed_files_hold_the_same_packs_and_the_trainer_reads_them(packed_every, every_128, tmp_path):
    """``compression="none"`` (habana-packed-raw, pack-habana --compression none): the same files, datasets, dtypes,
    shapes and values as the script's gzip files, stored contiguous and unfiltered; Habana's packed reader takes
    the same items from both; the manifest says compression "none" (the gzip set's manifest and key do not name
    it, as before the choice existed)."""
    ours, _info, m, _tmp = packed_every
    raw = run_pack_habana(training_files(every_128), tmp_path / "raw",
                          HabanaPackConfig(max_sequence_length=128, max_predictions_per_sequence=20,
                                           compression="none"), manifest_name="../raw.manifest.json")
    assert [f.name for f in raw.files] == [f.name for f in m.files]
    assert raw.params["compression"] == "none" and "compression" not in m.params and raw.key != m.key
    assert raw.counters == m.counters
    assert (tmp_path / "raw_metadata.json").read_text() == (ours.parent / "ours_metadata.json").read_text()
    for f in m.files:
        a, b = read_all(ours / f.name), read_all(tmp_path / "raw" / f.name)
        assert list(a) == list(b)
        for k in a:
            assert a[k].dtype == b[k].dtype and a[k].shape == b[k].shape, k
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{f.name}:{k}")
        with h5py.File(tmp_path / "raw" / f.name, "r") as h:
            assert [(h[n].compression, h[n].chunks) for n, _, _ in PACKED_DATASETS] == [(None, None)] * 9
        gz = loader_rules.HabanaPackedDataset(ours / f.name, max_pred_length=20)
        un = loader_rules.HabanaPackedDataset(tmp_path / "raw" / f.name, max_pred_length=20)
        assert len(gz) == len(un) > 0
        for i in range(0, len(gz), 97):
            for x, y in zip(gz[i], un[i], strict=True):
                np.testing.assert_array_equal(x, y)
    assert loader_rules.habana_packed_files(tmp_path / "raw") == [str(tmp_path / "raw" / f.name) for f in m.files]


def test_narrow_files_hold_the_same_values_and_the_trainer_reads_the_same_items(golden_128, tmp_path):
    """``dtypes="narrow"`` (habana-packed-narrow, pack-habana --compression none --dtypes narrow), on the golden
    sample's rows: the same files, datasets, shapes and values as the script's, each dataset in its narrowest
    integer type, uncompressed; Habana's packed reader takes the same items from both; the manifest says dtypes
    "narrow" (a key of its own)."""
    ours, _info, m = pack_both(golden_128, tmp_path, L=128, P=76, keep_partial_last=True)
    cfg = HabanaPackConfig(max_sequence_length=128, max_predictions_per_sequence=76, compression="none",
                           dtypes="narrow")
    nar = run_pack_habana(training_files(golden_128), tmp_path / "nar", cfg, manifest_name="../nar.manifest.json")
    assert [f.name for f in nar.files] == [f.name for f in m.files]
    assert nar.params["dtypes"] == "narrow" and nar.params["compression"] == "none" and "dtypes" not in m.params
    assert nar.key != m.key and nar.counters == m.counters
    assert (tmp_path / "nar_metadata.json").read_text() == (tmp_path / "ours_metadata.json").read_text()
    narrow = {"input_ids": "int16", "input_mask": "int8", "segment_ids": "int8", "positions": "int16",
              "masked_lm_positions": "int16", "masked_lm_ids": "int16", "next_sentence_positions": "int16",
              "next_sentence_labels": "int8", "next_sentence_weights": "int8"}
    for f in m.files:
        a, b = read_all(ours / f.name), read_all(tmp_path / "nar" / f.name)
        assert list(a) == list(b) == sorted(narrow)
        for k in a:
            assert b[k].dtype == np.dtype(narrow[k]) and a[k].shape == b[k].shape, k
            np.testing.assert_array_equal(a[k], b[k], err_msg=f"{f.name}:{k}")
        with h5py.File(tmp_path / "nar" / f.name, "r") as h:
            assert [(h[n].compression, h[n].chunks) for n, _, _ in PACKED_DATASETS] == [(None, None)] * 9
        gz = loader_rules.HabanaPackedDataset(ours / f.name, max_pred_length=76)
        nw = loader_rules.HabanaPackedDataset(tmp_path / "nar" / f.name, max_pred_length=76)
        assert len(gz) == len(nw) > 0
        for i in range(0, len(gz), 7):
            for x, y in zip(gz[i], nw[i], strict=True):
                np.testing.assert_array_equal(x, y)


def test_narrow_refuses_token_ids_over_int16_naming_the_input_before_writing(golden_128, tmp_path):
    """A vocabulary over 32,768 tokens: --dtypes narrow would wrap its ids; refused in one line naming the input,
    no packed file written, no manifest."""
    import shutil

    src = tmp_path / "in"
    shutil.copytree(golden_128, src)
    bad = training_files(src)[2]
    with h5py.File(bad, "r+") as f:
        ids = f["input_ids"][:]
        assert f["input_mask"][5].sum() > 2
        ids[5, 1] = 40000  # within row 5's valid tokens
        f["input_ids"][...] = ids
    cfg = HabanaPackConfig(max_sequence_length=128, max_predictions_per_sequence=76, compression="none",
                           dtypes="narrow")
    with pytest.raises(InputError, match=rf"{bad.name}: its rows hold input_ids values from \d+ to 40000.*"
                                         r"use --dtypes script"):
        run_pack_habana(training_files(src), tmp_path / "out", cfg, manifest_name="../out.manifest.json")
    assert not list((tmp_path / "out").glob("*.hdf5")) and not (tmp_path / "out.manifest.json").exists()
    # the script's dtypes store it (int32)
    m = run_pack_habana(training_files(src), tmp_path / "raw", HabanaPackConfig(
        max_sequence_length=128, max_predictions_per_sequence=76, compression="none"),
        manifest_name="../raw.manifest.json")
    assert max(int(read_all(tmp_path / "raw" / f.name)["input_ids"].max()) for f in m.files) == 40000


def test_narrow_is_refused_for_lengths_its_types_cannot_hold(every_128, tmp_path):
    with pytest.raises(InputError, match="--dtypes narrow stores positions as int16.*use --dtypes script"):
        run_pack_habana(training_files(every_128), tmp_path / "o",
                        HabanaPackConfig(max_sequence_length=40000, max_sequences_per_pack=2, dtypes="narrow"))
    with pytest.raises(InputError, match="--dtypes must be one of script, narrow, got 'int8'"):
        run_pack_habana(training_files(every_128), tmp_path / "o", HabanaPackConfig(dtypes="int8"))
    assert not (tmp_path / "o").exists()


def test_compression_is_refused_in_one_line_unless_gzip_or_none(every_128, tmp_path):
    with pytest.raises(InputError, match="--compression must be one of gzip, none, got 'lzf'"):
        run_pack_habana(training_files(every_128), tmp_path / "o",
                        HabanaPackConfig(max_sequence_length=128, max_predictions_per_sequence=20, compression="lzf"))
    assert not (tmp_path / "o").exists()


# -- the DAG layout, the CLI and refusals ---------------------------------------------------------------------------
def test_dag_declaration_plans_one_call_into_the_dag_layout(every_128, tmp_path):
    """The declared stage, planned as flows/dag.py plans it (on the hdf5 stage's per-part results), writes
    <stage>/packed/mixed_strategies_part_<i>.hdf5, <stage>/packed_metadata.json and <stage>/_manifest.json; the
    parts equal a direct run's (MLPerf data: 76 predictions a sequence)."""
    import shutil
    from types import SimpleNamespace

    from core.stage import Plan
    from tests.preprocessing.nvidia_dag import part_hdf5_result

    parts = tmp_path / "parts"
    parts.mkdir()
    for k, p in enumerate(training_files(every_128)[:2]):
        shutil.copyfile(p, parts / f"part-{k:05d}-of-00500.hdf5")
    h5 = part_hdf5_result(sorted(parts.iterdir()), tmp_path / "work")
    st = DAG_STAGES[0]
    params = SimpleNamespace(targets=("samsung-4bins", "habana-packed"), max_seq_length=128,
                             max_predictions_per_seq=20)
    assert st.when(params) and not st.when(SimpleNamespace(targets=("samsung-4bins",)))
    cfg = configure(params)
    assert cfg == HabanaPackConfig(max_sequence_length=128, max_predictions_per_sequence=20)
    units = st.plan(Plan(st, params, cfg, "key", tmp_path / "work", {"hdf5": h5}, {}))
    assert len(units) == 1
    m = units[0].call()
    out = tmp_path / "work" / "habana_packed" / "key"
    assert sorted(p.name for p in out.iterdir()) == ["_manifest.json", "packed", "packed_metadata.json"]
    assert {f.name for f in m.files} == {"packed/mixed_strategies_part_0.hdf5", "packed_metadata.json"}
    assert set(m.upstream) and st.outputs == {"habana_packed_dir": "packed"} and st.reads == ("hdf5",)
    assert loader_rules.habana_avg_seq_per_sample(out / "packed", 128) == pytest.approx(
        m.counters["avg_seq_per_sample"], abs=1e-6)
    direct = run_pack_habana(sorted(parts.iterdir()), tmp_path / "direct", cfg, manifest_name="../d.manifest.json")
    assert [f.md5 for f in direct.files] == [f.md5 for f in m.files if f.name.startswith("packed/")]


def test_the_raw_target_plans_the_same_packs_uncompressed(every_128, tmp_path, monkeypatch):
    """habana-packed-raw: its own stage (a key of its own), the same configuration with compression "none", the
    DAG layout of habana-packed; pack-habana --compression none writes it too."""
    import shutil
    from types import SimpleNamespace

    from core.stage import Plan
    from tests.preprocessing.nvidia_dag import part_hdf5_result

    parts = tmp_path / "parts"
    parts.mkdir()
    shutil.copyfile(training_files(every_128)[1], parts / "part-00000-of-00500.hdf5")
    h5 = part_hdf5_result(sorted(parts.iterdir()), tmp_path / "work")
    gz, raw, _narrow = DAG_STAGES
    params = SimpleNamespace(targets=("habana-packed-raw",), max_seq_length=128, max_predictions_per_seq=20)
    assert raw.when(params) and not gz.when(params) and not raw.when(SimpleNamespace(targets=("habana-packed",)))
    cfg = raw.configure(params)
    assert cfg == HabanaPackConfig(max_sequence_length=128, max_predictions_per_sequence=20, compression="none")
    assert raw.key_params(cfg) == {**gz.key_params(gz.configure(params)), "compression": "none"}
    units = raw.plan(Plan(raw, params, cfg, "key", tmp_path / "work", {"hdf5": h5}, {}))
    m = units[0].call()
    out = tmp_path / "work" / "habana_packed_raw" / "key"
    assert sorted(p.name for p in out.iterdir()) == ["_manifest.json", "packed", "packed_metadata.json"]
    assert raw.outputs == {"habana_packed_raw_dir": "packed"} and m.params["compression"] == "none"
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cli_in").mkdir()
    shutil.copyfile(training_files(every_128)[1], tmp_path / "cli_in" / "x_training.hdf5")
    assert main(["pack-habana", "--input_dir", "cli_in", "--output_dir", "cli", "--max_sequence_length", "128",
                 "--max_predictions_per_sequence", "20", "--compression", "none"]) == 0
    names = [f.name for f in m.files if f.name.startswith("packed/")]
    assert names and [hashlib.md5((tmp_path / "cli" / n[len("packed/"):]).read_bytes()).hexdigest() for n in names] \
        == [f.md5 for f in m.files if f.name in names]


def test_the_narrow_target_plans_the_same_packs_in_narrow_dtypes(golden_128, tmp_path, monkeypatch):
    """habana-packed-narrow: its own stage and key, compression "none" and dtypes "narrow", the DAG layout of
    habana-packed; pack-habana --compression none --dtypes narrow writes the same files."""
    import shutil
    from types import SimpleNamespace

    from core.stage import Plan
    from tests.preprocessing.nvidia_dag import part_hdf5_result

    parts = tmp_path / "parts"
    parts.mkdir()
    shutil.copyfile(training_files(golden_128)[1], parts / "part-00000-of-00500.hdf5")
    h5 = part_hdf5_result(sorted(parts.iterdir()), tmp_path / "work")
    gz, raw, nar = DAG_STAGES
    params = SimpleNamespace(targets=("habana-packed-narrow",), max_seq_length=128, max_predictions_per_seq=76)
    assert nar.when(params) and not gz.when(params) and not raw.when(params)
    assert not nar.when(SimpleNamespace(targets=("habana-packed-raw",)))
    cfg = nar.configure(params)
    assert cfg == HabanaPackConfig(max_sequence_length=128, max_predictions_per_sequence=76, compression="none",
                                   dtypes="narrow")
    assert nar.key_params(cfg) == {**gz.key_params(gz.configure(params)), "compression": "none", "dtypes": "narrow"}
    units = nar.plan(Plan(nar, params, cfg, "key", tmp_path / "work", {"hdf5": h5}, {}))
    m = units[0].call()
    out = tmp_path / "work" / "habana_packed_narrow" / "key"
    assert sorted(p.name for p in out.iterdir()) == ["_manifest.json", "packed", "packed_metadata.json"]
    assert nar.outputs == {"habana_packed_narrow_dir": "packed"} and m.params["dtypes"] == "narrow"
    with h5py.File(out / "packed" / "mixed_strategies_part_0.hdf5", "r") as f:
        assert f["input_ids"].dtype == np.int16 and f["input_mask"].dtype == np.int8
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cli_in").mkdir()
    shutil.copyfile(training_files(golden_128)[1], tmp_path / "cli_in" / "x_training.hdf5")
    assert main(["pack-habana", "--input_dir", "cli_in", "--output_dir", "cli", "--max_sequence_length", "128",
                 "--max_predictions_per_sequence", "76", "--compression", "none", "--dtypes", "narrow"]) == 0
    names = [f.name for f in m.files if f.name.startswith("packed/")]
    assert names and [hashlib.md5((tmp_path / "cli" / n[len("packed/"):]).read_bytes()).hexdigest() for n in names] \
        == [f.md5 for f in m.files if f.name in names]


def test_cli_writes_the_scripts_layout_and_reruns_cleanly(golden_128, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("LOCAL_RANK", "1")  # the script's --local_rank default: seed 42 + 1
    argv = ["pack-habana", "--input_dir", str(golden_128), "--output_dir", "packed", "--max-sequence-length", "128",
            "--max_predictions_per_seq", "76"]
    assert main(argv) == 0
    assert sorted(p.name for p in tmp_path.iterdir()) == ["packed", "packed.manifest.json", "packed_metadata.json"]
    assert [p.name for p in (tmp_path / "packed").iterdir()] == ["mixed_strategies_part_0.hdf5"]
    manifest = json.loads((tmp_path / "packed.manifest.json").read_text())
    assert manifest["stage"] == "pack_habana" and manifest["params"]["local_rank"] == 1
    assert [f["name"] for f in manifest["files"]] == ["mixed_strategies_part_0.hdf5"]
    info = ref.pack(golden_128, tmp_path / "theirs", L=128, P=76, local_rank=1, keep_partial_last=True)
    assert_same_packs(tmp_path / "packed", tmp_path / "theirs", info["files"])
    # a re-run with the script's rule (no partial file: nothing, for 800 packs) leaves no stale part behind
    assert main([*argv, "--keep_partial_last=False"]) == 0
    assert list((tmp_path / "packed").iterdir()) == []
    assert json.loads((tmp_path / "packed.manifest.json").read_text())["counters"]["dropped_packs"] == info["packs"]


def test_cli_refuses_in_one_line(every_128, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    base = ["pack-habana", "--input_dir", str(every_128), "--max_sequence_length", "128"]
    for argv, needle in (([*base, "--output_dir", "busy"], "notes.txt"),
                         ([*base, "--output_dir", "o", "--max_sequences_per_pack", "1"], "--max_sequences_per_pack"),
                         ([*base, "--output_dir", "o", "--seed", "0", "--local_rank", "-1"], "--seed"),
                         ([*base[:2], str(tmp_path), "--output_dir", "o"], "training")):
        try:
            rc = main(argv)
        except SystemExit as exc:  # argparse's refusals
            rc = exc.code
        err = capsys.readouterr().err.strip().splitlines()
        assert rc == 2 and len(err) == 1 and needle in err[0] and "Traceback" not in err[0], err
    assert (tmp_path / "busy" / "notes.txt").read_text() == "mine" and not (tmp_path / "o").exists()


@pytest.mark.parametrize("bad,needle,err", [
    ("zero-length", "row 1 has sequence length 0", RecordError),
    ("too-long", "raise --max_sequence_length", RecordError),
    ("masked-outside", "dataset 'masked_lm_positions' row 0: position 11 outside the row's 10 tokens", RecordError),
    ("too-many-predictions", "raise --max_predictions_per_sequence", InputError),
    ("missing-dataset", "no dataset 'masked_lm_ids'", InputError),
    ("not-hdf5", "not a readable HDF5", InputError),
])
def test_bad_input_is_one_line_naming_the_file(bad, needle, err, tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    p = d / "x_training.hdf5"
    L = 32
    write_padded(p, [10, 4, 20, 30, 2, 2], width=64, preds=12, seed=0)
    with h5py.File(p, "r+") as f:
        if bad == "zero-length":
            f["input_mask"][1] = 0
        elif bad == "too-long":
            f["input_mask"][2, :40] = 1
        elif bad == "masked-outside":
            f["masked_lm_positions"][0, 0] = 11
        elif bad == "missing-dataset":
            del f["masked_lm_ids"]
    if bad == "not-hdf5":
        p.write_bytes(b"not hdf5")
    cfg = HabanaPackConfig(max_sequence_length=L, max_predictions_per_sequence=1 if bad == "too-many-predictions" else 8)
    with pytest.raises(err) as exc:
        run_pack_habana(training_files(d), tmp_path / "out", cfg, manifest_name="../out.manifest.json")
    msg = str(exc.value)
    assert needle in msg and "\n" not in msg
    assert "x_training.hdf5" in msg or bad == "too-many-predictions"
    assert not (tmp_path / "out.manifest.json").exists()


# -- full size (slow: SciPy's NNLS at 512 takes minutes on a small machine) -----------------------------------------
@pytest.fixture
def nnls_once(monkeypatch):
    """Both packers call scipy.optimize.nnls with the same arrays: solve each system once (the real solver)."""
    from scipy import optimize

    real, memo = optimize.nnls, {}

    def cached(A, b, **kw):
        key = (hashlib.md5(np.ascontiguousarray(A).tobytes()).hexdigest(), np.asarray(b, np.float64).tobytes())
        if key not in memo:
            memo[key] = real(A, b, **kw)
        x, r = memo[key]
        return x.copy(), r

    monkeypatch.setattr(optimize, "nnls", cached)
    return memo


@pytest.mark.slow
def test_golden_sample_at_512_as_the_script(golden, tmp_path, nnls_once):
    """The whole golden sample (12,606 rows, 512/76) in 4 *training* files, packed at 512 as Habana's MLPerf
    README runs the script (--max_predictions_per_seq=76)."""
    d = tmp_path / "in"
    with h5py.File(golden / "sample.hdf5", "r") as f:
        n = len(f["input_ids"])
    split_into(golden / "sample.hdf5", d, np.arange(n), 512, 4)
    ours, info, m = pack_both(d, tmp_path, L=512, P=76, keep_partial_last=True)
    assert info["files"] == m.counters["files"] and info["packs"] == m.counters["packs"]
    assert_same_packs(ours, tmp_path / "theirs", info["files"])
    check_packs(ours, d, 512, 3, P=76)


@pytest.mark.slow
def test_every_length_to_512_as_the_script(tmp_path, nnls_once):
    d = tmp_path / "in"
    d.mkdir()
    lengths = np.tile(np.arange(1, 513), 3)
    np.random.default_rng(5).shuffle(lengths)
    for k, chunk in enumerate(np.array_split(lengths, 3)):
        write_padded(d / f"e_training_{k}.hdf5", chunk, width=512, preds=76, seed=k, first_id=2000 * k)
    ours, info, m = pack_both(d, tmp_path, L=512, P=76, keep_partial_last=True)
    assert_same_packs(ours, tmp_path / "theirs", info["files"])
    check_packs(ours, d, 512, 3, P=76)


def test_build_packs_into_a_space_used_again_gives_what_fresh_arrays_give():
    """write_group builds file after file into one pack_fast.Space: the second file's arrays (fewer packs, other
    lengths) are what a fresh call gives, whatever the first left in the buffers."""
    from preprocessing import pack_fast
    from preprocessing.habana.pack import build_packs

    if not pack_fast.available():
        pytest.skip("the C loop is not built")
    rng = np.random.default_rng(3)
    cfg = HabanaPackConfig(max_sequence_length=64, max_predictions_per_sequence=10)

    def packs(n: int) -> tuple:
        slots = np.full((n, 3), -1, np.int64)
        seq_l, k = [], 0
        for i in range(n):
            lens = rng.integers(4, 22, rng.integers(1, 4))
            for j, ln in enumerate(lens):
                slots[i, j] = k
                k += 1
                seq_l.append(ln)
        seq = np.array(seq_l, np.int64)
        pred = np.minimum(rng.integers(1, 4, len(seq)), seq)
        rows = {"input_ids": rng.integers(5, 30000, int(seq.sum())).astype(np.int32),
                "segment_ids": rng.integers(0, 2, int(seq.sum())).astype(np.int8),
                "masked_lm_positions": np.concatenate([np.sort(rng.choice(int(s), int(p), replace=False))
                                                       for s, p in zip(seq, pred, strict=True)]).astype(np.int32),
                "masked_lm_ids": rng.integers(5, 30000, int(pred.sum())).astype(np.int32),
                "next_sentence_labels": rng.integers(0, 2, len(seq)).astype(np.int8)}
        return slots, seq, pred, rows

    space = pack_fast.Space()
    first, second = packs(40), packs(25)
    build_packs(*first, cfg, "a", space)
    got = build_packs(*second, cfg, "b", space)
    want = build_packs(*second, cfg, "b")
    assert set(got) == set(want)
    for name in want:
        assert got[name].dtype == want[name].dtype and np.array_equal(got[name], want[name]), name


@pytest.mark.parametrize("dtypes", ["narrow", "script"])
def test_uncompressed_files_written_straight_into_their_images_are_hdf5s_bytes(golden_128, tmp_path, monkeypatch,
                                                                                 dtypes):
    """--compression none: each file's values are built straight into its image at the offsets HDF5 gives them
    (packed_layout; the file's other bytes HDF5's, taken once per shape): the same bytes, file for file, as the
    files HDF5 itself writes from the same arrays (the layout turned off), the last, shorter file included."""
    import preprocessing.habana.pack as hp

    if pack_fast.native() is None:
        pytest.skip("without the C extension every file goes through HDF5")
    cfg = HabanaPackConfig(max_sequence_length=128, max_predictions_per_sequence=76, compression="none",
                           dtypes=dtypes, keep_partial_last=True)
    used = []
    real = hp.packed_layout

    def spy(n, c):
        got = real(n, c)
        used.append((n, got is not None))
        return got

    monkeypatch.setattr(hp, "packed_layout", spy)
    kinds = set()
    real_build = hp.build_packs

    def seen(slots, seq, pred, rows, *a, **k):
        kinds.update(type(rows[n]).__name__ for n in ("input_ids", "segment_ids"))
        return real_build(slots, seq, pred, rows, *a, **k)

    monkeypatch.setattr(hp, "build_packs", seen)
    laid = run_pack_habana(training_files(golden_128), tmp_path / "laid", cfg, manifest_name="../laid.manifest.json")
    assert any(ok for _, ok in used), used
    assert kinds == {"RowRuns", "SegmentRuns"}  # token ids and segment ids copied once, from where the group read them
    monkeypatch.setattr(hp, "packed_layout", lambda n, c: None)
    plain = run_pack_habana(training_files(golden_128), tmp_path / "plain", cfg,
                            manifest_name="../plain.manifest.json")
    assert [(f.name, f.md5) for f in laid.files] == [(f.name, f.md5) for f in plain.files] != []
    for f in laid.files:
        assert hashlib.md5((tmp_path / "laid" / f.name).read_bytes()).hexdigest() == f.md5
    assert hp.packed_layout(5, HabanaPackConfig()) is None  # gzip: through HDF5
