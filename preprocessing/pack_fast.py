"""The packers' inner loops in C (``preprocessing/_pack_native/pack.c``), with NumPy fallbacks that give the same
results.

* :func:`gather_runs`: runs of integers (run i: ``lens[i]`` values of source ``which[i]`` from ``starts[i]``),
  back to back, converted to a narrower or equal integer type with a range check: what compacting padded rows,
  sorting compact rows by their place and merging several inputs' rows into a shard amount to. The C loop copies
  each run once; NumPy builds an index per value first (several times the memory traffic).
* :func:`shuffle_state` / :func:`native_shuffle`: CPython's ``random.Random.shuffle`` of ``range(n)`` from a
  Mersenne Twister state (used by :class:`preprocessing.pyrandom.Shuffles`).
* :func:`format_packs`: NVIDIA's shard lists, ``json.dumps`` of the packs' ``[length, index]`` pairs.
* :func:`segment_bounds` / :func:`fill_segments`: a row's segment ids (0s then 1s) as the number of its 0s, and
  back: the packers' scratch keeps one number a row in place of a byte a token.
* :func:`cut_padded`: padded MLPerf rows checked and cut to NVIDIA's variable-length form in one pass a row (the
  chop and the eval pick; ``preprocessing/nvidia/varlength.compact_padded`` is its NumPy equal).

The extension is built by ``pip install`` or compiled on first use (:mod:`core.native`); ``BERTPIPE_NATIVE=0`` or
no C compiler: the fallbacks run.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import numpy as np

from core.native import NativeModule

ABI = 4
_NATIVE = NativeModule("preprocessing._pack_native", Path(__file__).with_name("_pack_native"), "pack.c", ABI,
                       "packing C core")
#: Runs gathered per step of the NumPy fallback (its index arrays stay small).
FALLBACK_RUNS = 4096


def native() -> ModuleType | None:
    """The C extension, or None (``_NATIVE.reason`` says why)."""
    return _NATIVE.load()


def available() -> bool:
    return native() is not None


# -- shuffles --------------------------------------------------------------------------------------------------------
def shuffle_state(seed: int) -> np.ndarray:
    """``random.Random(seed)``'s Mersenne Twister state: 624 words and the position (625 uint32)."""
    return np.array(random.Random(seed).getstate()[1], dtype=np.uint32)


def native_shuffle(state: np.ndarray, n: int) -> np.ndarray | None:
    """``x = list(range(n)); rng.shuffle(x)`` as an array (int32 below 2**31 items, else int64), drawn from
    ``state`` (advanced as ``rng`` would be); None when the extension is unavailable or ``n`` is too large for it."""
    mod = native()
    if mod is None or n > (1 << 32):
        return None
    out = np.empty(n, dtype=np.int32 if n < (1 << 31) else np.int64)
    mod.shuffle(state, out)
    return out


def native_shuffle_inplace(state: np.ndarray, x: np.ndarray) -> bool:
    """``rng.shuffle`` of ``x``'s values, in place (contiguous 4- or 8-byte integers: ``x`` becomes ``x[p]`` for
    the permutation ``p`` that :func:`native_shuffle` would draw), ``state`` advanced as ``rng`` would be; False
    (nothing drawn, ``x`` untouched) when the extension is unavailable or cannot take ``x``."""
    mod = native()
    n = len(x)
    if (mod is None or x.ndim != 1 or not x.flags.c_contiguous or not x.flags.writeable or x.dtype.kind not in "iu"
            or x.dtype.itemsize not in (4, 8) or n > (1 << 32) or (x.dtype.itemsize == 4 and n > (1 << 31))):
        return False
    mod.shuffle(state, x, True)
    return True


