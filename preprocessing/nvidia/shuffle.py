"""NVIDIA's shuffled shards: every row of the variable-length shards moved to a random shard (``shuffle_samples``).

Reference: NVIDIA MLPerf BERT training_results v3.0/v3.1 ``input_preprocessing/``, two scripts with the same flags
(``--input_hdf5`` and ``--output_hdf5``, both folders; spec §10):

1. the index lists: ``sorted(glob(<input_hdf5>/part_0*.hdf5))``, rows counted from ``input_ids``; the list of
   ``(file, row)`` pairs in file and row order is shuffled with ``random.Random(24).shuffle`` ("the seed is fixed
   to 24"); output shard k takes the next ``rows(input k)`` pairs (every shard keeps its input's row count) and the
   pairs are written as JSON to ``<output_hdf5>/shard_indices_<k:05>.lst``;
2. ``shuffle_samples.py``: every input loaded into memory, then for each shard its rows copied one by one, in list
   order, into ``part_<k:05d>_of_<N:05d>.hdf`` (sic: ``.hdf``; NVIDIA's published ``4320_shards_varlength_shuffled
   .chk`` names ``.hdf5`` files): the four vlen datasets as ``convert_fixed2variable.py`` creates them and
   ``next_sentence_labels`` (i1).

v2.1 shuffled with an unseeded ``random.shuffle`` of the padded shards (not reproducible); v3.0 made it the
two steps above, on the variable-length shards.

Here the same permutation is computed without the Python list (:mod:`preprocessing.pyrandom`, equal to
``random.Random(seed).shuffle``), and the rows move through a bounded external shuffle instead of the whole data
set in memory:

1. count the inputs (and check them); compute the permutation and its inverse (two arrays of n indices, on disk
   as scratch, memory-mapped by the workers);
2. scatter (parallel over input files): each input read in place (:func:`read_rows`: its four vlen datasets'
   global heap collections memory-mapped, every object's header checked against the element naming it; h5py
   where a file is laid out otherwise), its rows sorted by the bucket of their destination (a bucket: consecutive
   output shards, about :attr:`ShuffleConfig.bucket_rows` rows), their values gathered in that order (one C copy
   a row) and appended to the buckets' scratch files; scratch larger than half the memory available (the full
   set's, ~160 GB) goes past the page cache (:mod:`preprocessing.scratch`: ``O_DIRECT``, each batch padded to a
   block; the copy into cache pages costs 0.25-1.7 system seconds a GB here, and such scratch goes to the disk
   and comes back from it anyway);
3. gather (parallel over buckets): a bucket's scratch memory-mapped (or read whole, past the page cache), its rows
   put in destination order by their addresses alone, and its shards written (each via a temporary name, closed
   for good, renamed): HDF5 copies each row's values from the scratch (no gather before); the index lists when
   ``index_lists`` is set; the
   shards of a bucket hashed side by side in one md5_files call;
4. the manifest, last; the scratch folder is removed.

Output names end in ``.hdf5`` (what the published list and NVIDIA's trainer expect); the content of each shard
equals the script's (names, dtypes, shapes, values: tests/preprocessing/nvidia/test_nvidia_shuffle.py), and so do
NVIDIA's ``hdf5_md5`` digests. Memory (:func:`plan_memory`): the permutation step holds one array of n indices at a
time (627 MB for the full set's 156.7 M rows: its peak RSS measured 665 MB), a scatter call one input shard and
its pending records (~140 MB at full size; the padded route's, a piece of 65,536 padded rows cut at full width and
its pending records: ~270 MB, 514 MB peak RSS measured on a real part), a gather call one bucket (~580 MB: 15
shards, hashed side by side).
Scratch disk: about the size of the input.

    bertpipe shuffle-samples --input_hdf5 hdf5_4320_shards_varlength --output_hdf5 hdf5_4320_shards_varlength_shuffled
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import InputError
from core.manifest import (
    MANIFEST_NAME,
    Manifest,
    StageOutput,
    late_fsyncs,
    load_manifest,
    md5_then_fsync,
    remove_debris,
    verify_manifest,
)
from core.pools import can_fork, default_workers, even_calls, run_all, worker_pool
from core.schema import H5_ERRORS
from core.stage import Stage
from preprocessing.hdf5_check import check_compact
from preprocessing.hdf5_io import chunks, reading, tmp_path, verify_inputs, vlen_write
from preprocessing.scratch import ALIGN as _ALIGN
from preprocessing.scratch import RecordWriter, use_direct

log = logging.getLogger(__name__)

STAGE_VERSION = "1"
#: The reference's input pattern (inside --input_hdf5).
INPUT_GLOB = "part_0*.hdf5"
#: Where the scatter step keeps its buckets while the stage runs (inside the output folder; removed at the end).
SCRATCH = ".shuffle-scratch"
#: NVIDIA's variable-length shard: vlen datasets (name, element dtype) in creation order, then the labels.
VLEN = (("input_ids", "int16"), ("segment_ids", "int8"), ("masked_lm_positions", "int16"), ("masked_lm_ids", "int16"))
#: Inputs from which the stage function counts rows on its workers (fewer: here; a pool takes longer to start).
COUNT_POOL_FILES = 64
#: In-memory scatter buffer of a scatter call before it appends to the bucket files.
FLUSH_BYTES = 64 << 20
#: Padded rows the padded route's scatter cuts at once (~100 MB of values at ~400 tokens a row).
PADDED_ROWS = 65536


@dataclass(frozen=True, kw_only=True)
class ShuffleConfig:
    """Parameters of the shuffle (the reference has none but its fixed seed)."""

    seed: int = 24  # random.Random(24) in the reference ("if you want a different shuffling please change")
    index_lists: bool = False  # also write the reference's shard_indices_<k:05>.lst (JSON [[file, row], ...])
    bucket_rows: int = 524288  # rows gathered at once per worker (whole shards: ~15 of the full set's, hashed side by side)
    chunk_rows: int = 8192  # rows read at once


@dataclass(frozen=True, kw_only=True)
class PaddedShuffleConfig(ShuffleConfig):
    """The padded route's parameters: the shuffle's, and the chop's that decide its shards (the reference's
    ``chop_hdf5_files_to_varlength.py --num_shards``, the round whose rule cuts them) and the rows' widths."""

    num_shards: int = 4320
    rule: str = "v3.1"
    max_seq_length: int = 512
    max_predictions_per_seq: int = 76


def key_params(cfg: ShuffleConfig) -> dict[str, Any]:
    """What decides the bytes (not the bucket and chunk sizes)."""
    return {k: v for k, v in asdict(cfg).items() if k not in ("bucket_rows", "chunk_rows")}


def input_files(input_dir: str | Path) -> list[Path]:
    """The reference's inputs: ``sorted(glob(<dir>/part_0*.hdf5))``."""
    return sorted(Path(input_dir).glob(INPUT_GLOB))


def shard_name(k: int, n: int) -> str:
    return f"part_{k:05d}_of_{n:05d}.hdf5"


def list_name(k: int) -> str:
    return f"shard_indices_{k:05}.lst"


