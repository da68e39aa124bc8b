"""The chop, the shuffle and the varlength eval pick read their inputs in place (padded parts through memory maps;
variable-length shards straight from their HDF5 global heap collections) and check rows with a few reductions.
These tests hold the fast paths to the careful ones (h5py reads, the checks one by one): the same bytes, the same
refusals, and a fallback wherever a file is not laid out as expected; and the shuffle's memory at full size."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from pathlib import Path

import h5py
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/preprocessing: the shared helpers
import nvidia_reference as ref  # noqa: E402

from core.errors import InputError, RecordError  # noqa: E402
from preprocessing import pack_fast  # noqa: E402
from preprocessing.nvidia import chop, shuffle, varlength  # noqa: E402
from preprocessing.nvidia.chop import ChopConfig, run_nvidia_chop  # noqa: E402
from preprocessing.nvidia.eval_pick import PickVarlenConfig, run_pick_eval_varlength  # noqa: E402
from preprocessing.nvidia.shuffle import ShuffleConfig, input_files, plan_memory, run_nvidia_shuffle  # noqa: E402

ROOT = Path(__file__).resolve().parents[3]


def digests(d: Path) -> dict[str, str]:
    return {p.name: hashlib.md5(p.read_bytes()).hexdigest() for p in sorted(d.glob("*.hdf5"))}


@pytest.fixture(scope="module")
def parts(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("parts")
    lengths = list(range(1, 513)) + [512] * 40 + [9] * 60
    np.random.default_rng(3).shuffle(lengths)
    for i, chunk in enumerate([lengths[:250], lengths[250:251], lengths[251:]]):
        ref.write_padded(d / f"part-{i:05d}-of-00500.hdf5", ref.padded_rows(chunk, i))
    return d


def careful(monkeypatch) -> None:
    """Every fast path off: h5py reads, the checks one by one, NumPy cuts."""
    monkeypatch.setattr(chop, "mapped_padded", lambda f, path: None)
    monkeypatch.setattr(varlength, "mapped_padded", lambda f, path: None)
    monkeypatch.setattr(varlength, "_fast_ok", lambda rows, width: None)
    monkeypatch.setattr(shuffle, "_mapped_rows", lambda f, path, n: None)
    monkeypatch.setattr(pack_fast, "cut_padded", lambda rows, space=None: None)


@pytest.mark.parametrize("rule", ["v3.1", "v1.1"])
def test_chop_shuffle_and_pick_write_the_same_bytes_either_way(parts, tmp_path, monkeypatch, rule):
    files = chop.input_files(parts)
    fast, slow = tmp_path / "fast", tmp_path / "slow"
    for out in (fast, slow):
        if out is slow:
            careful(monkeypatch)
        run_nvidia_chop(files, out / "chop", ChopConfig(num_shards=7, varlength=True, rule=rule, chunk_rows=50))
        run_nvidia_shuffle(input_files(out / "chop"), out / "shuf", ShuffleConfig(chunk_rows=33, bucket_rows=200),
                           workers=1)
        run_pick_eval_varlength(files[0], out / "eval", PickVarlenConfig(num_examples_to_pick=37, chunk_rows=16))
    for sub in ("chop", "shuf", "eval"):
        assert digests(fast / sub) == digests(slow / sub) and digests(fast / sub)


NATIVE = pytest.mark.skipif(not pack_fast.available(), reason="the in-place read gathers with the C extension")


@NATIVE
def test_in_place_rows_equal_h5py_on_the_scripts_shards(parts, tmp_path):
    """Shards written row by row by NVIDIA's convert_fixed2variable.py (re-enacted) and by chop: read in place,
    the rows are h5py's."""
    padded = Path(ref.chop_hdf5_files(str(parts), str(tmp_path / "chop"), 3))
    shards = []
    for p in sorted(padded.iterdir()):
        ref.convert_fixed2variable(str(p), str(tmp_path / p.name))
        shards.append(tmp_path / p.name)
    run_nvidia_chop(chop.input_files(parts), tmp_path / "ours", ChopConfig(num_shards=3, varlength=True))
    shards += sorted((tmp_path / "ours").glob("part_*.hdf5"))
    for p in shards:
        with shuffle.open_varlength(p) as f:
            n = f["input_ids"].shape[0]
            rows = shuffle._mapped_rows(f, p, n)
            assert rows is not None, p
            got = rows.gathered(np.arange(n))
            for name, _ in shuffle.VLEN:
                want = f[name][:]
                assert np.array_equal(got[name], np.concatenate(list(want))), (p, name)
            assert np.array_equal(rows.seq, [len(r) for r in f["input_ids"][:]])
            assert np.array_equal(rows.pred, [len(r) for r in f["masked_lm_positions"][:]])
            assert np.array_equal(rows.nsl, f["next_sentence_labels"][:])