# -- shard lists ---------------------------------------------------------------------------------------------------
def format_packs(seq_len: np.ndarray, seq_idx: np.ndarray, pack_off: np.ndarray) -> str | None:
    """``json.dumps([[[int(seq_len[i]), int(seq_idx[i])] for i in range(pack_off[p], pack_off[p + 1])]
    for p ...])``, or None without the extension."""
    mod = native()
    if mod is None:
        return None
    return mod.format_packs(np.ascontiguousarray(seq_len, dtype=np.int64), np.ascontiguousarray(seq_idx, np.int64),
                            np.ascontiguousarray(pack_off, dtype=np.int64)).decode("ascii")


# -- gathering runs ------------------------------------------------------------------------------------------------
class OutOfRange(Exception):
    """A gathered value does not fit the output type: ``index`` is its place in the output."""

    def __init__(self, index: int) -> None:
        super().__init__(f"value {index} of the output is out of range")
        self.index = index


def _checked(sources: Sequence[np.ndarray], which: np.ndarray | None, starts: np.ndarray,
             lens: np.ndarray) -> tuple[np.ndarray | None, np.ndarray, np.ndarray]:
    starts = np.ascontiguousarray(starts, dtype=np.int64)
    lens = np.ascontiguousarray(lens, dtype=np.int64)
    if starts.shape != lens.shape or starts.ndim != 1:
        raise ValueError("gather_runs: starts and lens must be 1-D and of one length")
    if which is not None:
        which = np.ascontiguousarray(which, dtype=np.int64)
        if which.shape != starts.shape:
            raise ValueError("gather_runs: which must hold one source per run")
        if len(which) and (which.min() < 0 or which.max() >= len(sources)):
            raise ValueError("gather_runs: a run names a source that does not exist")
    elif len(sources) != 1:
        raise ValueError("gather_runs: several sources need `which`")
    dtypes = {np.dtype(s.dtype) for s in sources}
    if len(dtypes) > 1 or any(s.ndim != 1 for s in sources):
        raise ValueError("gather_runs: the sources must be 1-D arrays of one integer type")
    if len(lens) and (lens.min() < 0 or starts.min() < 0):
        raise ValueError("gather_runs: negative starts or lengths")
    sizes = np.array([len(s) for s in sources], dtype=np.int64)
    ends = starts + lens
    limit = sizes[which] if which is not None else sizes[0]
    if len(ends) and (ends > limit).any():
        raise ValueError("gather_runs: a run reaches past the end of its source")
    return which, starts, lens


