"""preprocessing.pack_fast (the C loops of preprocessing/_pack_native/pack.c) and its NumPy fallbacks: the same
results as the plain definitions (CPython's own ``random.Random.shuffle``, concatenated slices, ``json.dumps``),
in both modes; and pack-nvidia writes the same files in both."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from core.errors import InputError
from preprocessing import pack_fast
from preprocessing.pyrandom import PY_TAIL, Shuffles

MODES = ("native", "numpy")


def require_native() -> None:
    if pack_fast.native() is None:
        if shutil.which(os.environ.get("CC") or "cc") and os.environ.get("BERTPIPE_NATIVE", "1") != "0":
            pytest.fail(f"a C compiler exists but the packing extension is unavailable: {pack_fast._NATIVE.reason}")
        pytest.skip(pack_fast._NATIVE.reason)


@pytest.fixture(params=MODES)
def mode(request, monkeypatch) -> str:
    """Each test twice: with the C extension, and with it off (as BERTPIPE_NATIVE=0 or no compiler)."""
    if request.param == "native":
        require_native()
    else:
        monkeypatch.setattr(pack_fast._NATIVE, "module", None)
        monkeypatch.setattr(pack_fast._NATIVE, "reason", "disabled by BERTPIPE_NATIVE=0")
    return request.param


# -- shuffles -----------------------------------------------------------------------------------------------------------
def test_successive_shuffles_equal_cpythons(mode):
    """One generator, many shuffles in a row (as generate_packing_strategy.py): sizes around the NumPy path's
    blocks (PY_TAIL) and the edges 0, 1, 2; the generator's state after them is CPython's."""
    sizes = [0, 1, 2, 3, 17, 1000, PY_TAIL - 1, PY_TAIL + 1, 5, 200_003, 0, 2]
    for seed in (0, 12345, 2**70 + 3):
        ours, theirs = Shuffles(seed), random.Random(seed)
        for n in sizes:
            x = list(range(n))
            theirs.shuffle(x)
            got = ours.permutation(n)
            assert got.tolist() == x, (mode, seed, n)
            assert got.dtype == (np.int32 if n > 1 else np.int64)
        if mode == "native":
            assert tuple(int(v) for v in ours.state) == theirs.getstate()[1]


def test_a_shuffle_too_large_for_the_c_loop_hands_the_stream_over(monkeypatch):
    """When the C loop cannot take a size, that shuffle and every later one go to the NumPy blocks, from the
    generator's state where the C loop left it."""
    require_native()
    real = pack_fast.native_shuffle
    monkeypatch.setattr(pack_fast, "native_shuffle", lambda state, n: None if n == 7000 else real(state, n))
    ours, theirs = Shuffles(99), random.Random(99)
    for n in (300, 7000, 4000, 90_000):
        x = list(range(n))
        theirs.shuffle(x)
        assert ours.permutation(n).tolist() == x, n
    assert ours.state is None and ours.stream is not None


def test_shuffle_in_place_equals_cpythons_shuffle_of_the_values(mode):
    """``Shuffles.shuffle(x)``: x's own values (any, of 4 or 8 bytes) shuffled where they lie, as CPython shuffles a
    list of them, between permutations drawn from the same generator; a view into a larger array leaves the rest."""
    rng = np.random.default_rng(5)
    for seed in (0, 41):
        ours, theirs = Shuffles(seed), random.Random(seed)
        for n, dt in ((0, np.int32), (1, np.int32), (2, np.int64), (17, np.int32), (PY_TAIL + 3, np.int64),
                      (100_001, np.int32), (5, np.int32)):
            buf = rng.integers(-1, 10**6, n + 6).astype(dt)
            want = buf.tolist()
            mid = want[3:3 + n]
            theirs.shuffle(mid)
            want[3:3 + n] = mid
            ours.shuffle(buf[3:3 + n])
            assert buf.tolist() == want, (mode, seed, n)
            x = list(range(7))
            theirs.shuffle(x)
            assert ours.permutation(7).tolist() == x


def test_negative_size_is_refused(mode):
    with pytest.raises(ValueError, match="n must be >= 0"):
        Shuffles(1).permutation(-1)


# -- gathering runs -----------------------------------------------------------------------------------------------------------
def plain_gather(sources, which, starts, lens, dtype):
    parts = [sources[0 if which is None else int(w)][int(s):int(s) + int(n)]
             for w, s, n in zip(which if which is not None else [0] * len(starts), starts, lens, strict=True)]
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)


@pytest.mark.parametrize("src_dt,out_dt", [("int32", "int16"), ("int16", "int16"), ("int8", "int8"),
                                           ("int64", "int32"), ("int8", "int16"), ("int32", "int8")])