# -- step 1: count ------------------------------------------------------------------------------------------
def open_varlength(path: str | Path) -> Any:
    """Open one of NVIDIA's variable-length shards, checking its five datasets (InputError naming the file)."""
    import h5py

    path = Path(path)
    try:
        f = h5py.File(path, "r")
    except FileNotFoundError:
        raise InputError(f"HDF5 file {path} does not exist") from None
    except H5_ERRORS as exc:
        raise InputError(f"{path} is not a readable HDF5 file ({exc}); shuffle-samples reads NVIDIA's "
                         "variable-length shards (chop-hdf5 --varlength / pack-varlength)") from None
    try:
        n = None
        with reading(path, "its datasets"):
            for name, dt in (*VLEN, ("next_sentence_labels", "")):
                ds = f.get(name)
                base = h5py.check_vlen_dtype(ds.dtype) if isinstance(ds, h5py.Dataset) else None
                ok = isinstance(ds, h5py.Dataset) and len(ds.shape) == 1 and (
                    base is not None and base.kind in "iu" if dt else ds.dtype.kind in "iu")
                if not ok or (n is not None and ds.shape[0] != n):
                    raise InputError(f"{path}: no variable-length {name!r} dataset of one row per sample "
                                     "(NVIDIA's packed form: input_ids, segment_ids, masked_lm_positions, masked_lm_ids "
                                     "vlen, next_sentence_labels; make it with chop-hdf5 --varlength)")
                n = ds.shape[0]
    except BaseException:
        f.close()
        raise
    return f


def count_rows(path: str | Path) -> int:
    with open_varlength(path) as f:
        return int(f["input_ids"].shape[0])


# -- the plan: permutation, buckets -------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShufflePlan:
    """Everything the scatter and gather calls need (small, picklable): inputs and counts, the scratch folder
    holding ``perm.npy`` / ``inv.npy``, and the buckets (first shard of each, and the end)."""

    files: tuple[tuple[str, int], ...]
    scratch: str
    bucket_shards: tuple[int, ...]  # bucket b holds shards bucket_shards[b] .. bucket_shards[b+1]-1
    cfg: ShuffleConfig
    #: the padded route (:func:`run_nvidia_shuffle_padded`): the padded parts the rows come from, as
    #: ``(path, rows in the file, rows of it the chop keeps)`` in part order; ``files`` are then the chop's shards
    #: (names and sizes, never written). Empty: the rows come from ``files`` themselves.
    sources: tuple[tuple[str, int, int], ...] = ()

    @property
    def n_shards(self) -> int:
        return len(self.files)

    @property
    def starts(self) -> np.ndarray:
        """Global first destination row of every shard, and the total."""
        return np.concatenate([[0], np.cumsum([c for _, c in self.files], dtype=np.int64)])

    def bucket_rows(self) -> np.ndarray:
        """Global first destination row of every bucket, and the total."""
        return self.starts[list(self.bucket_shards)]


#: Entries of the permutation inverted at once (make_plan: the inverse is built from ``perm.npy`` read in pieces).
INVERT_STEP = 1 << 22


def make_plan(files: Sequence[tuple[str, int]], scratch: str | Path, cfg: ShuffleConfig, workers: int = 1,
              sources: Sequence[tuple[str, int, int]] = ()) -> ShufflePlan:
    """Compute and store the permutation (``perm[t]``: the source row of destination row t) and its inverse; the
    buckets as :func:`_rebuild` cuts them for ``workers``.

    Memory: one array of n indices at a time (4 bytes each below 2**31 rows: 627 MB for the full set's 156.7 M),
    plus :data:`INVERT_STEP` of them: the permutation is stored and dropped, then its inverse built from the file,
    read piece by piece (:func:`plan_memory` says how much)."""
    from preprocessing.pyrandom import shuffle_permutation

    scratch = Path(scratch)
    if scratch.exists():
        shutil.rmtree(scratch)
    scratch.mkdir(parents=True)
    n = sum(c for _, c in files)
    perm = shuffle_permutation(n, cfg.seed)
    np.save(scratch / "perm.npy", perm)
    dtype = perm.dtype
    del perm
    inv = np.empty(n, dtype=dtype)
    with open(scratch / "perm.npy", "rb") as f:
        version = np.lib.format.read_magic(f)
        read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else \
            np.lib.format.read_array_header_2_0
        shape, _, stored = read_header(f)
        if shape != (n,) or stored != dtype:  # pragma: no cover - written just above
            raise InputError(f"{scratch / 'perm.npy'} changed while shuffle-samples ran; run again")
        for a in range(0, n, INVERT_STEP):
            piece = np.fromfile(f, dtype=dtype, count=min(INVERT_STEP, n - a))
            inv[piece] = np.arange(a, a + len(piece), dtype=dtype)
    np.save(scratch / "inv.npy", inv)
    del inv
    if use_direct(scratch, scratch_estimate(files, sources)):
        (scratch / DIRECT_MARK).touch()
    return _rebuild(files, scratch, cfg, workers, sources)


#: In the scratch folder when its buckets go past the page cache (the scatter's and the gather's calls all read it).
DIRECT_MARK = "direct"


def scratch_estimate(files: Sequence[tuple[str, int]], sources: Sequence[tuple[str, int, int]] = ()) -> int:
    """About the bytes the buckets will hold: the variable-length inputs' sizes, or half the padded parts' (a
    padded row of ~256 tokens keeps ~40 % of its bytes when cut)."""
    if sources:
        return sum(os.path.getsize(p) for p, _, _ in sources) // 2
    return sum(os.path.getsize(p) for p, _ in files if os.path.exists(p))


def _direct(scratch: Path) -> bool:
    return (scratch / DIRECT_MARK).exists()


def plan_memory(n: int, cfg: ShuffleConfig = ShuffleConfig(), *, tokens_per_row: float = 256.0,
                preds_per_row: float = 40.0) -> dict[str, int]:
    """Bytes each step of the shuffle holds for ``n`` rows (its arrays; not the interpreter and libraries):
    ``plan`` (the permutation, then its inverse, and a piece), ``scatter`` (a shard's rows and their values, the
    pending records; ``inv`` mapped for its rows only), ``scatter_padded`` (the padded route's: a piece of
    :data:`PADDED_ROWS` padded rows cut at full width, their values gathered by bucket, the pending records),
    ``gather`` (a bucket: its scratch, mapped or read into memory, and the per-row arrays). Rows of ``tokens_per_row`` tokens and
    ``preds_per_row`` masked positions on average."""
    idx = 4 if n < 2**31 else 8
    row = 8 + 4 + 4 + 1 + 3 * tokens_per_row + 4 * preds_per_row  # a scratch record's bytes a row
    shard = max(1, n // 4320)  # NVIDIA's 4,320 shards: the largest count the DAG cuts
    bucket = cfg.bucket_rows + shard  # whole shards until bucket_rows is reached
    return {"plan": int(n * idx + INVERT_STEP * 2 * idx),
            "scatter": int(shard * (row + 3 * 16 + 4 * 8) + shard * (row - 17) + FLUSH_BYTES + shard * idx),
            "scatter_padded": int(PADDED_ROWS * (512 * 3 + 76 * 4 + 16) + PADDED_ROWS * (row + 8 * 4) + FLUSH_BYTES),
            "gather": int(bucket * row + bucket * (8 * 4 + 8 + 4 + 4 + 1 + 8 * 4 + 8))}


# -- step 2: scatter ------------------------------------------------------------------------------------------------
def _flat(rows: np.ndarray, dtype: str) -> tuple[np.ndarray, np.ndarray]:
    """A chunk of vlen rows (object array) as (lengths int32, values concatenated)."""
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int32, count=len(rows))
    if not len(rows) or not lengths.sum():
        return lengths, np.zeros(0, dtype=dtype)
    return lengths, np.concatenate(list(rows)).astype(dtype, copy=False)