def gather_runs(sources: Sequence[np.ndarray], which: np.ndarray | None, starts: np.ndarray, lens: np.ndarray,
                dtype: np.dtype | type | str, lo: int | None = None, hi: int | None = None,
                space: Space | None = None, name: str = "gather", out: np.ndarray | None = None) -> np.ndarray:
    """``concatenate([sources[which[i]][starts[i]:starts[i] + lens[i]] for i ...]).astype(dtype)`` (``which``
    None: one source), checked: every value must fit ``dtype`` (and lie in ``lo..hi`` where given: a check of
    the values folded into the copy). With ``space``, the result is a view of its buffer ``name``; with ``out``
    (C-contiguous, of ``dtype``, holding exactly the runs' values in any shape), written there and returned (at an
    address that is not a multiple of the type's size: gathered into ``space``'s buffer, then copied there).

    Raises:
        OutOfRange: a value does not fit (or lies outside ``lo..hi``); ``.index`` is its place in the output.
        ValueError: a run outside its source, or mismatched arguments (a bug in the caller).
    """
    out_dt = np.dtype(dtype)
    sources = [np.asarray(s) for s in sources]
    which, starts, lens = _checked(sources, which, starts, lens)
    total = int(lens.sum())
    given = out
    if given is not None:
        if given.dtype != out_dt or given.size != total or not given.flags.c_contiguous or not given.flags.writeable:
            raise ValueError(f"gather_runs: out must be a writable C-contiguous array of {total} {out_dt} values")
        # an array at an odd address (a dataset HDF5 put there: ImageLayout) is filled by NumPy from an aligned one
        out = given.reshape(-1) if given.flags.aligned else (
            space.get(name, total, out_dt) if space is not None else np.empty(total, dtype=out_dt))
    else:
        out = space.get(name, total, out_dt) if space is not None else np.empty(total, dtype=out_dt)
    if not len(out):
        return out if given is None else given
    src_dt = sources[0].dtype
    if out_dt.kind != "i" or src_dt.kind not in "iu" or out_dt.itemsize not in (1, 2, 4, 8):
        raise ValueError(f"gather_runs: {src_dt} -> {out_dt} is not a supported integer conversion")
    mod = native()
    if mod is not None and src_dt.kind == "i" and src_dt.itemsize in (1, 2, 4, 8) and src_dt.isnative:
        srcs = [np.ascontiguousarray(s) for s in sources]  # memmaps and arrays: already contiguous (no copy)
        base = np.array([s.ctypes.data for s in srcs], dtype=np.uint64)
        addr = (base[which] if which is not None else base[0]) + (starts * src_dt.itemsize).astype(np.uint64)
        if lo is None and hi is None:
            bad = mod.gather_runs(out, addr, lens, src_dt.itemsize)
        else:
            bad = mod.gather_runs_bounded(out, addr, lens, src_dt.itemsize, -(1 << 63) if lo is None else int(lo),
                                          (1 << 63) - 1 if hi is None else int(hi))
        del srcs
        if bad >= 0:
            raise OutOfRange(int(bad))
    else:
        _gather_numpy(sources, which, starts, lens, out, lo, hi)
    if given is None:
        return out
    if not given.flags.aligned:
        given.reshape(-1)[...] = out
    return given


def place_runs(sources: np.ndarray | Sequence[np.ndarray], which: np.ndarray | None, starts: np.ndarray,
               lens: np.ndarray, dests: np.ndarray, dtype: np.dtype | type | str, lo: int | None = None,
               hi: int | None = None, space: Space | None = None, name: str = "gather") -> np.ndarray | None:
    """``out[dests[i]:dests[i] + lens[i]] = sources[which[i]][starts[i]:starts[i] + lens[i]]`` for every run
    (``which`` None: one source, given alone or in a list), converted to
    ``dtype``, every value checked to fit it (and ``lo..hi``): :func:`gather_runs` of the same runs in ``dests``
    order, with the source read in its own order (a padded file's rows one after the other, each written where it
    goes: ~2.7x faster on this VM than reading rows in another order). ``dests`` must tile the output (the runs'
    places in output order, back to back: the caller's). None without the extension, for a source type it does not
    take, or when a value does not fit (:func:`gather_runs` then says where)."""
    mod = native()
    srcs = [np.asarray(sources)] if isinstance(sources, np.ndarray) else [np.asarray(x) for x in sources]
    if not srcs:
        return None
    dt, out_dt = np.dtype(srcs[0].dtype), np.dtype(dtype)
    if (mod is None or dt.kind != "i" or not dt.isnative or dt.itemsize not in (1, 2, 4, 8) or out_dt.kind != "i"
            or out_dt.itemsize not in (1, 2, 4, 8)):
        return None
    which, starts, lens = _checked(srcs, which, starts, lens)
    dests = np.ascontiguousarray(dests, dtype=np.int64)
    if dests.shape != lens.shape:
        raise ValueError("place_runs: dests and lens must be of one length")
    total = int(lens.sum())
    out = space.get(name, total, out_dt) if space is not None else np.empty(total, dtype=out_dt)
    if not total:
        return out
    flats = [np.ascontiguousarray(x) for x in srcs]  # maps and arrays: contiguous already (no copy)
    base = np.array([x.ctypes.data for x in flats], dtype=np.uint64)
    addr = (base[which] if which is not None else base[0]) + (starts * dt.itemsize).astype(np.uint64)
    bad = mod.place_runs(out, dests, addr, lens, dt.itemsize, -(1 << 63) if lo is None else int(lo),
                         (1 << 63) - 1 if hi is None else int(hi))
    del flats
    return out if bad < 0 else None