def _vlen_file(path: Path, rows: list[list[int]], *, between: bool = False, attribute: bool = False) -> None:
    with h5py.File(path, "w") as f:
        for name, dt in shuffle.VLEN:
            ds = f.create_dataset(name, (len(rows),), dtype=h5py.vlen_dtype(np.dtype(dt)))
            for i, r in enumerate(rows):
                ds[i] = np.array(r if name in ("input_ids", "segment_ids") else r[:2], dtype=dt) % 2 \
                    if name == "segment_ids" else np.array(r if name == "input_ids" else r[:2], dtype=dt)
                if between and i == 1:  # another dataset's object between ours, in the same collection
                    f.create_dataset(f"extra_{name}", (1,), dtype=h5py.vlen_dtype(np.dtype("int16")))[0] = [5, 6, 7]
        f.create_dataset("next_sentence_labels", data=np.zeros(len(rows), dtype="i1"))
        if attribute:
            f.attrs.create("note", ["text"], dtype=h5py.string_dtype())


@NATIVE
@pytest.mark.parametrize("kind", ["plain", "between", "attribute"])
def test_in_place_rows_check_every_object_or_fall_back(tmp_path, kind):
    """Objects that are not the shard's (another dataset's between its rows, an attribute's string) either leave
    the shard's rows where the computed offsets say (checked object by object) or send the read to h5py."""
    p = tmp_path / "x.hdf5"
    rows = [[3, 4, 5], [6, 7, 8, 9], [10, 11], [12, 13, 14, 15, 16]]
    _vlen_file(p, rows, between=kind == "between", attribute=kind == "attribute")
    with shuffle.open_varlength(p) as f:
        got = shuffle._mapped_rows(f, p, len(rows))
        if kind == "between":
            assert got is None
        else:
            assert got is not None
            assert got.gathered(np.arange(len(rows)))["input_ids"].tolist() == sum(rows, [])
        every = shuffle.read_rows(f, p, len(rows), 2)  # whichever path: h5py's rows
        assert every.gathered(np.arange(len(rows)))["input_ids"].tolist() == sum(rows, [])


def test_a_damaged_heap_object_sends_the_read_to_h5py(tmp_path):
    p = tmp_path / "x.hdf5"
    _vlen_file(p, [[3, 4, 5], [6, 7, 8, 9]])
    raw = bytearray(p.read_bytes())
    at = raw.index(b"GCOL")
    raw[at + 16 + 8] = 99  # the first object's size
    p.write_bytes(bytes(raw))
    with shuffle.open_varlength(p) as f:
        assert shuffle._mapped_rows(f, p, 2) is None


def _corrupt(parts: Path, tmp_path: Path, name: str, row: int, col: int, value: int) -> Path:
    d = tmp_path / "bad"
    d.mkdir()
    rows = ref.padded_rows([20, 30, 40, 50], 0)
    rows[name][row, col] = value
    ref.write_padded(d / "part-00000-of-00500.hdf5", rows)
    return d / "part-00000-of-00500.hdf5"


@pytest.mark.parametrize("name,col,value,error,match", [
    ("input_ids", 45, -1, RecordError, r"dataset 'input_ids' row 2: token id -1"),  # in the padding: refused
    ("input_ids", 3, 40000, InputError, r"row 2: input_ids holds a value outside int16"),
    ("segment_ids", 60, 2, RecordError, r"dataset 'segment_ids' row 2: value 2"),
    ("input_mask", 45, 1, RecordError, r"dataset 'input_mask' row 2: a 1 after a 0"),
    ("masked_lm_positions", 1, 45, RecordError, r"dataset 'masked_lm_positions' row 2: position 45"),
])
def test_refusals_are_the_careful_paths(parts, tmp_path, monkeypatch, name, col, value, error, match):
    """A rule broken anywhere in a row (its padding too) is refused by chop and the pick as the checks one by one
    refuse it: the fast checks only decide that nothing is wrong."""
    src = _corrupt(parts, tmp_path, name, 2, col, value)
    for run in (lambda o: run_nvidia_chop([src], o, ChopConfig(num_shards=2, varlength=True)),
                lambda o: run_pick_eval_varlength(src, o, PickVarlenConfig(num_examples_to_pick=4))):
        with pytest.raises(error, match=match):
            run(tmp_path / "out")