@dataclass
class Rows:
    """Rows of a shard in a few flat arrays: per row its lengths and label; per dataset the values of every row
    back to back (``cols``), or, read in place from a memory map of the file, each row's address (``addrs``: the
    values are gathered from there when the rows are moved, with no copy before)."""

    seq: np.ndarray  # int32
    pred: np.ndarray  # int32
    nsl: np.ndarray  # int8
    cols: dict[str, np.ndarray] | None = None
    addrs: dict[str, np.ndarray] | None = None
    keep: Any = None  # what the addresses point into (kept alive with them)

    def gathered(self, order: np.ndarray, space: Any = None) -> dict[str, np.ndarray]:
        """Every dataset's values of rows ``order``, in that order, back to back (``space``, a pack_fast.Space: the
        cut rows' arrays are views of its buffers, valid until its next use)."""
        from preprocessing import pack_fast

        out = {}
        for name, dt in VLEN:
            lens = (self.seq if name in ("input_ids", "segment_ids") else self.pred)[order].astype(np.int64)
            if self.addrs is not None:
                out[name] = _gather_addrs(self.addrs[name][order], lens, np.dtype(dt), space, f"gathered_{name}")
            else:
                col = self.cols[name]
                starts = _starts(self.seq if name in ("input_ids", "segment_ids") else self.pred)[order]
                out[name] = pack_fast.gather_runs([col], None, starts, lens, col.dtype, space=space,
                                                  name=f"gathered_{name}") if pack_fast.available() \
                    else col[_ranges(starts, lens)]
        return out


def _starts(lens: np.ndarray) -> np.ndarray:
    out = np.zeros(len(lens), dtype=np.int64)
    np.cumsum(lens[:-1], out=out[1:])
    return out


def _gather_addrs(addrs: np.ndarray, lens: np.ndarray, dt: np.dtype, space: Any = None,
                  name: str = "gather") -> np.ndarray:
    """The runs of ``lens[i]`` values of type ``dt`` at addresses ``addrs[i]`` of this process, back to back (the C
    gather: one copy a run; ``space``: into its buffer ``name``)."""
    from preprocessing import pack_fast

    total = int(lens.sum())
    out = space.get(name, total, dt) if space is not None else np.empty(total, dtype=dt)
    if len(out):
        pack_fast.native().gather_runs(out, np.ascontiguousarray(addrs, dtype=np.uint64),
                                       np.ascontiguousarray(lens, dtype=np.int64), dt.itemsize)
    return out


#: A vlen dataset's element as HDF5 stores it: the sequence's length, then its global heap ID (the collection's
#: address, the object's index in it), for files of 8-byte addresses and lengths (h5py's default).
_HVL_DISK = np.dtype([("len", "<u4"), ("addr", "<u8"), ("idx", "<u4")])


_GHEAP_OBJ = np.dtype([("idx", "<u2"), ("nrefs", "<u2"), ("reserved", "<u4"), ("size", "<u8")])


def _headers(mm: np.ndarray, at: np.ndarray) -> np.ndarray:
    """The 16-byte global heap object headers at offsets ``at`` of the byte array ``mm`` (one gather)."""
    return np.ascontiguousarray(mm[at[:, None] + np.arange(16)]).view(_GHEAP_OBJ).reshape(-1)


def _mapped_rows(f: Any, path: Path, n: int) -> Rows | None:
    """The rows of a variable-length shard read in place from a memory map of the file, when its four vlen
    datasets are contiguous and their global heap collections hold exactly their rows' sequences, one object each,
    in index order and back to back (as HDF5 writes them, whoever called it). Every object's header is checked
    against the element that names it (collection signature, index, size): any difference, and None is returned
    (the rows are then read through h5py, element by element)."""
    from preprocessing import pack_fast

    if n == 0 or not pack_fast.available() or f.id.get_create_plist().get_sizes() != (8, 8):
        return None
    size = path.stat().st_size
    elems = {}
    for name, dt in VLEN:
        ds = f[name]
        base = h5py_base(ds)
        offset = ds.id.get_offset()
        if base != np.dtype(dt).newbyteorder("<") or ds.chunks is not None or offset is None or \
                ds.id.get_storage_size() != n * _HVL_DISK.itemsize or offset + n * _HVL_DISK.itemsize > size:
            return None
        elems[name] = (offset, base.itemsize)
    try:
        mm = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError):
        return None
    raw = {name: np.frombuffer(mm, dtype=_HVL_DISK, count=n, offset=off) for name, (off, _) in elems.items()}
    lens = {name: r["len"].astype(np.int64) for name, r in raw.items()}
    addr = np.concatenate([r["addr"] for r in raw.values()]).astype(np.int64)
    idx = np.concatenate([r["idx"] for r in raw.values()]).astype(np.int64)
    nbytes = np.concatenate([lens[name] * elems[name][1] for name in raw])
    empty = nbytes == 0  # a row without values has no heap object (HDF5 stores a null heap ID)
    if (addr[empty] != 0).any() or (idx[empty] != 0).any():
        return None
    order = np.flatnonzero(~empty)
    order = order[np.lexsort((idx[order], addr[order]))]
    a, i, nb = addr[order], idx[order], nbytes[order]
    new = np.ones(len(a), dtype=bool)
    new[1:] = a[1:] != a[:-1]
    first = np.flatnonzero(new)
    cid = np.cumsum(new) - 1  # collection of each object, 0..
    rank = np.arange(len(a)) - first[cid]  # place in its collection
    need = 16 + ((nb + 7) & ~7)
    cum = np.cumsum(need) - need
    at = a + 16 + cum - cum[first][cid]  # the object's header, if they lie in index order from the start
    ca = a[first]
    if (i != rank + 1).any() or (ca < 0).any() or (ca + 16 > size).any() or (at + need > size).any():
        return None
    coll = np.ascontiguousarray(mm[ca[:, None] + np.arange(16)])  # "GCOL", version 1, 3 reserved, size
    csize = coll[:, 8:].copy().view("<u8").reshape(-1).astype(np.int64)
    last = np.append(first[1:], len(a)) - 1
    if (coll[:, :4] != np.frombuffer(b"GCOL", dtype=np.uint8)).any() or (coll[:, 4] != 1).any() or \
            (at[last] + need[last] - ca > csize).any() or (ca + csize > size).any():
        return None
    hdr = _headers(mm, at)
    if (hdr["idx"] != i).any() or (hdr["size"].astype(np.int64) != nb).any():
        return None
    data = np.zeros(len(addr), dtype=np.int64)  # (the empty rows' values: none, read from the map's start)
    data[order] = at + 16
    base_addr = mm.ctypes.data
    addrs, o = {}, 0
    for name in raw:
        addrs[name] = (data[o:o + n] + base_addr).astype(np.uint64)
        o += n
    seq, pred = lens["input_ids"], lens["masked_lm_positions"]
    if (lens["segment_ids"] != seq).any() or (lens["masked_lm_ids"] != pred).any():
        row = int(np.flatnonzero((lens["segment_ids"] != seq) | (lens["masked_lm_ids"] != pred))[0])
        raise InputError(f"{path}: row {row}: segment_ids / masked_lm_ids do not have the length of "
                         "input_ids / masked_lm_positions; the file is corrupt, re-create it")
    with reading(path, "next_sentence_labels"):
        nsl = f["next_sentence_labels"][:].astype(np.int8)
    return Rows(seq=seq.astype(np.int32), pred=pred.astype(np.int32), nsl=nsl, addrs=addrs, keep=mm)


def h5py_base(ds: Any) -> np.dtype | None:
    import h5py

    return h5py.check_vlen_dtype(ds.dtype)