def _gather_numpy(sources: Sequence[np.ndarray], which: np.ndarray | None, starts: np.ndarray, lens: np.ndarray,
                  out: np.ndarray, lo: int | None = None, hi: int | None = None) -> np.ndarray:
    info = np.iinfo(out.dtype)
    vmin = info.min if lo is None else max(info.min, int(lo))
    vmax = info.max if hi is None else min(info.max, int(hi))
    o = 0
    for a in range(0, len(lens), FALLBACK_RUNS):
        st, ln = starts[a:a + FALLBACK_RUNS], lens[a:a + FALLBACK_RUNS]
        n = int(ln.sum())
        if not n:
            continue
        run = np.repeat(np.arange(len(ln)), ln)
        idx = np.repeat(st - (np.cumsum(ln) - ln), ln) + np.arange(n)  # position in its source
        if which is None:
            vals = sources[0][idx]
        else:
            wh = which[a:a + FALLBACK_RUNS][run]
            vals = np.empty(n, dtype=sources[0].dtype)
            for k in np.unique(wh).tolist():
                m = wh == k
                vals[m] = sources[k][idx[m]]
        bad = np.flatnonzero((vals < vmin) | (vals > vmax))
        if bad.size:
            out[o:o + int(bad[0])] = vals[:int(bad[0])]
            raise OutOfRange(o + int(bad[0]))
        out[o:o + n] = vals
        o += n
    return out


# -- segment ids as one number a row -------------------------------------------------------------------------------
def segment_bounds(source: np.ndarray, starts: np.ndarray, lens: np.ndarray) -> np.ndarray | None:
    """Each run's segment ids (run i: ``lens[i]`` values of the 1-D integer ``source`` from ``starts[i]``) as one
    number, its 0s (int16), where every run is 0s then 1s (a BERT row's ``segment_ids[:length]``); None where one
    is not, or without the extension (the caller keeps the values themselves). :func:`fill_segments` undoes it."""
    mod = native()
    src = np.asarray(source)
    dt = np.dtype(src.dtype)
    if mod is None or dt.kind != "i" or not dt.isnative or dt.itemsize not in (1, 2, 4, 8):
        return None
    _, starts, lens = _checked([src], None, starts, lens)
    out = np.empty(len(lens), np.int16)
    if not len(lens):
        return out
    flat = np.ascontiguousarray(src)
    addr = np.uint64(flat.ctypes.data) + (starts * dt.itemsize).astype(np.uint64)
    bad = mod.seg_bounds(out, addr, lens, dt.itemsize)
    del flat
    return out if bad < 0 else None


def fill_segments(bounds: np.ndarray, lens: np.ndarray, space: Space | None = None,
                  name: str = "segments") -> np.ndarray:
    """The segment ids of rows of ``lens`` values whose first ``bounds`` are 0 and the rest 1, back to back (int8;
    a view of ``space``'s buffer ``name`` where given): :func:`segment_bounds` undone."""
    bounds = np.ascontiguousarray(bounds, dtype=np.int64)
    lens = np.ascontiguousarray(lens, dtype=np.int64)
    if bounds.shape != lens.shape or bounds.ndim != 1:
        raise ValueError("fill_segments: bounds and lens must be 1-D and of one length")
    if len(lens) and ((bounds < 0) | (bounds > lens)).any():
        raise ValueError("fill_segments: a bound outside 0..its row's length")
    total = int(lens.sum())
    out = space.get(name, total, np.int8) if space is not None else np.empty(total, np.int8)
    if not total:
        return out
    mod = native()
    if mod is not None:
        mod.fill_segments(out, bounds, lens)
        return out
    ends = np.cumsum(lens)
    marks = np.zeros(total + 1, np.int8)  # +1 where a row's 1s start, -1 where they end
    np.add.at(marks, ends - lens + bounds, 1)
    np.add.at(marks, ends, -1)
    np.cumsum(marks[:-1], dtype=np.int8, out=out)
    return out