def test_chop_hashes_its_shards_in_groups():
    """Shards are written in groups of up to 16, hashed side by side in one md5_files call (not one by one)."""
    assert chop.group_count(156_725_653, 4320, 1) == 270 and chop.group_count(156_725_653, 4320, 2) == 270
    assert chop.group_count(185_595, 5, 1) == 1 and chop.group_count(185_595, 5, 2) == 2
    assert chop.group_count(10, 2048, 200) == 200
    # as many groups for each worker, of even sizes: 41 shards on 2 workers are 4 groups of 10-11 (not 16, 16, 9)
    assert chop.group_count(1_484_760, 41, 2) == 4 and chop.group_count(1_484_760, 41, 1) == 3
    assert chop.group_count(1_484_760, 41, 16) == 16


@pytest.mark.parametrize("workers", [1, 2, 3, 16])
def test_the_shuffle_cuts_even_buckets_for_its_workers(workers: int) -> None:
    """Buckets of whole shards, as many for each worker, each within a shard of its even share of the rows (8
    parts' 40 shards on 2 workers: 4 buckets of 10 shards, not 524 k, 524 k and 436 k rows)."""
    files = [(f"part_{k:05d}_of_00040.hdf5", 37119 + (k % 5 == 0)) for k in range(40)]
    plan = shuffle._rebuild(files, Path("/nonexistent"), ShuffleConfig(), workers)
    rows = np.diff(plan.bucket_rows())
    n_b = len(rows)
    assert n_b % workers == 0 or n_b == len(files)
    assert rows.max() <= ShuffleConfig().bucket_rows + 37120, "at most about one shard over bucket_rows"
    share = sum(c for _, c in files) / n_b
    assert np.abs(rows - share).max() <= 37120, (rows, share)
    assert list(plan.bucket_shards) == sorted(set(plan.bucket_shards)) and plan.bucket_shards[-1] == len(files)
    if workers == 2:
        assert plan.bucket_shards == (0, 10, 20, 30, 40)


def test_the_shuffle_stays_under_1_5_gb_at_full_size():
    """NVIDIA's full set (156,725,653 rows in 4,320 shards): the permutation step, a scatter call and a gather call
    each hold well under 1.5 GB (rows of 512 tokens and 76 predictions: the largest)."""
    for tokens, preds in ((256, 40), (512, 76)):
        mem = plan_memory(156_725_653, tokens_per_row=tokens, preds_per_row=preds)
        assert max(mem.values()) < 1.5e9, mem
        assert mem["plan"] < 0.7e9 and mem["scatter_padded"] < 0.4e9


def test_the_permutation_step_holds_one_array_of_indices(tmp_path):
    """make_plan at 20 M rows, in a process of its own: its peak RSS grows by about one array of 4-byte indices
    (the permutation, then its inverse), not three (the permutation, the inverse and an arange)."""
    n = 20_000_000
    code = f"""
import resource, sys
sys.path.insert(0, {str(ROOT)!r})
import numpy as np
from preprocessing.nvidia.shuffle import ShuffleConfig, make_plan
from preprocessing import pack_fast, pyrandom
pyrandom.shuffle_permutation(10, 24)  # the libraries in place before the baseline
np.save({str(tmp_path / 'warm.npy')!r}, np.zeros(10))
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
make_plan([("a", {n // 2}), ("b", {n - n // 2})], {str(tmp_path / 'scratch')!r}, ShuffleConfig())
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base)
"""
    grew = int(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout)
    assert grew < 4 * n * 1.25 + (64 << 20), grew
    perm = np.load(tmp_path / "scratch" / "perm.npy")
    inv = np.load(tmp_path / "scratch" / "inv.npy")
    assert np.array_equal(inv[perm], np.arange(n))