def test_gather_runs_equals_concatenated_slices(mode, src_dt, out_dt):
    rng = np.random.default_rng(5)
    lo, hi = np.iinfo(out_dt).min, np.iinfo(out_dt).max
    lo, hi = max(lo, np.iinfo(src_dt).min), min(hi, np.iinfo(src_dt).max)
    sources = [rng.integers(lo, hi + 1, n).astype(src_dt) for n in (0, 1, 5000, 777)]
    runs = 6000
    which = rng.choice([1, 2, 3], runs)
    sizes = np.array([len(s) for s in sources])[which]
    lens = rng.integers(0, 40, runs)
    lens = np.minimum(lens, sizes)
    starts = (rng.random(runs) * (sizes - lens + 1)).astype(np.int64)
    got = pack_fast.gather_runs(sources, which, starts, lens, out_dt)
    assert got.dtype == np.dtype(out_dt)
    assert np.array_equal(got, plain_gather(sources, which, starts, lens, out_dt))
    one = pack_fast.gather_runs([sources[2]], None, starts[which == 2], lens[which == 2], out_dt)
    assert np.array_equal(one, plain_gather([sources[2]], None, starts[which == 2], lens[which == 2], out_dt))


@pytest.mark.parametrize("misaligned", [False, True])
def test_gather_runs_into_a_given_array_aligned_or_not(mode, misaligned):
    """``out=``: the runs written into the caller's array (any shape holding exactly their values), returned; one at
    an odd address (a dataset HDF5 placed so, in a laid-out image) gets the same values through an aligned buffer."""
    rng = np.random.default_rng(9)
    src = rng.integers(-30000, 30000, 4000).astype(np.int32)
    starts, lens = np.array([5, 100, 0, 3000]), np.array([40, 0, 60, 100])
    raw = np.zeros(2 * 200 + 8, np.uint8)
    out = np.ndarray((2, 100), np.int16, buffer=raw, offset=1 if misaligned else 2)
    assert out.flags.aligned is not misaligned
    got = pack_fast.gather_runs([src], None, starts, lens, np.int16, out=out, space=pack_fast.Space())
    assert got is out
    np.testing.assert_array_equal(out.reshape(-1), plain_gather([src], None, starts, lens, np.int16))
    assert raw[0] == 0 and not raw[402:].any()  # nothing written outside it
    with pytest.raises(ValueError, match="out must be a writable C-contiguous array of 200 int16"):
        pack_fast.gather_runs([src], None, starts, lens, np.int16, out=np.zeros(199, np.int16))
    with pytest.raises(ValueError, match="out must be"):
        pack_fast.gather_runs([src], None, starts, lens, np.int16, out=np.zeros(200, np.int32))


def test_gather_runs_names_the_first_value_out_of_range(mode):
    src = np.arange(-10, 40_000, dtype=np.int32)
    starts, lens = np.array([0, 32_700, 39_000, 5]), np.array([3, 100, 10, 2])
    with pytest.raises(pack_fast.OutOfRange) as e:
        pack_fast.gather_runs([src], None, starts, lens, "int16")
    # run 1 holds values 32,690..32,789: the first above 32,767 is its 78th (index 3 + 77 in the output)
    assert e.value.index == 3 + (32_767 - 32_690) + 1
    assert pack_fast.gather_runs([src], None, np.array([0]), np.array([20]), "int8").tolist() == list(range(-10, 10))
    with pytest.raises(pack_fast.OutOfRange) as e:  # values 100..139 into int8: 128 is the first that does not fit
        pack_fast.gather_runs([src], None, np.array([0, 110]), np.array([2, 40]), "int8")
    assert e.value.index == 2 + 28


@pytest.mark.parametrize("src_dt", ["int8", "int16", "int32", "int64"])
def test_gather_runs_checks_bounds_as_it_copies(mode, src_dt):
    """lo..hi: the same output as unbounded where every value lies inside; else the first value outside (in output
    order), a value that the conversion would wrap included."""
    rng = np.random.default_rng(3)
    src = rng.integers(0, 2, 5000).astype(src_dt)
    starts = np.array([0, 100, 4000, 7, 4999])
    lens = np.array([50, 0, 900, 3, 1])
    got = pack_fast.gather_runs([src], None, starts, lens, "int8", lo=0, hi=1)
    assert np.array_equal(got, pack_fast.gather_runs([src], None, starts, lens, "int8"))
    bad = src.copy()
    bad[4100] = -1
    bad[4200] = 2
    with pytest.raises(pack_fast.OutOfRange) as e:
        pack_fast.gather_runs([bad], None, starts, lens, "int8", lo=0, hi=1)
    assert e.value.index == 50 + 100
    if np.dtype(src_dt).itemsize > 1:
        wide = src.copy()
        wide[10] = 256  # 0 once wrapped into int8
        with pytest.raises(pack_fast.OutOfRange) as e:
            pack_fast.gather_runs([wide], None, starts, lens, "int8", lo=0, hi=1)
        assert e.value.index == 10
    assert pack_fast.gather_runs([src], None, starts, lens, "int16", lo=0).tolist() == got.tolist()


def test_mask_lengths_counts_the_leading_ones_and_finds_the_first_bad_row(mode):
    m = (np.arange(16) < np.array([3, 16, 0, 1, 7])[:, None]).astype(np.int8)
    lengths, bad = pack_fast.mask_lengths(m)
    assert lengths.tolist() == [3, 16, 0, 1, 7] and bad == -1
    for row, col, value in ((2, 5, 1), (3, 0, 2), (4, 15, -1), (0, 1, 0)):
        b = m.copy()
        b[row, col] = value
        assert pack_fast.mask_lengths(b)[1] == row, (row, col, value)
    b = m.copy()
    b[3, 9], b[1, 2] = 1, 5
    assert pack_fast.mask_lengths(b)[1] == 1