# -- NVIDIA's cut of padded rows -------------------------------------------------------------------------------------
#: The padded datasets' types the C cut takes (what tfrecord-to-hdf5 writes); other files take the NumPy path.
CUT_TYPES = {"input_mask": "int8", "input_ids": "int32", "segment_ids": "int8", "masked_lm_positions": "int32",
             "masked_lm_ids": "int32", "next_sentence_labels": "int8"}


#: Where each :class:`Space` buffer starts: on a block boundary (preprocessing.scratch.ALIGN), so that an array
#: from it can be written past the page cache as it is (packing.save_array), not through a bounce buffer.
BUFFER_ALIGN = 4096


class Space:
    """Output buffers used again from one call to the next (``cut_padded(rows, space)``, ``gather_runs(...,
    space=...)``): a chunk's arrays are views of them, valid until the next call that writes the same buffer; each
    starts on a :data:`BUFFER_ALIGN` boundary.

    A fresh array of tens of MB is a fresh mapping: the kernel zeroes every page of it on first touch (on this
    VM, ~1 GB/s), for each chunk again. Used again, its pages are zeroed once per process."""

    def __init__(self) -> None:
        self._bufs: dict[str, np.ndarray] = {}

    def get(self, name: str, n: int, dtype: np.dtype | type | str) -> np.ndarray:
        """An array of ``n`` values of ``dtype``, its contents undefined (what the last call left there)."""
        dt = np.dtype(dtype)
        buf = self._bufs.get(name)
        if buf is None or buf.dtype != dt or len(buf) < n:
            self._bufs.pop(name, None)  # the old one freed before the larger one is made
            room = self.room(n, dt)
            raw = np.empty(room + BUFFER_ALIGN // dt.itemsize, dtype=dt)
            off = (-raw.ctypes.data) % BUFFER_ALIGN // dt.itemsize  # NumPy's 16-byte alignment: a whole item
            buf = self._bufs[name] = raw[off:off + room]
        return buf[:n]

    @staticmethod
    def room(n: int, dt: np.dtype) -> int:
        """The values a buffer asked for ``n`` of ``dt`` is made with: 1/8 more, rounded up to 2 MiB. Calls of a
        step ask for nearly the same sizes (shard groups and inputs differ by a few rows); an exact fit made
        each slightly larger call a fresh array again, whose pages the kernel zeroes (pack-nvidia on 4 parts:
        1.35 GB of fresh pages where 0.46 GB are needed). With 1/16 more, pack-nvidia's third group on 8 parts
        (7.6 % more tokens than the first) still made its six buffers again: 2.42 GB of fresh pages, 1.36 GB
        now. Untouched pages cost no memory: the peak RSS is the same."""
        step = (2 << 20) // dt.itemsize if dt.itemsize and (2 << 20) % dt.itemsize == 0 else 1
        want = max(n, 1) + max(n, 1) // 8
        return -(-want // step) * step

    def spare(self, name: str) -> np.ndarray | None:
        """Buffer ``name`` whole, as bytes (None: there is none): memory a caller whose arrays from it are dead may
        use until the buffer's next :meth:`get` (pack-nvidia's group builds its shards' images in its read
        buffer)."""
        buf = self._bufs.get(name)
        return None if buf is None else buf.reshape(-1).view(np.uint8)

    def keep_only(self, names: Sequence[str]) -> None:
        """Every buffer but ``names`` freed: a step that uses only those does not hold another step's buffers
        through it (pack-nvidia's scatter, after a run's groups in the same process)."""
        for name in [n for n in self._bufs if n not in names]:
            del self._bufs[name]

    def clear(self) -> None:
        """Every buffer freed."""
        self._bufs.clear()


_SPACES = threading.local()


def process_space(owner: str) -> Space:
    """This thread's :class:`Space` for ``owner``'s calls (a stage's step, e.g. ``"pack-nvidia"``), kept from one
    call to the next: a worker that runs a step for part after part touches its big arrays' pages once, not once a
    call (on this VM a fresh page costs 0.2-1.7 system seconds a GiB, and with the memory full of page cache each
    fresh huge page may wait for compaction). One owner's buffers at a time: asking for another owner's frees them,
    so a worker holds at most the largest call's arrays of the step it ran last. The arrays the caller takes from it
    are valid until its next call with the same owner in the same thread."""
    held = getattr(_SPACES, "held", None)
    if held is None or held[0] != owner:
        if held is not None:
            held[1].clear()
        held = _SPACES.held = (owner, Space())
    return held[1]


def release_spaces() -> None:
    """Free this thread's kept buffers (:func:`process_space`): a worker about to run another stage's calls."""
    held = getattr(_SPACES, "held", None)
    if held is not None:
        held[1].clear()
        _SPACES.held = None


def cut_padded(rows: dict[str, np.ndarray], space: Space | None = None) -> tuple[np.ndarray, ...] | bool | None:
    """A chunk of padded rows (the six datasets; arrays or read-only maps) checked and cut in C: ``(seq, pred, ids,
    seg, pos, mlm, nsl)`` (lengths int64; values int16 / int8 / int16 / int16 back to back; labels int8); False when
    a row breaks a rule (the caller's own checks then say which); None without the extension or for other dtypes.
    With ``space`` the arrays are views of its buffers (valid until the next call with it), else new arrays."""
    mod = native()
    if mod is None or any(np.dtype(rows[k].dtype) != np.dtype(t) or not rows[k].dtype.isnative
                          for k, t in CUT_TYPES.items()):
        return None
    a = {k: np.ascontiguousarray(rows[k]) for k in CUT_TYPES}  # maps and arrays: contiguous already (no copy)
    n = len(a["next_sentence_labels"])
    w, pw = a["input_mask"].shape[1], a["masked_lm_positions"].shape[1]
    if a["input_ids"].shape != (n, w) or a["segment_ids"].shape != (n, w) or a["input_mask"].shape != (n, w) or \
            a["masked_lm_ids"].shape != (n, pw) or a["masked_lm_positions"].shape != (n, pw) or \
            a["next_sentence_labels"].shape != (n,):
        return None
    sp = space or Space()
    ids, seg = sp.get("cut_ids", n * w, np.int16), sp.get("cut_seg", n * w, np.int8)
    pos, mlm = sp.get("cut_pos", n * pw, np.int16), sp.get("cut_mlm", n * pw, np.int16)
    seq, pred = sp.get("cut_seq", n, np.int64), sp.get("cut_pred", n, np.int64)
    bad = mod.cut_padded(a["input_mask"], a["input_ids"], a["segment_ids"], a["masked_lm_positions"],
                         a["masked_lm_ids"], a["next_sentence_labels"], ids, seg, pos, mlm, seq, pred)
    if bad >= 0:
        return False
    t, p = int(seq.sum()), int(pred.sum())
    return seq, pred, ids[:t], seg[:t], pos[:p], mlm[:p], np.array(a["next_sentence_labels"], dtype=np.int8)


# -- padded rows' lengths ----------------------------------------------------------------------------------------
def mask_lengths(mask: np.ndarray) -> tuple[np.ndarray, int]:
    """``(lengths, bad)``: each row's number of leading 1s of a 2-D 1-byte ``input_mask`` (int64), and the first row
    that is not 1s then 0s (-1: every row is), in one pass (the C loop; NumPy's sums and comparisons otherwise)."""
    m = np.asarray(mask)
    n = m.shape[0]
    mod = native()
    if mod is not None and m.ndim == 2 and m.dtype.itemsize == 1 and m.dtype.kind in "iu" and m.shape[1] > 0:
        out = np.empty(n, np.int64)
        bad = mod.mask_lengths(np.ascontiguousarray(m), m.shape[1], out)
        return out, int(bad)
    ok = ((m == 0) | (m == 1)).all(axis=1) & ~(m[:, 1:] > m[:, :-1]).any(axis=1) if m.size else np.ones(n, bool)
    bad = np.flatnonzero(~ok)
    return m.sum(axis=1, dtype=np.int64), int(bad[0]) if bad.size else -1


def padded_counts(mask: np.ndarray, pos: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, int] | None:
    """``(lengths, predictions, bad)`` of a block of padded rows in one pass of the C loop: each row's number of
    leading 1s of its 1-byte ``input_mask`` and of non-zero ``masked_lm_ids`` (int64), and the first row whose
    mask is not 1s then 0s, or a position negative or (non-zero) not below its length, or an id negative (-1:
    none). None without the C extension, or for types it does not take (the caller checks with NumPy then)."""
    mod = native()
    m, p, d = np.asarray(mask), np.asarray(pos), np.asarray(ids)
    if mod is None or m.ndim != 2 or p.ndim != 2 or d.shape != p.shape or len(p) != len(m) or m.shape[1] == 0 \
            or m.dtype.itemsize != 1 or m.dtype.kind not in "iu" or any(
                a.dtype != np.dtype(np.int32) or not a.dtype.isnative for a in (p, d)):
        return None
    seq, pred = np.empty(len(m), np.int64), np.empty(len(m), np.int64)
    bad = mod.padded_counts(np.ascontiguousarray(m), np.ascontiguousarray(p), np.ascontiguousarray(d), m.shape[1],
                            p.shape[1], seq, pred)
    return seq, pred, int(bad)


def position_counts(mask: np.ndarray, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray, int, bool] | None:
    """``(lengths, predictions, bad, prefix)``: :func:`padded_counts` for rows whose predictions are their leading
    non-zero ``masked_lm_positions`` (pack-nvidia's), checked by the same rules of the mask and the positions;
    ``prefix``: every row's positions (up to ``bad``) are non-zeros then zeros. None where padded_counts is."""
    mod = native()
    m, p = np.asarray(mask), np.asarray(pos)
    if mod is None or m.ndim != 2 or p.ndim != 2 or len(p) != len(m) or m.shape[1] == 0 or m.dtype.itemsize != 1 \
            or m.dtype.kind not in "iu" or p.dtype != np.dtype(np.int32) or not p.dtype.isnative:
        return None
    seq, pred = np.empty(len(m), np.int64), np.empty(len(m), np.int64)
    bad, prefix = mod.position_counts(np.ascontiguousarray(m), np.ascontiguousarray(p), m.shape[1], p.shape[1],
                                      seq, pred)
    return seq, pred, int(bad), bool(prefix)


def prefix_lengths(values: np.ndarray) -> tuple[np.ndarray, int]:
    """``(counts, bad)``: each row's number of leading non-zero values of a 2-D integer array (int64), and the
    first row that is not non-zeros then zeros (-1: every row is), in one pass (the C loop; NumPy otherwise)."""
    v = np.asarray(values)
    n = v.shape[0]
    mod = native()
    if mod is not None and v.ndim == 2 and v.dtype.kind == "i" and v.dtype.itemsize in (1, 2, 4, 8) \
            and v.shape[1] > 0 and v.dtype.isnative:
        out = np.empty(n, np.int64)
        bad = mod.prefix_lengths(np.ascontiguousarray(v), v.shape[1], out)
        return out, int(bad)
    nz = v != 0
    counts = nz.sum(axis=1, dtype=np.int64)
    ok = ~(nz[:, 1:] & ~nz[:, :-1]).any(axis=1) if v.size else np.ones(n, bool)
    bad = np.flatnonzero(~ok)
    return counts, int(bad[0]) if bad.size else -1