def read_rows(f: Any, path: Path, n: int, chunk_rows: int) -> Rows:
    """Every row of an open variable-length shard (checked: lengths, values as :func:`check_compact` says)."""
    rows = _mapped_rows(f, path, n)
    if rows is None:  # h5py, chunk by chunk
        parts: dict[str, list[np.ndarray]] = {k: [] for k in ("seq", "pred", "nsl", *(nm for nm, _ in VLEN))}
        for a, b in chunks(n, chunk_rows):
            with reading(path, f"rows {a}..{b - 1}"):
                data = {name: f[name][a:b] for name, _ in VLEN}
                nsl = f["next_sentence_labels"][a:b].astype(np.int8)
            seq_len, ids = _flat(data["input_ids"], "int16")
            seg_len, seg = _flat(data["segment_ids"], "int8")
            pred_len, pos = _flat(data["masked_lm_positions"], "int16")
            mlm_len, mlm = _flat(data["masked_lm_ids"], "int16")
            if (seg_len != seq_len).any() or (mlm_len != pred_len).any():
                row = int(np.flatnonzero((seg_len != seq_len) | (mlm_len != pred_len))[0])
                raise InputError(f"{path}: row {a + row}: segment_ids / masked_lm_ids do not have the length of "
                                 "input_ids / masked_lm_positions; the file is corrupt, re-create it")
            for k, v in (("seq", seq_len), ("pred", pred_len), ("nsl", nsl), ("input_ids", ids),
                         ("segment_ids", seg), ("masked_lm_positions", pos), ("masked_lm_ids", mlm)):
                parts[k].append(v)
        cat = {k: (np.concatenate(v) if v else np.zeros(0, dtype=dt))
               for (k, v), dt in zip(parts.items(), (np.int32, np.int32, np.int8, np.int16, np.int8, np.int16,
                                                     np.int16), strict=True)}
        rows = Rows(seq=cat["seq"], pred=cat["pred"], nsl=cat["nsl"],
                    cols={name: cat[name] for name, _ in VLEN})
    return rows


def _check_rows(path: Path, rows: Rows, cols: dict[str, np.ndarray], order: np.ndarray) -> None:
    """The shared rules (hdf5_check.check_compact) on a shard's rows, gathered in ``order`` (rows named by their
    place in the file): a few reductions when they hold, check_compact itself (its refusal) when one does not."""
    seq, pred, nsl = rows.seq[order], rows.pred[order], rows.nsl[order]
    pos = cols["masked_lm_positions"]

    def within(a: np.ndarray, lo: int, hi: int | None = None) -> bool:
        return not a.size or (int(a.min()) >= lo and (hi is None or int(a.max()) <= hi))

    ok = within(seq, 1) and within(cols["input_ids"], 0) and within(cols["masked_lm_ids"], 0) and \
        within(cols["segment_ids"], 0, 1) and within(nsl, 0, 1) and within(pos, 1)
    if ok and pos.size:
        has = pred > 0
        top = np.maximum.reduceat(pos, _starts(pred.astype(np.int64))[has])  # each row's largest position
        ok = bool((top < seq[has]).all())
    if not ok:
        check_compact(path, 0, seq, pred, ids=cols["input_ids"], seg=cols["segment_ids"], pos=pos,
                      mlm=cols["masked_lm_ids"], nsl=nsl, row_ids=order)


class _Buckets:
    """Records per bucket, kept in memory (the arrays themselves) and appended to ``<scratch>/b<bucket>.t<task>``
    when large: one vectored write a bucket file through the page cache, or, for scratch larger than memory
    (:data:`DIRECT_MARK`), each bucket's records copied into aligned buffers, padded to a block boundary and written
    past the page cache by a thread while the call goes on (:class:`preprocessing.scratch.RecordWriter`; leaving
    the ``with`` block waits for the writes)."""

    def __init__(self, scratch: Path, task: int) -> None:
        self.scratch, self.task = scratch, task
        self.pending: dict[int, list[np.ndarray]] = {}
        self.size = 0
        self.writer = RecordWriter(direct=_direct(scratch))

    def add(self, bucket: int, parts: Sequence[np.ndarray]) -> None:
        arrs = [np.ascontiguousarray(p) for p in parts]
        self.pending.setdefault(bucket, []).extend(arrs)
        self.size += sum(x.nbytes for x in arrs)
        if self.size >= FLUSH_BYTES:
            self.flush()

    def add_many(self, bks: np.ndarray, columns: Sequence[tuple[np.ndarray, np.ndarray]]) -> bool:
        """One record for each bucket of ``bks``, all at once: the header, then each column's slice
        ``array[cut[b]:cut[b + 1]]`` (``columns``: (array, cut) pairs), as :meth:`add` of those arrays then
        :meth:`flush` would append them (the same bytes), handed to the writer in one go
        (:meth:`RecordWriter.append_records`). At the full set's ~300 buckets, a chunk's records are ~0.3 MB
        each, and the Python steps of one record at a time cost the scatter 40 % more CPU than at 3 buckets.
        False (nothing done) where that does not apply: records pending, the page cache's writes, no C
        extension, or a record larger than the writer's buffer (a few buckets: the records are few anyway)."""
        from preprocessing import pack_fast

        if self.pending or not self.writer.direct or not pack_fast.available() or not len(bks):
            return False
        arrays = [np.ascontiguousarray(a) for a, _ in columns]
        lens = np.empty((len(bks), len(columns) + 1), np.int64)
        addrs = np.empty((len(bks), len(columns) + 1), np.uint64)
        header = np.zeros((len(bks), 4), np.int64)
        for k, cut in ((0, columns[0][1]), (1, columns[4][1]), (2, columns[6][1])):  # rows, tokens, predictions
            header[:, k] = cut[bks + 1] - cut[bks]
        lens[:, 0], addrs[:, 0] = 32, header.ctypes.data + 32 * np.arange(len(bks), dtype=np.uint64)
        for j, (a, (_, cut)) in enumerate(zip(arrays, columns, strict=True), start=1):
            lens[:, j] = (cut[bks + 1] - cut[bks]) * a.itemsize
            addrs[:, j] = np.uint64(a.ctypes.data) + (cut[bks] * a.itemsize).astype(np.uint64)
        if int(lens.sum(axis=1).max()) + 2 * _ALIGN > self.writer.PIECE:
            return False
        self.writer.append_records([self.scratch / f"b{b:05d}.t{self.task:05d}" for b in bks.tolist()], addrs, lens)
        return True

    def flush(self) -> None:
        """Hand every pending record to the writer (copied: the arrays may be reused as soon as this returns)."""
        for b, arrs in self.pending.items():
            self.writer.append(self.scratch / f"b{b:05d}.t{self.task:05d}", arrs)
        self.pending, self.size = {}, 0

    def __enter__(self) -> _Buckets:
        return self

    def __exit__(self, *exc: object) -> None:
        self.writer.close()


def scatter(plan: ShufflePlan, task: int, file_ids: Sequence[int]) -> dict[str, Any]:
    """Send every row of inputs ``file_ids`` to the bucket of its destination (scratch files of task ``task``):
    a shard's rows are sorted by bucket once, their values gathered in that order, and each bucket's slice of
    them appended to its file. On the padded route the ids are the plan's ``sources`` (padded parts), read
    :data:`PADDED_ROWS` rows at a time and cut as the chop cuts them."""
    scratch = Path(plan.scratch)
    inv = np.load(scratch / "inv.npy", mmap_mode="r")
    bstart = plan.bucket_rows()
    with _Buckets(scratch, task) as out:  # every write done (or its error raised) before the call returns
        rows_done = _scatter_padded(plan, file_ids, inv, bstart, out) if plan.sources else \
            _scatter_varlength(plan, file_ids, inv, bstart, out)
        out.flush()
    return {"kind": "scatter", "task": task, "rows": rows_done}