@pytest.mark.parametrize("width", [1, 7, 8, 9, 15, 16, 17, 63, 64, 77, 512])
def test_mask_lengths_equals_numpy_at_every_width_and_corruption(mode, width):
    """The C loop reads the leading 1s eight bytes at a time: the same lengths and first bad row as a plain count,
    whatever the width (not a multiple of 8 too) and wherever a row goes wrong (a 0 inside the 1s, a 2 among
    them, a 1 or a -1 in the padding, in or past the last 8-byte word)."""
    rng = np.random.default_rng(width)
    n = 64
    lens = rng.integers(0, width + 1, n)
    lens[:3] = [0, width, width // 2]
    m = (np.arange(width) < lens[:, None]).astype(np.int8)
    got, bad = pack_fast.mask_lengths(m)
    assert got.tolist() == lens.tolist() and bad == -1

    def want(b: np.ndarray) -> int:
        for r, row in enumerate(b):
            k = int(np.argmin(row == 1)) if (row != 1).any() else width
            if row[k:].any():
                return r
        return -1

    for _ in range(40):
        b = m.copy()
        r, c = int(rng.integers(0, n)), int(rng.integers(0, width))
        b[r, c] = rng.choice([0, 1, 2, -1])
        assert pack_fast.mask_lengths(b)[1] == want(b), (r, c, b[r, c])


@pytest.mark.parametrize("width", [1, 9, 64, 77, 512])
def test_padded_counts_is_the_rows_lengths_predictions_and_first_broken_rule(width):
    """One C pass over a padded block: the mask's leading 1s, the non-zero ids, and the first row whose mask is not
    1s then 0s, or whose positions are negative or (non-zero) past its length, or whose ids are negative; the
    same as the plain definitions, for every kind of corruption anywhere in the block."""
    require_native()
    rng = np.random.default_rng(width)
    n, pw = 48, 20
    lens = rng.integers(1, width + 1, n)
    m = (np.arange(width) < lens[:, None]).astype(np.int8)
    preds = rng.integers(0, pw + 1, n)
    live = np.arange(pw) < preds[:, None]
    pos = (rng.integers(0, width, (n, pw)) % lens[:, None] * live).astype(np.int32)
    ids = (rng.integers(1, 30000, (n, pw)) * live).astype(np.int32)
    seq, pred, bad = pack_fast.padded_counts(m, pos, ids)
    assert seq.tolist() == lens.tolist() and pred.tolist() == preds.tolist() and bad == -1

    def want(mm: np.ndarray, pp: np.ndarray, dd: np.ndarray) -> int:
        for r in range(n):
            k = int(np.argmin(mm[r] == 1)) if (mm[r] != 1).any() else width
            if mm[r, k:].any() or (pp[r] < 0).any() or ((pp[r] != 0) & (pp[r] >= k)).any() or (dd[r] < 0).any():
                return r
        return -1

    for _ in range(60):
        mm, pp, dd = m.copy(), pos.copy(), ids.copy()
        r = int(rng.integers(0, n))
        what = rng.integers(0, 4)
        if what == 0:
            mm[r, int(rng.integers(0, width))] = rng.choice([0, 2, -1])
        elif what == 1:
            pp[r, int(rng.integers(0, pw))] = lens[r] + int(rng.integers(0, 3))  # at or past the row's end
        elif what == 2:
            pp[r, int(rng.integers(0, pw))] = -1
        else:
            dd[r, int(rng.integers(0, pw))] = -int(rng.integers(1, 5))
        assert pack_fast.padded_counts(mm, pp, dd)[2] == want(mm, pp, dd), (r, what)
    # types the C loop does not take: None, and the caller checks with NumPy
    assert pack_fast.padded_counts(m, pos.astype(np.int64), ids) is None
    assert pack_fast.padded_counts(m.astype(np.int16), pos, ids) is None


@pytest.mark.parametrize("width", [1, 9, 77, 512])
def test_position_counts_is_pack_nvidias_lengths_predictions_and_first_broken_rule(width):
    """pack-nvidia's one pass: the mask's leading 1s, the leading non-zero positions, the first row breaking the
    mask's or the positions' rules (as padded_counts), and whether every row's positions are non-zeros then zeros
    (a hole is no error: the caller then takes the predictions another way)."""
    require_native()
    rng = np.random.default_rng(width + 1)
    n, pw = 48, 20
    lens = rng.integers(1, width + 1, n)
    m = (np.arange(width) < lens[:, None]).astype(np.int8)
    preds = np.minimum(rng.integers(0, pw + 1, n), lens - 1)  # positions 1..len-1: non-zero
    live = np.arange(pw) < preds[:, None]
    pos = ((rng.integers(0, width, (n, pw)) % np.maximum(lens - 1, 1)[:, None] + 1) * live).astype(np.int32)
    seq, pred, bad, prefix = pack_fast.position_counts(m, pos)
    assert seq.tolist() == lens.tolist() and pred.tolist() == preds.tolist() and bad == -1 and prefix

    def want(mm: np.ndarray, pp: np.ndarray) -> int:
        for r in range(n):
            k = int(np.argmin(mm[r] == 1)) if (mm[r] != 1).any() else width
            if mm[r, k:].any() or (pp[r] < 0).any() or ((pp[r] != 0) & (pp[r] >= k)).any():
                return r
        return -1

    for _ in range(60):
        mm, pp = m.copy(), pos.copy()
        r = int(rng.integers(0, n))
        what = rng.integers(0, 3)
        if what == 0:
            mm[r, int(rng.integers(0, width))] = rng.choice([0, 2, -1])
        elif what == 1:
            pp[r, int(rng.integers(0, pw))] = lens[r] + int(rng.integers(0, 3))
        else:
            pp[r, int(rng.integers(0, pw))] = -1
        assert pack_fast.position_counts(mm, pp)[2] == want(mm, pp), (r, what)
    for r in np.flatnonzero(preds >= 2)[:1]:  # none at width 1 (every row one token long)
        holed = pos.copy()
        holed[r, 0] = 0  # a hole before the row's other positions: no rule broken, no prefix
        got = pack_fast.position_counts(m, holed)
        assert got[2] == -1 and not got[3] and got[1][r] == 0
    assert pack_fast.position_counts(m, pos.astype(np.int64)) is None


@pytest.mark.parametrize("dt", ["int8", "int16", "int32", "int64"])
def test_prefix_lengths_counts_the_leading_non_zeros_and_finds_the_first_bad_row(mode, dt):
    v = (np.arange(1, 11) * (np.arange(10) < np.array([2, 0, 10, 1])[:, None])).astype(dt)
    counts, bad = pack_fast.prefix_lengths(v)
    assert counts.tolist() == [2, 0, 10, 1] and bad == -1
    w = v.copy()
    w[3, 5] = 7  # a value after the row's first 0
    assert pack_fast.prefix_lengths(w)[1] == 3
    w[1, 9] = -1
    assert pack_fast.prefix_lengths(w)[1] == 1


def test_pack_nvidia_refuses_a_hole_in_the_masked_positions(tmp_path, capsys):
    """A 0 between masked positions (the count's quick check fails): the scatter's full check refuses the row."""
    from bertpipe.cli import main
    from tests.preprocessing.habana.test_pack_habana import write_padded

    d = tmp_path / "in"
    d.mkdir()
    p = d / "part-00000-of-00500.hdf5"
    write_padded(p, [10, 30, 20, 40], width=64, preds=12, seed=3)
    with h5py.File(p, "r+") as f:
        pos = f["masked_lm_positions"][2]
        pos[1:] = np.concatenate([[0], pos[1:-1]])  # 0 at index 1, the rest one place later
        f["masked_lm_positions"][2] = pos
        f["masked_lm_ids"][2] = np.where(pos != 0, 1000, 0)
    assert main(["pack-nvidia", "--input_hdf5", str(d), "--output_hdf5", str(tmp_path / "o"), "--max_seq_length",
                 "64", "--shards_num", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "'masked_lm_positions' row 2:" in err[0] and p.name in err[0], err


def test_gather_runs_refuses_runs_outside_their_source(mode):
    src = np.zeros(10, np.int16)
    with pytest.raises(ValueError, match="past the end"):
        pack_fast.gather_runs([src], None, np.array([8]), np.array([3]), "int16")
    with pytest.raises(ValueError, match="negative"):
        pack_fast.gather_runs([src], None, np.array([-1]), np.array([3]), "int16")
    with pytest.raises(ValueError, match="does not exist"):
        pack_fast.gather_runs([src, src], np.array([2]), np.array([0]), np.array([3]), "int16")


# -- shard lists -----------------------------------------------------------------------------------------------------------
def test_format_packs_is_json_dumps():
    require_native()
    rng = np.random.default_rng(3)
    counts = rng.integers(0, 4, 500)
    counts[[0, 7, -1]] = 0  # empty packs, first and last among them
    n = int(counts.sum())
    seq_len, seq_idx = rng.integers(1, 513, n), rng.integers(0, 2**40, n)
    seq_idx[:3] = [0, 2**63 - 1, 9]
    off = np.concatenate([[0], np.cumsum(counts)])
    want = json.dumps([[[int(seq_len[i]), int(seq_idx[i])] for i in range(off[p], off[p + 1])]
                       for p in range(len(counts))])
    assert pack_fast.format_packs(seq_len, seq_idx, off) == want
    assert pack_fast.format_packs(seq_len[:0], seq_idx[:0], np.zeros(1, np.int64)) == "[]"
    with pytest.raises(ValueError, match="out of order"):
        pack_fast.format_packs(seq_len, seq_idx, off[::-1].copy())


# -- placing runs, segment ids as one number a row -------------------------------------------------------------------
@pytest.mark.parametrize("src_dt,out_dt", [("int32", "int16"), ("int8", "int8"), ("int16", "int64")])
def test_place_runs_equals_the_gather_in_output_order(src_dt, out_dt):
    """Rows read in their sources' order and written to their places give the gather of the same rows in place
    order, from one source or several."""
    require_native()
    rng = np.random.default_rng(5)
    srcs = [rng.integers(0, 100, 3000).astype(src_dt) for _ in range(3)]
    n = 400
    which = rng.integers(0, 3, n)
    lens = rng.integers(0, 12, n)
    starts = rng.integers(0, 2988, n)
    perm = rng.permutation(n)  # output row j is run perm[j]
    dests = np.empty(n, np.int64)
    dests[perm] = np.cumsum(lens[perm]) - lens[perm]
    want = pack_fast.gather_runs(srcs, which[perm], starts[perm], lens[perm], out_dt)
    got = pack_fast.place_runs(srcs, which, starts, lens, dests, out_dt, lo=0, hi=99)
    assert got is not None and got.dtype == np.dtype(out_dt) and np.array_equal(got, want)
    one = pack_fast.place_runs(srcs[0], None, starts, lens, dests, out_dt)
    assert np.array_equal(one, pack_fast.gather_runs([srcs[0]], None, starts[perm], lens[perm], out_dt))
    # a value outside the bounds (or the type): None, and the gather names it
    assert pack_fast.place_runs(srcs, which, starts, lens, dests, out_dt, lo=0, hi=98) is None or \
        not (want == 99).any()
    with pytest.raises(ValueError, match="outside out"):
        pack_fast.native().place_runs(np.zeros(3, np.int16), np.array([2]), np.array([srcs[0].ctypes.data],
                                      np.uint64), np.array([2]), srcs[0].itemsize, 0, 9)


def test_place_runs_declines_without_the_extension(monkeypatch):
    monkeypatch.setattr(pack_fast._NATIVE, "module", None)
    monkeypatch.setattr(pack_fast._NATIVE, "reason", "off")
    assert pack_fast.place_runs(np.arange(5), None, [0], [5], [0], "int16") is None
    assert pack_fast.segment_bounds(np.zeros(5, np.int8), [0], [5]) is None


@pytest.mark.parametrize("dt", ["int8", "int32"])
def test_segment_bounds_keep_rows_of_0s_then_1s_and_fill_segments_gives_them_back(mode, dt):
    rng = np.random.default_rng(9)
    lens = rng.integers(0, 70, 500)
    bounds = (lens * rng.random(500)).astype(np.int64)
    bounds[:3] = [0, lens[1], lens[2] // 2]  # all 1s, all 0s, half
    seg = pack_fast.fill_segments(bounds, lens)
    want = np.concatenate([np.r_[np.zeros(b, np.int8), np.ones(n - b, np.int8)]
                           for b, n in zip(bounds, lens, strict=True)])
    assert seg.dtype == np.int8 and np.array_equal(seg, want)
    if mode == "native":
        starts = np.cumsum(lens) - lens
        got = pack_fast.segment_bounds(seg.astype(dt), starts, lens)
        assert got is not None and got.dtype == np.int16 and np.array_equal(got, bounds)
        r = int(np.flatnonzero(lens >= 3)[0])
        for broken in ([1, 0], [0, 2], [0, -1]):  # a 1 before a 0, a 2, a -1: kept as values
            bad = seg.astype(dt)
            bad[starts[r]:starts[r] + 2] = broken
            assert pack_fast.segment_bounds(bad, starts, lens) is None
    with pytest.raises(ValueError, match="outside 0..its row"):
        pack_fast.fill_segments(np.array([4]), np.array([3]))


def test_segment_bounds_of_int8_rows_read_eight_at_a_time_equal_the_plain_rule():
    """The int8 loop reads the 0s and then the 1s eight bytes at a time: the same bounds, and the same refusals,
    as the rule itself, wherever a row breaks it (inside a word, at its edges, in the tail); a row of more than
    32,767 zeros does not fit the int16 bound."""
    require_native()
    rng = np.random.default_rng(17)
    lens = rng.integers(0, 600, 300)
    lens[:4] = [0, 1, 8, 17]
    bounds = (lens * rng.random(300)).astype(np.int64)
    seg = pack_fast.fill_segments(bounds, lens)
    starts = np.cumsum(lens) - lens
    assert np.array_equal(pack_fast.segment_bounds(seg, starts, lens), bounds)
    for _ in range(80):
        bad = seg.copy()
        r = int(rng.choice(np.flatnonzero(lens >= 2)))
        at = starts[r] + int(rng.integers(0, lens[r]))
        bad[at] = rng.choice([2, -1, 1 - bad[at]])
        row = bad[starts[r]:starts[r] + lens[r]]
        broken = bool(((row != 0) & (row != 1)).any() or (np.diff(row) < 0).any())
        got = pack_fast.segment_bounds(bad, starts, lens)
        assert (got is None) == broken, (r, at - starts[r], row[max(0, at - starts[r] - 2):at - starts[r] + 3])
    wide = np.zeros(40_000, np.int8)
    assert pack_fast.segment_bounds(wide, [0], [40_000]) is None
    assert pack_fast.segment_bounds(wide, [0], [32_767]).tolist() == [32_767]


def test_pack_nvidia_keeps_bert_segments_as_one_number_a_row_and_writes_the_same_files(tmp_path, monkeypatch):
    """Inputs whose rows' segment ids are 0s then 1s (a BERT instance's) have them kept in the scratch as one number
    a row; an input with other segment ids keeps the values; the shards are those of the NumPy path, which keeps
    every value."""
    import preprocessing.nvidia.pack as nv
    from tests.preprocessing.nvidia.test_pack_nvidia import made_up_rows, write_padded

    require_native()
    rng = np.random.default_rng(23)
    t = 40
    parts = []
    for i, n in enumerate((300, 200, 250)):
        rows = made_up_rows(rng.integers(1, t + 1, n).tolist(), rng, width=48, preds=10)
        if i != 1:  # BERT's: [CLS] A [SEP] -> 0, B [SEP] -> 1
            lens = rows["input_mask"].sum(axis=1)
            first_b = (lens * rng.random(n)).astype(np.int64)
            cols = np.arange(48)
            rows["segment_ids"] = ((cols >= first_b[:, None]) & (cols < lens[:, None])).astype(np.int8)
        parts.append(write_padded(tmp_path / f"part-{i:05d}.hdf5", rows))
    kept = []
    real = nv.save_segments
    monkeypatch.setattr(nv, "save_segments", lambda sd, stem, v, b, d=False: (kept.append((stem, b is not None)),
                                                                                 real(sd, stem, v, b, d))[1])
    cfg = nv.PackNvidiaConfig(max_seq_length=t, shards_num=4, seed=3)
    for direct in ("0", "1"):
        monkeypatch.setenv("BERTPIPE_DIRECT_IO", direct)
        nv.run_pack_nvidia(parts, tmp_path / f"native{direct}", cfg)
    assert sorted(set(kept)) == [("in_00000", True), ("in_00001", False), ("in_00002", True)]
    monkeypatch.setattr(pack_fast._NATIVE, "module", None)
    monkeypatch.setattr(pack_fast._NATIVE, "reason", "off")
    nv.run_pack_nvidia(parts, tmp_path / "numpy", cfg)
    files = {m: json.loads((tmp_path / m / "_manifest.json").read_text())["files"]
             for m in ("native0", "native1", "numpy")}
    assert files["native0"] == files["numpy"] == files["native1"] and len(files["numpy"]) == 8
    with h5py.File(tmp_path / "numpy" / "part_00000.hdf5", "r") as f:  # the segments are there, as 0s then 1s
        assert any((np.diff(r) != 0).any() for r in f["segment_ids"][:])


def test_the_packers_sorts_give_numpys_stable_order():
    """stable_argsort (a 16-bit radix sort where the values fit) and distinct_argsort (distinct keys: any sort) give
    what ``np.argsort(kind="stable")`` gives, for values that fit 16 bits signed or not, and ones that do not."""
    from preprocessing.packing import distinct_argsort, stable_argsort

    rng = np.random.default_rng(13)
    for lo, hi in ((1, 513), (0, 60_000), (-300, 300), (-40_000, 70_000)):
        v = rng.integers(lo, hi, 5000).astype(np.int64)
        assert np.array_equal(stable_argsort(v), np.argsort(v, kind="stable")), (lo, hi)
    assert np.array_equal(stable_argsort(np.zeros(0, np.int64)), np.zeros(0, np.int64))
    keys = rng.permutation(90_000)[:7000].astype(np.int64)
    assert np.array_equal(distinct_argsort(keys), np.argsort(keys, kind="stable"))


# -- pack-nvidia in both modes ----------------------------------------------------------------------------------------------
def test_pack_nvidia_writes_the_same_files_in_both_modes(tmp_path, monkeypatch):
    """The memory-mapped padded path (C gathers) and the chunked h5py path (NumPy) write the same bytes, for
    several padded inputs, one stored chunked (which is read through h5py in both modes)."""
    from preprocessing.nvidia.pack import PackNvidiaConfig, run_pack_nvidia
    from tests.preprocessing.nvidia.test_pack_nvidia import made_up_rows, write_padded

    require_native()
    rng = np.random.default_rng(21)
    t = 40
    lengths = [*range(1, t + 1), *rng.integers(1, t + 1, 400).tolist()]
    rng.shuffle(lengths)
    parts = [write_padded(tmp_path / f"part-{i:05d}.hdf5", made_up_rows(lengths[a:b], rng, width=48, preds=10))
             for i, (a, b) in enumerate([(0, 150), (150, 151), (151, 440)])]
    chunked = tmp_path / "part-00003.hdf5"
    with h5py.File(parts[2], "r") as src, h5py.File(chunked, "w") as dst:
        for k in src:
            dst.create_dataset(k, data=src[k][:], chunks=True, compression="gzip")
    parts.append(chunked)
    cfg = PackNvidiaConfig(max_seq_length=t, shards_num=5, seed=8)
    run_pack_nvidia(parts, tmp_path / "native", cfg)
    monkeypatch.setattr(pack_fast._NATIVE, "module", None)
    monkeypatch.setattr(pack_fast._NATIVE, "reason", "off")
    run_pack_nvidia(parts, tmp_path / "numpy", cfg)
    files = {m: json.loads((tmp_path / m / "_manifest.json").read_text())["files"] for m in MODES}
    assert files["native"] == files["numpy"] and len(files["native"]) == 10


def test_a_value_outside_int16_names_the_same_row_in_both_modes(tmp_path, monkeypatch):
    from preprocessing.nvidia.pack import PackNvidiaConfig, run_pack_nvidia
    from tests.preprocessing.nvidia.test_pack_nvidia import made_up_rows, write_padded

    require_native()
    rng = np.random.default_rng(4)
    data = made_up_rows([5, 9, 3, 12, 7, 2], rng, width=16, preds=4)
    data["input_ids"][3, 11] = 40_000  # row 3's last token
    data["masked_lm_ids"][4, 0] = 33_000 if data["masked_lm_positions"][4, 0] else data["masked_lm_ids"][4, 0]
    part = write_padded(tmp_path / "part-00000.hdf5", data)
    cfg = PackNvidiaConfig(max_seq_length=16, shards_num=1)
    messages = []
    for m in MODES:
        if m == "numpy":
            monkeypatch.setattr(pack_fast._NATIVE, "module", None)
            monkeypatch.setattr(pack_fast._NATIVE, "reason", "off")
        with pytest.raises(InputError, match="part-00000.hdf5: row 3: input_ids holds a value outside int16") as e:
            run_pack_nvidia([part], tmp_path / m, cfg)
        messages.append(str(e.value))
        assert not any(p.name.startswith(".") for p in Path(tmp_path / m).iterdir())
    assert messages[0] == messages[1]


# -- the workers' buffers, kept from call to call -------------------------------------------------------------------
def test_process_space_keeps_one_owners_buffers_per_thread():
    """One owner's buffers are the same memory call after call (larger requests grow them); asking for another
    owner's frees them; each thread has its own."""
    import threading

    sp = pack_fast.process_space("test-a")
    a = sp.get("x", 1000, np.int16)
    again = pack_fast.process_space("test-a").get("x", 600, np.int16)
    assert pack_fast.process_space("test-a") is sp and again.ctypes.data == a.ctypes.data and len(again) == 600
    assert sp.get("x", 5000, np.int16).size == 5000  # grown
    other = pack_fast.process_space("test-b")
    assert other is not sp and not sp._bufs  # test-a's buffers freed (arrays the caller still holds stay valid)
    seen = []
    t = threading.Thread(target=lambda: seen.append(pack_fast.process_space("test-b")))
    t.start()
    t.join()
    assert seen[0] is not other and pack_fast.process_space("test-b") is other


def test_a_space_buffer_takes_a_call_up_to_an_eighth_larger_without_new_memory():
    """Groups of a step differ by a few percent (pack-nvidia's on 8 parts: 7.6 %): a buffer is made with 1/8 more
    room (in 2 MiB steps), so such a call reuses its pages instead of a fresh array the kernel zeroes again."""
    sp = pack_fast.Space()
    n = 50 << 20  # values of int16: 100 MiB
    first = sp.get("x", n, np.int16)
    assert sp.room(n, np.dtype(np.int16)) >= n + n // 8
    assert sp.room(n, np.dtype(np.int16)) * 2 % (2 << 20) == 0
    again = sp.get("x", n + n // 10, np.int16)
    assert again.ctypes.data == first.ctypes.data
    assert sp.get("x", n + n // 5, np.int16).ctypes.data != first.ctypes.data  # past the room: grown


def test_pack_nvidia_after_a_larger_call_in_the_same_process_writes_the_same_files(tmp_path):
    """pack-nvidia's scatter and groups reuse the worker's buffers (process_space): a run whose buffers hold a
    larger earlier run's values, overwritten with junk, writes the same bytes as a run from fresh buffers."""
    from preprocessing.nvidia.pack import SPACE_OWNER, PackNvidiaConfig, run_pack_nvidia
    from tests.preprocessing.nvidia.test_pack_nvidia import made_up_rows, write_padded

    require_native()
    rng = np.random.default_rng(5)
    t = 40

    def parts(name: str, sizes: list[int]) -> list[Path]:
        out = []
        for i, n in enumerate(sizes):
            lengths = rng.integers(1, t + 1, n).tolist()
            out.append(write_padded(tmp_path / name / f"part-{i:05d}.hdf5", made_up_rows(lengths, rng, width=48,
                                                                                        preds=10)))
        return out

    (tmp_path / "big").mkdir()
    (tmp_path / "small").mkdir()
    big, small = parts("big", [900, 700]), parts("small", [300, 120])
    cfg = PackNvidiaConfig(max_seq_length=t, shards_num=4, seed=2)
    pack_fast.process_space("another step")  # pack-nvidia's buffers freed: the next run starts fresh
    run_pack_nvidia(small, tmp_path / "fresh", cfg)
    run_pack_nvidia(big, tmp_path / "big_out", cfg)
    space = pack_fast.process_space(SPACE_OWNER)
    assert space._bufs  # the larger run's buffers are kept
    for buf in space._bufs.values():
        buf.fill(0x55)
    run_pack_nvidia(small, tmp_path / "reused", cfg)
    files = {m: json.loads((tmp_path / m / "_manifest.json").read_text())["files"] for m in ("fresh", "reused")}
    assert files["fresh"] == files["reused"] and len(files["fresh"]) == 8


def test_pack_nvidia_run_again_in_a_process_frees_the_groups_buffers_before_its_scatter(tmp_path, monkeypatch):
    """A second pack-nvidia run in the same process (a long-lived worker) does not hold the first run's group
    buffers (its read buffers and the images built there) through its count and scatter: only the scatter's own
    are kept, so its peak is one run's. The same files as the first run."""
    from preprocessing.nvidia import pack as P
    from tests.preprocessing.nvidia.test_pack_nvidia import made_up_rows, write_padded

    require_native()
    monkeypatch.setenv("BERTPIPE_DIRECT_IO", "1")  # the scratch past the page cache: the groups read into buffers
    rng = np.random.default_rng(7)
    t = 40
    parts = []
    (tmp_path / "in").mkdir()
    for i, n in enumerate([600, 400]):
        lengths = rng.integers(1, t + 1, n).tolist()
        parts.append(write_padded(tmp_path / "in" / f"part-{i:05d}.hdf5", made_up_rows(lengths, rng, width=48,
                                                                                      preds=10)))
    cfg = P.PackNvidiaConfig(max_seq_length=t, shards_num=4, seed=3)
    P.run_pack_nvidia(parts, tmp_path / "a", cfg)
    held = set(pack_fast.process_space(P.SPACE_OWNER)._bufs)
    assert held - set(P.SCATTER_BUFFERS), held  # the groups' read buffers, kept for the next group call
    seen = []
    for step in ("count_lengths", "scatter_input"):
        real = getattr(P, step)

        def spy(*a, _real=real, **k):
            seen.append(set(pack_fast.process_space(P.SPACE_OWNER)._bufs))
            got = _real(*a, **k)
            seen.append(set(pack_fast.process_space(P.SPACE_OWNER)._bufs))
            return got

        monkeypatch.setattr(P, step, spy)
    P.run_pack_nvidia(parts, tmp_path / "b", cfg)
    assert len(seen) == 8 and seen[0] == held  # before the first count: the first run's, all of them
    assert all(s <= set(P.SCATTER_BUFFERS) for s in seen[1:])
    files = {m: json.loads((tmp_path / m / "_manifest.json").read_text())["files"] for m in ("a", "b")}
    assert files["a"] == files["b"]


def test_a_pool_worker_frees_the_kept_buffers_when_another_stage_comes():
    """The DAG's pool workers run call after call: the buffers one stage's calls keep for its next call are freed
    before a call of other stages (tasks.calls.release_if_new_stages), never held through them."""
    from tasks import calls

    calls.release_if_new_stages(frozenset({"pack_nvidia"}))
    sp = pack_fast.process_space("pack-nvidia")
    sp.get("ids", 1000, np.int16)
    assert not calls.release_if_new_stages(frozenset({"pack_nvidia"}))  # the same stage: kept
    assert pack_fast.process_space("pack-nvidia") is sp and sp._bufs
    assert calls.release_if_new_stages(frozenset({"split_4bins"}))
    assert not sp._bufs and pack_fast.process_space("pack-nvidia") is not sp
    pack_fast.release_spaces()
    pack_fast.release_spaces()  # nothing held: nothing to do


def test_the_hot_loops_have_an_avx2_copy_where_gcc_dispatches() -> None:
    """pack.c's HOT functions are built twice (GCC's target_clones on x86-64 glibc Linux): an AVX2 copy and the baseline,
    one chosen at load time. Losing the attribute loses 9-14 % of the packers' CPU without any result changing, so
    the built module's symbols are checked: each hot loop has its ``.avx2`` copy and its resolver."""
    import platform
    import subprocess
    import sys
    import sysconfig

    require_native()
    cc = (sysconfig.get_config_var("CC") or "cc").split()[0]
    if sys.platform != "linux" or platform.machine() != "x86_64" or platform.libc_ver()[0] != "glibc" or \
            not shutil.which("nm"):
        pytest.skip("the AVX2 copies are built on x86-64 Linux with glibc only (and read with nm)")
    if "clang" in subprocess.run([os.environ.get("CC") or cc, "--version"], capture_output=True, text=True).stdout:
        pytest.skip("clang builds the baseline alone")
    path = pack_fast.native().__file__
    syms = subprocess.run(["nm", path], capture_output=True, text=True, check=True).stdout
    if not syms.strip():
        pytest.skip(f"{path} has no symbol table (stripped)")
    names = {line.split()[-1] for line in syms.splitlines() if line.strip()}
    for fn in ("place_runs", "gather_runs", "gather_runs_bounded", "seg_bounds", "padded_counts", "position_counts",
               "mask_lengths", "prefix_lengths", "fill_segments", "cut_rows"):
        assert f"{fn}.avx2" in names and f"{fn}.resolver" in names, f"{fn} has no AVX2 copy in {path}"