def _padded(n: int, w: int = 32, pw: int = 6, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    seq = rng.integers(1, w + 1, n)
    seq[:3] = (1, w, w)
    pred = np.minimum(rng.integers(0, pw + 1, n), seq - 1)
    rows = {"input_mask": (np.arange(w) < seq[:, None]).astype(np.int8),
            "input_ids": np.where(np.arange(w) < seq[:, None], rng.integers(0, 32768, (n, w)), 0).astype(np.int32),
            "segment_ids": np.where(np.arange(w) < seq[:, None], rng.integers(0, 2, (n, w)), 0).astype(np.int8),
            "masked_lm_positions": np.zeros((n, pw), np.int32), "masked_lm_ids": np.zeros((n, pw), np.int32),
            "next_sentence_labels": rng.integers(0, 2, n).astype(np.int8)}
    for i in range(n):
        p = np.sort(rng.choice(np.arange(1, seq[i]), pred[i], replace=False)) if pred[i] else []
        rows["masked_lm_positions"][i, :len(p)] = p
        rows["masked_lm_ids"][i, :len(p)] = rng.integers(0, 32768, len(p))
    return rows


@NATIVE
def test_the_c_cut_equals_numpy_and_refuses_what_the_checks_refuse(monkeypatch):
    rows = _padded(300)
    cut = pack_fast.cut_padded(rows)
    monkeypatch.setattr(pack_fast, "cut_padded", lambda r, space=None: None)
    want = varlength.compact_padded(rows, Path("x"), 0, 32)
    seq, pred, ids, seg, pos, mlm, nsl = cut
    assert np.array_equal(seq, want.seq) and np.array_equal(pred, want.pred) and np.array_equal(nsl, want.nsl)
    for got, name in ((ids, "input_ids"), (seg, "segment_ids"), (pos, "masked_lm_positions"), (mlm, "masked_lm_ids")):
        assert got.dtype == want.flat[name].dtype and np.array_equal(got, want.flat[name]), name
    monkeypatch.undo()
    for name, at, value in (("input_mask", (5, 31), 1), ("input_mask", (5, 0), 2), ("input_mask", (5, 0), 0),
                            ("input_ids", (5, 31), -1), ("input_ids", (5, 0), 32768), ("segment_ids", (5, 31), 2),
                            ("masked_lm_positions", (5, 5), -3), ("masked_lm_positions", (1, 0), 40000),
                            ("masked_lm_ids", (5, 5), 32768), ("next_sentence_labels", (5,), 2)):
        bad = {k: v.copy() for k, v in rows.items()}
        bad[name][at] = value
        assert pack_fast.cut_padded(bad) is False, (name, at, value)
    bad = {k: v.copy() for k, v in rows.items()}
    bad["masked_lm_positions"][0, 0] = 1  # row 0 has one token: position 1 is outside it
    assert pack_fast.cut_padded(bad) is False
    assert pack_fast.cut_padded({**rows, "input_ids": rows["input_ids"].astype(np.int64)}) is None  # NumPy's path


@NATIVE
def test_a_space_used_again_gives_what_fresh_arrays_give():
    """pack_fast.Space: the cut's and the gather's buffers used chunk after chunk (larger chunks grow them): every
    result equals a cut into fresh arrays, and is a view of the space's buffer."""
    space = pack_fast.Space()
    for rows in (_padded(300, seed=1), _padded(500, seed=2), _padded(40, seed=3)):
        got, want = pack_fast.cut_padded(rows, space), pack_fast.cut_padded(rows)
        assert [(g.dtype, g.tolist()) for g in got] == [(w.dtype, w.tolist()) for w in want]
        assert np.shares_memory(got[2], space.get("cut_ids", 1, np.int16))
        order = np.random.default_rng(len(got[0])).permutation(len(got[0]))
        ends = np.cumsum(want[0])
        g = pack_fast.gather_runs([got[2]], None, (ends - want[0])[order], got[0][order], np.int16, space=space,
                                  name="g")
        assert g.tolist() == [v for i in order for v in want[2][ends[i] - want[0][i]:ends[i]].tolist()]
        assert np.shares_memory(g, space.get("g", 1, np.int16))