def _scatter_varlength(plan: ShufflePlan, file_ids: Sequence[int], inv: np.ndarray, bstart: np.ndarray,
                       out: _Buckets) -> int:
    """The scatter of variable-length shards ``file_ids`` (their rows read in place where they can be)."""
    from preprocessing import pack_fast

    firsts = plan.starts
    rows_done = 0
    space = pack_fast.process_space("shuffle-scatter")  # the gathered arrays, used again file after file, call after call
    for fid in file_ids:
        path, n = plan.files[fid]
        with open_varlength(path) as f:
            if f["input_ids"].shape[0] != n:
                raise InputError(f"{path} changed while shuffle-samples ran (it had {n} rows); run again")
            rows = read_rows(f, Path(path), n, plan.cfg.chunk_rows)
            dst = np.asarray(inv[firsts[fid]:firsts[fid] + n], dtype=np.int64)
            bucket, order = _by_bucket(dst, bstart)
            with reading(Path(path), "its rows"):
                cols = rows.gathered(order, space)
            del rows.keep
        _check_rows(Path(path), rows, cols, order)
        _send(out, rows, cols, order, bucket, dst, len(bstart) - 1)
        out.flush()  # the records are views of the space's buffers, which the next file writes
        rows_done += n
    return rows_done


def _by_bucket(dst: np.ndarray, bstart: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's bucket (by its destination row), and the rows in destination order (so in bucket order too: a
    bucket is a range of destinations). Each record a bucket receives then holds its rows in the order the gather
    writes them: the gather reads the bucket's records as a few streams, not the rows at random."""
    n = len(dst)
    order = np.argsort(dst, kind="stable")
    if len(bstart) == 2:
        return np.zeros(n, dtype=np.int64), order
    return np.searchsorted(bstart, dst, side="right") - 1, order


def _send(out: _Buckets, rows: Rows, cols: dict[str, np.ndarray], order: np.ndarray, bucket: np.ndarray,
          dst: np.ndarray, nb: int) -> None:
    """Append each bucket's slice of the rows (in ``order``, their values ``cols`` gathered in that order)."""
    seq, pred, nsl, d = rows.seq[order], rows.pred[order], rows.nsl[order], dst[order]
    r_cut = np.zeros(nb + 1, dtype=np.int64)
    np.cumsum(np.bincount(bucket, minlength=nb), out=r_cut[1:])
    t_cut = np.concatenate([[0], np.cumsum(seq, dtype=np.int64)])[r_cut]
    p_cut = np.concatenate([[0], np.cumsum(pred, dtype=np.int64)])[r_cut]
    bks = np.flatnonzero(np.diff(r_cut))
    columns = [(d, r_cut), (seq, r_cut), (pred, r_cut), (nsl, r_cut), (cols["input_ids"], t_cut),
               (cols["segment_ids"], t_cut), (cols["masked_lm_positions"], p_cut), (cols["masked_lm_ids"], p_cut)]
    if out.add_many(bks, columns):
        return
    for bk in bks.tolist():
        r0, r1, t0, t1, p0, p1 = r_cut[bk], r_cut[bk + 1], t_cut[bk], t_cut[bk + 1], p_cut[bk], p_cut[bk + 1]
        header = np.array([r1 - r0, t1 - t0, p1 - p0, 0], dtype=np.int64)
        out.add(bk, [header, d[r0:r1], seq[r0:r1], pred[r0:r1], nsl[r0:r1], cols["input_ids"][t0:t1],
                     cols["segment_ids"][t0:t1], cols["masked_lm_positions"][p0:p1], cols["masked_lm_ids"][p0:p1]])


def _scatter_padded(plan: ShufflePlan, source_ids: Sequence[int], inv: np.ndarray, bstart: np.ndarray,
                    out: _Buckets) -> int:
    """The padded route's scatter: rows of padded parts ``source_ids``, checked and cut as chop-hdf5 --varlength
    checks and cuts them (preprocessing.nvidia.varlength.compact_padded: the same refusals), sent to their
    buckets. The rows a part holds past the chop's last shard (rule v1.1) are left out, as the chop leaves them."""
    from preprocessing import pack_fast
    from preprocessing.nvidia.chop import ChopConfig, PaddedInputs
    from preprocessing.nvidia.varlength import compact_padded

    cfg = plan.cfg
    space = pack_fast.process_space("shuffle-scatter")  # the cut's and the gather's arrays, chunk after chunk
    width = getattr(cfg, "max_seq_length", 512)
    inputs = PaddedInputs(ChopConfig(max_seq_length=width,
                                     max_predictions_per_seq=getattr(cfg, "max_predictions_per_seq", 76)))
    firsts = np.concatenate([[0], np.cumsum([k for _, _, k in plan.sources], dtype=np.int64)])
    done = 0
    try:
        for sid in source_ids:
            path, rows_in, keep = plan.sources[sid]
            f = inputs.open(path)
            if f["next_sentence_labels"].shape[0] != rows_in:
                raise InputError(f"{path} changed while shuffle-samples ran (it had {rows_in} rows); run again")
            for a, b in chunks(keep, PADDED_ROWS):
                dst = np.asarray(inv[firsts[sid] + a:firsts[sid] + b], dtype=np.int64)
                bucket, order = _by_bucket(dst, bstart)
                with reading(Path(path), f"rows {a}..{b - 1}"):  # the cut reads the part in its order ...
                    c = compact_padded(inputs.rows(path, a, b), Path(path), a, width, space=space)
                rows = Rows(seq=c.seq.astype(np.int32), pred=c.pred.astype(np.int32), nsl=c.nsl.astype(np.int8),
                            cols=c.flat)
                cols = rows.gathered(order, space)  # ... and the rows move into destination order in memory
                _send(out, rows, cols, order, bucket, dst, len(bstart) - 1)
                out.flush()  # the records are views of the space's buffers, which the next chunk writes
                done += b - a
    finally:
        inputs.close()
    return done


# -- step 3: gather and write ------------------------------------------------------------------------------------
_FIELDS = (("dst", np.int64, "r"), ("seq", np.int32, "r"), ("pred", np.int32, "r"), ("nsl", np.int8, "r"),
           ("ids", np.int16, "t"), ("seg", np.int8, "t"), ("pos", np.int16, "p"), ("mlm", np.int16, "p"))


def _read_bucket(scratch: Path, bucket: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[Any]]:
    """A bucket's records, in place: the per-row fields concatenated (dst, seq, pred, nsl) and, per row, the
    address of its values in the files' buffers (ids, seg, pos, mlm); and the buffers, to keep alive. Each file is
    memory-mapped, or, where the scratch went past the page cache, read whole past it too
    (:func:`preprocessing.scratch.read_whole`); there a zero header is a batch's padding (records resume at the
    next block)."""
    from preprocessing import pack_fast
    from preprocessing.scratch import ALIGN, aligned_from, next_block, read_whole

    rows: dict[str, list[np.ndarray]] = {"dst": [], "seq": [], "pred": [], "nsl": []}
    addrs: dict[str, list[np.ndarray]] = {"ids": [], "seg": [], "pos": [], "mlm": []}
    bufs = []
    direct = _direct(scratch)
    files = [(p, p.stat().st_size) for p in sorted(scratch.glob(f"b{bucket:05d}.t*"))]
    files = [(p, size) for p, size in files if size]
    if direct:  # the bucket's files side by side in one buffer, the worker's from one gather call to the next
        at_file = np.cumsum([0] + [-(-size // ALIGN) * ALIGN for _, size in files])
        whole = aligned_from(pack_fast.process_space("shuffle-gather"), "bucket", int(at_file[-1]))
    for i, (p, _) in enumerate(files):
        # HDF5 then copies the values from here: no gather before
        buf = read_whole(p, into=whole[at_file[i]:at_file[i + 1]]) if direct else \
            np.memmap(p, dtype=np.uint8, mode="r")
        bufs.append(buf)
        base = buf.ctypes.data
        at = 0
        while at + 32 <= len(buf):
            r, t, q, _ = np.frombuffer(buf, dtype=np.int64, count=4, offset=at).tolist()
            if r == 0:  # a batch's padding: a record never holds 0 rows
                at = next_block(at)
                continue
            at += 32
            fields = {}
            for name, dt, kind in _FIELDS:
                count = {"r": r, "t": t, "p": q}[kind]
                if kind == "r":
                    fields[name] = np.frombuffer(buf, dtype=dt, count=count, offset=at)
                    rows[name].append(fields[name])
                else:
                    lens = fields["seq"] if kind == "t" else fields["pred"]
                    addrs[name].append(base + at + _starts(lens.astype(np.int64)) * np.dtype(dt).itemsize)
                at += count * np.dtype(dt).itemsize
    out_rows = {name: (np.concatenate(v) if v else np.zeros(0, dtype=dt))
                for (name, dt, _), v in zip(_FIELDS[:4], rows.values(), strict=True)}
    out_addrs = {name: (np.concatenate(v) if v else np.zeros(0, dtype=np.int64)) for name, v in addrs.items()}
    return out_rows, out_addrs, bufs


def _ranges(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Indices ``starts[i] .. starts[i] + lengths[i] - 1`` for every i, concatenated."""
    total = int(lengths.sum())
    if not total:
        return np.zeros(0, dtype=np.int64)
    # 4-byte indices where they fit (half the memory traffic of the repeat and the gathers); the same values
    dt = np.int32 if max(total, int(starts.max()) + int(lengths.max())) < 2**31 else np.int64
    shift = np.repeat((starts - (np.cumsum(lengths) - lengths)).astype(dt), lengths)
    shift += np.arange(total, dtype=dt)
    return shift


def _index_list(perm: np.ndarray, file_starts: np.ndarray) -> str:
    """NVIDIA's ``json.dumps`` of the (file, row) pairs of source rows ``perm``."""
    f = np.searchsorted(file_starts, perm, side="right") - 1
    r = perm - file_starts[f]
    return "[" + ", ".join(f"[{a}, {b}]" for a, b in zip(f.tolist(), r.tolist(), strict=True)) + "]"


def write_vlen_at(ds: Any, counts: np.ndarray, addrs: np.ndarray, start: int) -> None:
    """``ds[start + i] = the counts[i] values at address addrs[i]`` (of the dataset's element type, in this
    process's memory) for every i, in one HDF5 write: what :func:`hdf5_io.write_vlen` writes for the same rows
    given back to back (the same ``hvl_t`` elements, pointing where the values already are: no gather first)."""
    import h5py
    from h5py import h5s, h5t

    n = len(counts)
    if not n:
        return
    base = h5py.check_vlen_dtype(ds.dtype)
    hvl = np.empty(n, dtype=[("len", np.uintp), ("p", np.uintp)])
    hvl["len"] = counts
    hvl["p"] = addrs
    fspace = ds.id.get_space()
    fspace.select_hyperslab((start,), (n,))
    vlen_write(ds.id, h5s.create_simple((n,)), fspace, hvl, h5t.vlen_create(h5t.py_create(np.dtype(base))))


def gather(plan: ShufflePlan, bucket: int, out_dir: str | Path) -> dict[str, Any]:
    """Write the shards of ``bucket`` into ``out_dir``; returns their entries ``[name, bytes, md5]``. The rows are
    put in destination order by their addresses alone: each HDF5 write takes the values where the scratch
    buffers hold them."""
    import h5py

    from preprocessing import pack_fast
    from preprocessing.packing import ImageOutputs

    out_dir = Path(out_dir)
    data, addrs, bufs = _read_bucket(Path(plan.scratch), bucket)
    k0, k1 = plan.bucket_shards[bucket], plan.bucket_shards[bucket + 1]
    starts = plan.starts
    dst = data["dst"] - starts[k0]
    total = int(starts[k1] - starts[k0])
    order = np.full(total, -1, dtype=np.int64)
    ok = len(dst) == total and (dst >= 0).all() and (dst < total).all()
    if ok:
        order[dst] = np.arange(total, dtype=np.int64)
        ok = bool((order >= 0).all())
    if not ok:
        raise InputError(f"shuffle-samples: the scratch of shards {k0}..{k1 - 1} is incomplete (in {plan.scratch}); "
                         "run again")
    seq, pred, nsl = data["seq"][order], data["pred"][order], data["nsl"][order]
    where = {"input_ids": addrs["ids"][order], "segment_ids": addrs["seg"][order],
             "masked_lm_positions": addrs["pos"][order], "masked_lm_ids": addrs["mlm"][order]}
    del data, addrs, dst, order
    t_cum = np.concatenate([[0], np.cumsum(seq, dtype=np.int64)])
    perm = np.load(Path(plan.scratch) / "perm.npy", mmap_mode="r") if plan.cfg.index_lists else None
    p_cum = np.concatenate([[0], np.cumsum(pred, dtype=np.int64)])
    finals: list[Path] = []
    # each shard built in memory by HDF5's core driver, written in one call (past the page cache as the scratch is)
    # and hashed from memory (preprocessing.packing.ImageOutputs: the bytes HDF5's file driver writes)
    outputs = ImageOutputs(pack_fast.process_space("shuffle-gather"), direct=_direct(Path(plan.scratch)))
    # each shard's writeback started as it closes, all fsynced after their md5s; the images written behind
    # (ImageOutputs.BEHIND), every write done when the block ends
    with outputs, late_fsyncs():
        for k in range(k0, k1):
            a, b = int(starts[k] - starts[k0]), int(starts[k + 1] - starts[k0])
            final = out_dir / shard_name(k, plan.n_shards)
            tmp = tmp_path(final)
            # at most its values (3 bytes a token, 4 a masked position), 16 bytes a row in each vlen dataset and
            # ~24 in the global heap, the heaps' collections' slack and the metadata
            data = 3 * int(t_cum[b] - t_cum[a]) + 4 * int(p_cum[b] - p_cum[a]) + (b - a)
            try:
                with outputs.create(tmp, 2 * data + 64 * (b - a) * len(VLEN) + (1 << 20)) as f:
                    dsets = {name: f.create_dataset(name, (b - a,), dtype=h5py.vlen_dtype(np.dtype(dt)))
                             for name, dt in VLEN}
                    labels = f.create_dataset("next_sentence_labels", data=np.zeros(b - a, dtype="i1"), dtype="i1")
                    for c0, c1 in chunks(b - a, plan.cfg.chunk_rows):  # these writes make the file's bytes: kept
                        r0, r1 = a + c0, a + c1
                        for name, _ in VLEN:
                            lens = seq if name in ("input_ids", "segment_ids") else pred
                            write_vlen_at(dsets[name], lens[r0:r1], where[name][r0:r1], c0)  # one HDF5 write
                        labels[c0:c1] = nsl[r0:r1]
                outputs.rename(tmp, final)
            except BaseException as exc:
                tmp.unlink(missing_ok=True)
                from core.manifest import raise_if_disk_full

                raise_if_disk_full(exc, final)
                raise
            finals.append(final)
            if perm is not None:
                lst = out_dir / list_name(k)
                ltmp = tmp_path(lst)
                ltmp.write_text(_index_list(np.asarray(perm[starts[k]:starts[k + 1]], dtype=np.int64), starts),
                                encoding="ascii")
                os.replace(ltmp, lst)
                finals.append(lst)
        known = outputs.md5s()
    del bufs
    return {"kind": "shards", "bucket": bucket,
            "entries": [[p.name, p.stat().st_size, md5]
                        for p, md5 in zip(finals, md5_then_fsync(finals, known), strict=True)]}


# -- step 4: the manifest ------------------------------------------------------------------------------------------
def finish_shuffle(out_dir: str | Path, plan: ShufflePlan, written: Sequence[dict[str, Any]],
                   upstream: Sequence[Manifest] = (), *, manifest_name: str = MANIFEST_NAME) -> Manifest:
    """The stage manifest (every shard, and list, in order); the scratch folder removed first."""
    shutil.rmtree(plan.scratch, ignore_errors=True)
    got = {e[0]: e[2] for w in written for e in w["entries"]}
    names = [shard_name(k, plan.n_shards) for k in range(plan.n_shards)]
    if plan.cfg.index_lists:
        names += [list_name(k) for k in range(plan.n_shards)]
    missing = [nm for nm in names if nm not in got]
    if missing:  # pragma: no cover - the buckets cover every shard by construction
        raise InputError(f"shuffle-samples: {len(missing)} file(s) were not written (e.g. {missing[0]}); run again")
    with StageOutput(out_dir, "nvidia_shuffle", params=key_params(plan.cfg), upstream=upstream,
                     code_version=STAGE_VERSION, manifest_name=manifest_name) as out:
        for nm in names:
            out.add_file(nm, got[nm])
        out.count("files", plan.n_shards)
        out.count("rows", int(plan.starts[-1]))
    return out.manifest


# -- all steps in one call ------------------------------------------------------------------------------------------
def scatter_tasks(plan: ShufflePlan, workers: int) -> list[tuple[int, list[int]]]:
    """(task, input files) calls: about 4 per worker, contiguous runs of files of similar row counts (on the padded
    route, of the padded parts)."""
    n = len(plan.sources) if plan.sources else plan.n_shards
    t = max(1, min(n, 4 * max(1, workers)))
    bounds = [n * i // t for i in range(t + 1)]
    return [(i, list(range(a, b))) for i, (a, b) in enumerate(zip(bounds, bounds[1:], strict=False)) if b > a]


def _begin(out_dir: Path, manifest_name: str) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / manifest_name).unlink(missing_ok=True)
    remove_debris(out_dir)


def run_nvidia_shuffle(inputs: Sequence[Path], out_dir: Path, cfg: ShuffleConfig = ShuffleConfig(), *,
                       upstream: Sequence[Manifest] = (), workers: int = 1,
                       manifest_name: str = MANIFEST_NAME) -> Manifest:
    """Stage function: ``out_dir/part_<k:05d>_of_<N:05d>.hdf5`` for each of the N inputs (given in the reference's
    order, sorted part_0*.hdf5), rows shuffled across shards as NVIDIA's scripts do; manifest last."""
    files = [Path(p) for p in inputs]
    if not files:
        raise InputError(f"shuffle-samples got no input files (the reference reads <input_hdf5>/{INPUT_GLOB})")
    verify_inputs(files, upstream, workers=workers)
    # counting opens each file (milliseconds): a pool of its own only for many files
    counts = run_all(count_rows, [(str(p),) for p in files], workers if len(files) > COUNT_POOL_FILES else 1)
    out_dir = Path(out_dir)
    _begin(out_dir, manifest_name)
    plan = make_plan(list(zip(map(str, files), counts, strict=True)), out_dir / SCRATCH, cfg, workers)
    try:
        return _scatter_gather(plan, out_dir, workers, upstream, manifest_name)
    finally:
        shutil.rmtree(plan.scratch, ignore_errors=True)


def _scatter_gather(plan: ShufflePlan, out_dir: Path, workers: int, upstream: Sequence[Manifest],
                    manifest_name: str) -> Manifest:
    """Steps 2-4 of one call: the scatter tasks, the buckets' shards, the manifest."""
    log.info("%d rows of %d shards: permutation of random.Random(%d) ready; %d bucket(s)", int(plan.starts[-1]),
             plan.n_shards, plan.cfg.seed, len(plan.bucket_shards) - 1)
    tasks = scatter_tasks(plan, workers)
    buckets = range(len(plan.bucket_shards) - 1)
    if workers > 1 and max(len(tasks), len(buckets)) > 1 and can_fork(workers):
        with worker_pool(min(workers, max(len(tasks), len(buckets)))) as pool:  # one pool for both steps
            for f in [pool.submit(scatter, plan, t, ids) for t, ids in tasks]:
                f.result()
            written = [f.result() for f in [pool.submit(gather, plan, b, str(out_dir)) for b in buckets]]
    else:
        for t, ids in tasks:
            scatter(plan, t, ids)
        written = [gather(plan, b, str(out_dir)) for b in buckets]
    return finish_shuffle(out_dir, plan, written, upstream, manifest_name=manifest_name)


def _chop_config(cfg: PaddedShuffleConfig) -> Any:
    from preprocessing.nvidia.chop import ChopConfig

    return ChopConfig(num_shards=cfg.num_shards, rule=cfg.rule, varlength=True, max_seq_length=cfg.max_seq_length,
                      max_predictions_per_seq=cfg.max_predictions_per_seq)


def padded_plan(counts: Sequence[tuple[str, int]], scratch: Path, cfg: PaddedShuffleConfig, workers: int = 1,
                ) -> ShufflePlan:
    """The padded route's plan from the padded parts' row counts (in part order): the chop's shards (its rule's
    sizes; InputError where chop_hdf5_files.py crashes), each part's rows the shards keep, the permutation."""
    files, sources = _padded_layout(counts, cfg, log_it=True)
    return make_plan(files, scratch, cfg, workers, sources=sources)


def _padded_layout(counts: Sequence[tuple[str, int]], cfg: PaddedShuffleConfig, log_it: bool = False,
                   ) -> tuple[list[tuple[str, int]], list[tuple[str, int, int]]]:
    """The chop's shards (names, sizes) and each part's ``(path, rows, rows kept)`` for parts of ``counts``."""
    from preprocessing.nvidia.chop import _log_layout, chop_layout
    from preprocessing.nvidia.chop import shard_name as chop_shard

    layout = chop_layout(sum(int(n) for _, n in counts), cfg.num_shards, cfg.rule)
    if log_it:
        _log_layout(layout)
    sources, base = [], 0
    for path, n in counts:
        sources.append((str(path), int(n), max(0, min(int(n), layout.kept - base))))
        base += int(n)
    return [(chop_shard(k, layout.n_shards), layout.size(k)) for k in range(layout.n_shards)], sources


def run_nvidia_shuffle_padded(parts: Sequence[Path], out_dir: Path, cfg: PaddedShuffleConfig = PaddedShuffleConfig(),
                              *, upstream: Sequence[Manifest] = (), workers: int = 1,
                              manifest_name: str = MANIFEST_NAME) -> Manifest:
    """NVIDIA's shuffled shards straight from the padded parts (the reference's inputs of chop_hdf5_files_to_
    varlength.py, sorted part-00???-of-00500.hdf5): the bytes :func:`run_nvidia_shuffle` writes from the chop's
    variable-length shards (``cfg``'s num_shards and rule), without writing those shards. The chop's checks and
    refusals apply to the parts' rows; its shards are the index lists' files."""
    from preprocessing.nvidia.chop import count_rows as count_padded

    files = [Path(p) for p in parts]
    if not files:
        raise InputError("shuffle-samples got no padded parts (part-00???-of-00500.hdf5)")
    verify_inputs(files, upstream, workers=workers)
    ccfg = _chop_config(cfg)
    counts = run_all(count_padded, [(str(p), ccfg) for p in files], workers if len(files) > COUNT_POOL_FILES else 1)
    out_dir = Path(out_dir)
    _begin(out_dir, manifest_name)
    plan = padded_plan(list(zip(map(str, files), counts, strict=True)), out_dir / SCRATCH, cfg, workers)
    try:
        return _scatter_gather(plan, out_dir, workers, upstream, manifest_name)
    finally:
        shutil.rmtree(plan.scratch, ignore_errors=True)


# -- the DAG's declaration (core/stage.py); the lead wires it into preprocessing/registry.py -------------------------
def scatter_piece(plan: ShufflePlan, task: int, file_ids: list[int], out_dir: Path) -> dict[str, Any]:
    return scatter(plan, task, file_ids)


def gather_piece(plan: ShufflePlan, bucket: int, out_dir: Path) -> dict[str, Any]:
    return gather(plan, bucket, out_dir)


def _rebuild(files: Sequence[tuple[str, int]], scratch: Path, cfg: ShuffleConfig, workers: int = 1,
             sources: Sequence[tuple[str, int, int]] = ()) -> ShufflePlan:
    """The plan of :func:`make_plan` again, without recomputing the permutation (already in ``scratch``). Buckets:
    runs of whole shards of about even row counts, as many for each worker (core.pools.even_calls: the fewest of
    at most :attr:`ShuffleConfig.bucket_rows` rows, rounded up to a multiple of ``workers``; 1.48 M rows on 2
    workers are 4 buckets of ~371 k, not 524 k, 524 k and 436 k), each cut at the shard boundary nearest its even
    share (a bucket holds at most about one shard more). The bytes do not depend on it."""
    counts = [int(c) for _, c in files]
    total = sum(counts)
    n = len(counts)
    n_b = even_calls(total, cfg.bucket_rows, workers) if total else 1
    n_b = max(1, min(n_b, n))
    cum = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
    bounds = [0]
    for i in range(1, n_b):
        target = total * i / n_b
        k = int(np.searchsorted(cum, target))  # the first boundary at or past the target, or the one before it
        if k > 0 and target - cum[k - 1] < cum[min(k, n)] - target:
            k -= 1
        k = min(max(k, bounds[-1] + 1), n - (n_b - i))  # strictly increasing, a shard left for each later bucket
        bounds.append(k)
    bounds.append(n)
    return ShufflePlan(files=tuple((str(p), int(c)) for p, c in files), scratch=str(scratch),
                       bucket_shards=tuple(bounds), cfg=cfg,
                       sources=tuple((str(p), int(r), int(k)) for p, r, k in sources))


def count_padded_piece(paths: Sequence[str], hdf5_dirs: Sequence[str], out_dir: Path, cfg: PaddedShuffleConfig,
                       ) -> dict[str, Any]:
    """DAG piece of the padded route: check a few parts' HDF5 against their manifests, count their rows."""
    from preprocessing.nvidia.chop import count_rows as count_padded

    for d in hdf5_dirs:
        verify_manifest(d, trust_stat=True)
    ccfg = _chop_config(cfg)
    return {"kind": "count-list", "counts": [[p, count_padded(p, ccfg)] for p in paths]}


def _plan_padded(plan: Any) -> list[Any]:
    """Pieces: count every part's rows, in part order (as the chop and the bins do)."""
    from preprocessing.mlperf.split_4bins import count_pieces

    return count_pieces(plan, count_padded_piece)


def _finish_padded(plan: Any, values: list[dict[str, Any]]) -> Manifest | list[Any]:
    workers = plan.params.workers or default_workers()
    counts = [c for v in values if v["kind"] == "count-list" for c in v["counts"]]
    scattered = [v for v in values if v["kind"] == "scatter"]
    written = [v for v in values if v["kind"] == "shards"]
    out_dir = Path(plan.dir)
    if not scattered:  # after the counts: the chop's shards, the permutation, then the scatter pieces
        _begin(out_dir, MANIFEST_NAME)
        sp = padded_plan(counts, out_dir / SCRATCH, plan.cfg, workers)
        return [replace(plan.unit(sp, t, ids, shard=f"scatter/{t:05d}", upstream=[]),
                        run=scatter_piece, piece=True, pass_upstream=False, out_dir=str(out_dir))
                for t, ids in scatter_tasks(sp, workers)]
    files, sources = _padded_layout(counts, plan.cfg)
    sp = _rebuild(files, out_dir / SCRATCH, plan.cfg, workers, sources)
    if not written:
        return [replace(plan.unit(sp, b, shard=f"gather/{b:05d}", upstream=[]),
                        run=gather_piece, piece=True, pass_upstream=False, out_dir=str(out_dir))
                for b in range(len(sp.bucket_shards) - 1)]
    h5 = plan.result("hdf5")
    upstream = [load_manifest(h5.unit_dir(s)) for s in h5.shards]
    return finish_shuffle(out_dir, sp, written, [m for m in upstream if m is not None])


def _padded_stage(name: str, n: int, rule: str, targets: tuple[str, ...], output: str) -> Stage:
    from preprocessing.nvidia.chop import dag_shards

    return Stage(name=name, title=f"shuffle_samples of chop_hdf5_files_to_varlength's {n} shards (rule {rule}), "
                 "straight from the padded parts (random.Random(24))",
                 reads=("hdf5",), run=run_nvidia_shuffle_padded, version=STAGE_VERSION, config=PaddedShuffleConfig,
                 configure=lambda p: PaddedShuffleConfig(num_shards=dag_shards(p, n), rule=rule,
                                                         max_seq_length=p.max_seq_length,
                                                         max_predictions_per_seq=p.max_predictions_per_seq),
                 key_params=key_params, plan=_plan_padded, finish=_finish_padded, outputs={output: ""},
                 when=lambda p: any(t in tuple(getattr(p, "targets", ()) or ()) for t in targets))


#: NVIDIA's v3.x training sets (hdf5_<N>_shards_varlength_shuffled: the shards at the top of the stage folder).
#: Both shuffle the rows of the chop's shards straight from the padded parts (the same bytes as the chop's shards
#: shuffled, without writing and reading those): ``nvidia-4320`` v3.1's 4,320 shards (``nvidia-varlength`` builds
#: them, and v3.1's 4,320 list checks them), ``nvidia-2048`` v1.1's 2,048 (``nvidia-2048-varlength`` builds them,
#: the folder v1.1's 2,048 list checks).
DAG_STAGES = (_padded_stage("nvidia_4320_shuffled", 4320, "v3.1", ("nvidia-4320",), "nvidia_4320_shuffled_dir"),
              _padded_stage("nvidia_2048_shuffled", 2048, "v1.1", ("nvidia-2048",), "nvidia_2048_shuffled_dir"))
