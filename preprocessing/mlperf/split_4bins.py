"""Stage 10: split padded HDF5 into 4 sequence-length bins x N shards (Samsung, spec §11).

Reference: Samsung MLPerf v1.1 ``cleanup_scripts/run_split_and_chop_hdf5_files.py``. A row's length
is ``sum(input_mask)``; bins (inclusive) [1,128] -> ``128/``, [129,256] -> ``256/``, [257,384] ->
``384/``, [385,512] -> ``512/``. Per bin with n rows: ``nominal = ceil(n / N)``, ``excess = N *
nominal - n``; the first ``excess`` shards hold ``nominal - 1`` rows, the others ``nominal``; rows go
to shards in input order (files in the given order, rows in order; no RNG). Files are
``<out>/<bin>/part_<k>_of_<N>.hdf5`` (not zero-padded), all 4N of them, each holding the six
MLPerf datasets created one after the other with their data (as ``create_dataset(data=...)``), which
gives the reference's bytes (h5py 3.14 / HDF5 1.14.6).

Where a row goes follows from counts alone, so the split runs in parallel and copies nothing twice:

1. :func:`count_bins`, one call per input file (in parallel): rows per bin in each chunk of
   ``chunk_rows`` rows (and every row's length checked);
2. :func:`layout` turns the counts into shard sizes (the rule above) and cuts the N shard indices into
   groups (:func:`group_count`: many shards per call, so 8,192 small files do not mean 8,192 calls, and at least
   8 where that leaves a group for each worker, so a group's md5s run side by side);
3. :func:`write_shard_group`, one call per group (in parallel): shards k0..k1-1 of all four bins, read
   from their own row ranges of the inputs (the input span the counts point to) and written dataset by
   dataset, straight into place. No scratch copy; any number of workers gives the same bytes;
4. :func:`finish_split` writes the stage manifest from the groups' file entries.

:func:`run_split_4bins` does all four in one call (``workers`` processes from :mod:`core.pools`); the
data DAG runs steps 1 and 3 as pieces of the ``bins`` stage on its executor (local pool or Dask).

Differences, where the reference crashes or needs memory proportional to a shard:
* a bin with 0 < n < N rows (reference: IndexError) keeps the same formula: its first N - n shards
  get 0 rows, the last n shards 1 row each. A 0-row shard, like every shard of an empty bin (which the
  reference leaves as empty files), has the six datasets with zero rows (same dtypes and widths as a
  full shard), so every MLPerf loader reads it as length 0. Counter ``empty_shards``.
* a row whose length is 0 or above 512 (reference: IndexError) is refused, naming file and row.
* memory is bounded by ``chunk_rows`` input rows, plus 8 bytes (a row index) per row of the input span of
  :data:`OPEN_SHARDS` shards per bin, plus shards of up to :data:`IN_MEMORY_BYTES` built in memory (the
  reference buffers whole shards in float64).

Layout: a trainer's data folder holds only the four int-named bin folders (Samsung's trainer sorts its
entries by ``int(name)``), so the manifest lives outside it. The DAG's stage writes
``work/bins/<key>/data/<bin>/part_<k>_of_<N>.hdf5`` (:data:`DAG_DATA_DIR`; ``train_dir`` in last_run.json
is ``.../data``) with ``_manifest.json`` in ``work/bins/<key>/``; the standalone command writes the
reference's ``<out>/<bin>/...`` and its manifest beside the folder (``manifest_name``: ``<out>.manifest.json``).

    bertpipe split-4bins --input_dir hdf5/ --output_dir 4bins/ --n_output_shards 2048 --workers 4
"""

from __future__ import annotations

import logging
import math
import os
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import InputError, RecordError
from core.manifest import (
    FAULT_ENV,
    MANIFEST_NAME,
    Manifest,
    StageOutput,
    begin_redo,
    check_inside,
    fault_point,
    fsync_dir,
    late_fsyncs,
    load_manifest,
    md5_then_fsync,
    verify_manifest,
)
from core.pools import default_workers, run_all
from core.schema import BIN_BOUNDS, HDF5_DATASETS, row_shape
from core.stage import Stage
from preprocessing.hdf5_io import (
    chunks,
    h5_close_for_good,
    h5_open_new,
    open_padded,
    reading,
    sequence_lengths,
    stage_params,
    verify_inputs,
)
from preprocessing.packing import padded_maps
from preprocessing.targets import chosen as chosen_targets

log = logging.getLogger(__name__)

STAGE_VERSION = "2"  # 2: a 0-row shard holds the six datasets with zero rows (was: a file without datasets)

#: Rows one shard-group call aims at (~120 MB of padded rows): fewer calls than shards on small data.
ROWS_PER_GROUP = 32768
#: Shards a group call writes at least, where the shards leave a group for each worker: a group's files are hashed
#: side by side in one md5_files call, and a shard's four files differ in size (the 512 bin holds about 2/3 of the
#: bytes), so one shard a group left its largest file to hash alone on one lane (~0.45 GB/s against ~2.5 GB/s with
#: 8 of them side by side, the rest filling the other lanes).
GROUP_SHARDS_MIN = 8
#: Shards per bin a group call keeps open at once (4 x this many output files).
OPEN_SHARDS = 32
#: Input files a group call keeps open at once.
OPEN_INPUTS = 64
#: A shard up to this size is built in memory and written when closed (at most OPEN_SHARDS x 4 at once).
IN_MEMORY_BYTES = 1 << 20
_ROW_BYTES = 512 * (4 + 1 + 1) + 76 * (4 + 4) + 1  # one padded row of the six datasets
_NBINS = len(BIN_BOUNDS)
#: Where the DAG's bins stage puts the bin folders inside its stage directory (last_run.json's train_dir).
DAG_DATA_DIR = "data"


@dataclass(frozen=True, kw_only=True)
class Split4BinsConfig:
    """Parameters of the 4-bin split."""

    n_output_shards: int = 2048  # shards per bin (reference default; golden/4bins uses 8)
    chunk_rows: int = 4096  # input rows read at once (~15 MB) and counted per entry of the count table
    max_predictions_per_seq: int = 76  # width of masked_lm_* (the reference hard-codes 76)


def shard_sizes(n_rows: int, n_shards: int) -> list[int]:
    """Rows per shard of a bin: the reference's nominal/excess rule (first ``excess`` shards one fewer)."""
    nominal = -(-n_rows // n_shards)
    excess = n_shards * nominal - n_rows
    return [nominal - 1] * excess + [nominal] * (n_shards - excess)


def bin_of(lengths: np.ndarray) -> np.ndarray:
    """Bin index 0..3 of each sequence length (1..512)."""
    return np.searchsorted(np.asarray(BIN_BOUNDS), lengths, side="left")


def shard_name(bin_upper: int, k: int, n: int) -> str:
    return f"{bin_upper}/part_{k}_of_{n}.hdf5"


def _bins_of_chunk(mask: np.ndarray, path: Path | str, first_row: int) -> np.ndarray:
    lengths = sequence_lengths(mask)
    bad = np.flatnonzero((lengths < 1) | (lengths > BIN_BOUNDS[-1]))
    if bad.size:
        raise RecordError(f"{path}: row {first_row + int(bad[0])} has sequence length {int(lengths[bad[0]])} "
                          f"(sum of input_mask); expected 1..{BIN_BOUNDS[-1]}")
    return bin_of(lengths).astype(np.uint8)


# -- step 1: count ------------------------------------------------------------------------------------
def count_bins(path: Path | str, cfg: Split4BinsConfig = Split4BinsConfig()) -> dict[str, Any]:
    """Rows per bin in each chunk of ``cfg.chunk_rows`` rows of one input file (JSON types).

    Raises:
        InputError: the file is missing or not a padded MLPerf HDF5.
        RecordError: a row's length is outside 1..512, or the file is damaged (named, with the row).
    """
    per_chunk = []
    with open_padded(Path(path), max_predictions_per_seq=cfg.max_predictions_per_seq) as f:
        mask = f["input_mask"]
        n = int(mask.shape[0])
        for a, b in chunks(n, cfg.chunk_rows):
            with reading(Path(path), f"input_mask rows {a}..{b - 1}"):
                rows = mask[a:b]
            per_chunk.append(np.bincount(_bins_of_chunk(rows, path, a), minlength=_NBINS).tolist())
    return {"kind": "counts", "file": str(path), "rows": n, "chunk_rows": cfg.chunk_rows, "chunks": per_chunk}


# -- step 2: where every shard's rows are ---------------------------------------------------------------
@dataclass(frozen=True)
class ShardGroup:
    """Shards ``k0..k1-1`` of every bin, and the input chunks that hold their rows (small, picklable).

    ``starts[b][j]``: index, among bin b's rows in input order, of the first row of shard ``k0 + j``
    (``j`` = 0..k1-k0). ``chunks``: ``(file, first row, stop row, rows of each bin before this chunk)``
    for every input chunk the group reads, in input order.
    """

    n_shards: int
    k0: int
    k1: int
    starts: tuple[tuple[int, ...], ...]
    chunks: tuple[tuple[str, int, int, tuple[int, ...], tuple[int, ...]], ...]

    @property
    def label(self) -> str:
        return f"shards {self.k0}..{self.k1 - 1}"


class Layout:
    """The counts of every input file, in input order, as shard sizes and row positions."""

    def __init__(self, counts: Sequence[dict[str, Any]], n_shards: int) -> None:
        self.n = n_shards
        self.table: list[tuple[str, int, int]] = []  # (file, a, b) of every chunk, in input order
        per_chunk = []
        for c in counts:
            for i, bins in enumerate(c["chunks"]):
                a = i * c["chunk_rows"]
                self.table.append((c["file"], a, min(a + c["chunk_rows"], c["rows"])))
                per_chunk.append(bins)
        arr = np.asarray(per_chunk, dtype=np.int64).reshape(-1, _NBINS)
        self.cum = np.vstack([np.zeros((1, _NBINS), np.int64), np.cumsum(arr, axis=0)])  # rows of bin b before chunk i
        self.totals = [int(t) for t in self.cum[-1]]
        self.sizes = [shard_sizes(t, n_shards) for t in self.totals]
        self.starts = [np.concatenate([[0], np.cumsum(s, dtype=np.int64)]) for s in self.sizes]

    @property
    def rows(self) -> int:
        return sum(self.totals)

    def group(self, k0: int, k1: int) -> ShardGroup:
        """The group of shards ``k0..k1-1``: their row positions and the chunks that hold them."""
        first, last = len(self.table), -1
        for b in range(_NBINS):
            s, e = int(self.starts[b][k0]), int(self.starts[b][k1])
            if e > s:
                first = min(first, int(np.searchsorted(self.cum[:, b], s, side="right")) - 1)
                last = max(last, int(np.searchsorted(self.cum[:, b], e - 1, side="right")) - 1)
        span = range(first, last + 1)
        return ShardGroup(n_shards=self.n, k0=k0, k1=k1,
                          starts=tuple(tuple(int(x) for x in self.starts[b][k0:k1 + 1]) for b in range(_NBINS)),
                          chunks=tuple((*self.table[i], tuple(int(x) for x in self.cum[i]),
                                        tuple(int(x) for x in self.cum[i + 1] - self.cum[i])) for i in span))

    def groups(self, n_groups: int) -> list[ShardGroup]:
        """The N shard indices cut into ``n_groups`` contiguous groups of (nearly) equal size."""
        n_groups = max(1, min(n_groups, self.n))
        bounds = [self.n * g // n_groups for g in range(n_groups + 1)]
        return [self.group(a, b) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def layout(counts: Sequence[dict[str, Any]], n_shards: int) -> Layout:
    return Layout(counts, n_shards)


def group_count(rows: int, n_shards: int, workers: int) -> int:
    """How many shard-group calls: about :data:`ROWS_PER_GROUP` rows each, at least 4 per worker, but no group of
    fewer than :data:`GROUP_SHARDS_MIN` shards where that leaves one for each worker; as many for each worker (a
    multiple of ``workers``). At full size (2,048 shards of ~76,000 rows) that is 256 groups of 8 shards."""
    w = max(1, workers)
    n = max(math.ceil(rows / ROWS_PER_GROUP), 4 * w)
    n = min(n, max(w, -(-n_shards // GROUP_SHARDS_MIN)))
    n = -(-n // w) * w
    return max(1, min(n_shards, n))


# -- step 3: write a group of shards ------------------------------------------------------------------
class _Faults:
    """BERTPIPE_FAULT points of a shard-group call (``start``, ``rename``, ``file``; see core.manifest)."""

    def __init__(self, out_dir: Path) -> None:
        self.spec = os.environ.get(FAULT_ENV)
        self.names = {"split_4bins", *out_dir.parts}
        self.seen: dict[str, int] = {}

    def __call__(self, point: str) -> None:
        if self.spec:
            self.seen[point] = n = self.seen.get(point, 0) + 1
            fault_point(self.spec, point, n, self.names)


def write_shard_group(group: ShardGroup, out_dir: Path | str, cfg: Split4BinsConfig = Split4BinsConfig(),
                      ) -> dict[str, Any]:
    """Write shards ``group.k0..k1-1`` of every bin into ``out_dir`` (atomically, each file renamed into
    place when complete); returns their entries ``[name, bytes, md5]`` and how many are empty."""
    out_dir, faults = Path(out_dir), _Faults(Path(out_dir))
    faults("start")
    entries: list[list[Any]] = []
    empty = 0
    inputs = _Inputs(cfg)
    try:
        for j0 in range(0, group.k1 - group.k0, OPEN_SHARDS):  # a bounded number of open output files
            j1 = min(j0 + OPEN_SHARDS, group.k1 - group.k0)
            e, z = _write_subgroup(_subgroup(group, j0, j1), out_dir, cfg, faults, inputs)
            entries += e
            empty += z
    finally:
        inputs.close()
    return {"kind": "shards", "k0": group.k0, "k1": group.k1, "entries": entries, "empty": empty}


class _Inputs:
    """The input files of a group call, each opened and checked once (at most :data:`OPEN_INPUTS` at a time)."""

    def __init__(self, cfg: Split4BinsConfig) -> None:
        from collections import OrderedDict

        self.cfg = cfg
        self.files: OrderedDict[str, Any] = OrderedDict()
        self.datasets: dict[tuple[str, str], Any] = {}
        #: per open file: its datasets as memory maps (contiguous, unfiltered: as tfrecord-to-hdf5 writes them),
        #: read in place (rows gathered straight from the page cache); None: read through h5py
        self.maps: dict[str, dict[str, np.ndarray] | None] = {}

    def dataset(self, path: str, name: str) -> Any:
        f = self.files.pop(path, None)
        if f is None:
            if len(self.files) >= OPEN_INPUTS:
                old, g = self.files.popitem(last=False)
                self.datasets = {k: v for k, v in self.datasets.items() if k[0] != old}
                self.maps.pop(old, None)
                g.close()
            f = open_padded(Path(path), max_predictions_per_seq=self.cfg.max_predictions_per_seq)
            with reading(Path(path), "its datasets' places in the file"):
                self.maps[path] = padded_maps(f, Path(path), [n for n, _, _ in HDF5_DATASETS])
        self.files[path] = f  # the most recently used last
        ds = self.datasets.get((path, name))
        if ds is None:
            with reading(Path(path), f"dataset {name}"):
                ds = self.datasets[path, name] = f[name]
        return ds

    def read(self, path: str, name: str, a: int, b: int) -> np.ndarray:
        with reading(Path(path), f"{name} rows {a}..{b - 1}"):
            ds = self.dataset(path, name)
            maps = self.maps.get(path)
            return _rows_map(maps[name], a, b) if maps is not None else ds[a:b]

    def close(self) -> None:
        self.datasets.clear()
        self.maps.clear()
        while self.files:
            self.files.popitem()[1].close()


def _rows_map(m: np.memmap, a: int, b: int) -> np.ndarray:
    """Rows ``a..b-1`` of the dataset map ``m`` as a map of their own, unmapped once dropped: a slice of ``m``
    would keep every page the group read mapped (and counted in its RSS) until the file closes; a group of 8
    shards at full size reads ~1.3 GB of parts."""
    if b <= a:
        return m[a:b]
    return np.memmap(m.filename, dtype=m.dtype, mode="r", offset=m.offset + a * m.strides[0],
                     shape=(b - a, *m.shape[1:]))


def _subgroup(g: ShardGroup, j0: int, j1: int) -> ShardGroup:
    """Shards ``k0+j0 .. k0+j1-1`` of ``g``, with only the chunks that hold their rows."""
    starts = tuple(s[j0:j1 + 1] for s in g.starts)
    keep = tuple(c for c in g.chunks if any(c[4][b] and c[3][b] < starts[b][-1] and c[3][b] + c[4][b] > starts[b][0]
                                             for b in range(_NBINS)))
    return ShardGroup(n_shards=g.n_shards, k0=g.k0 + j0, k1=g.k0 + j1, starts=starts, chunks=keep)


def _routes(bins: np.ndarray, base: tuple[int, ...], starts: tuple[tuple[int, ...], ...],
            ) -> list[tuple[int, int, np.ndarray, int, int]]:
    """Where the rows of one chunk go: ``(bin, j, chunk-local row indices, first out row, stop out row)``."""
    out = []
    for b in range(_NBINS):
        st = starts[b]
        idx = np.flatnonzero(bins == b)
        if not idx.size:
            continue
        r0, r1 = base[b], base[b] + idx.size  # this chunk's rows of bin b, as positions among bin b's rows
        lo, hi = max(r0, st[0]), min(r1, st[-1])
        if hi <= lo:
            continue
        j = int(np.searchsorted(st, lo, side="right")) - 1
        while lo < hi:
            stop = min(hi, st[j + 1])
            if stop > lo:
                out.append((b, j, idx[lo - r0:stop - r0], lo - st[j], stop - st[j]))
            lo, j = stop, j + 1
    return out


def _write_subgroup(g: ShardGroup, out_dir: Path, cfg: Split4BinsConfig, faults: _Faults, inputs: _Inputs,
                    ) -> tuple[list[list[Any]], int]:
    n_j = g.k1 - g.k0
    sizes = [[g.starts[b][j + 1] - g.starts[b][j] for j in range(n_j)] for b in range(_NBINS)]
    # which rows of each chunk go where (what is kept: the routes, at most a few bytes per row of the span)
    plan: list[tuple[str, int, int, list[tuple[int, int, np.ndarray, int, int]], dict[str, np.ndarray]]] = []
    for path, a, b, base, _ in g.chunks:
        routes = _routes(_bins_of_chunk(inputs.read(path, "input_mask", a, b), path, a), base, g.starts)
        if routes:
            lo = min(int(r[2][0]) for r in routes)
            plan.append((path, a + lo, a + max(int(r[2][-1]) for r in routes) + 1,
                         [(bi, j, idx - lo, o0, o1) for bi, j, idx, o0, o1 in routes], {}))
    if sum(hi - lo for _, lo, hi, _, _ in plan) <= cfg.chunk_rows:  # small: read every dataset once, here
        for path, lo, hi, _, data in plan:
            for name, _, _ in HDF5_DATASETS:
                data[name] = inputs.read(path, name, lo, hi)
    names = [[shard_name(BIN_BOUNDS[b], g.k0 + j, g.n_shards) for j in range(n_j)] for b in range(_NBINS)]
    finals = [[out_dir / nm for nm in row] for row in names]
    entries: list[list[Any]] = []
    shards = _OpenShards(finals, [[n * _ROW_BYTES <= IN_MEMORY_BYTES for n in row] for row in sizes])
    with shards as files:
        for name, dtype, kind in HDF5_DATASETS:  # dataset by dataset: each complete before the next exists
            width = row_shape(kind, 512, cfg.max_predictions_per_seq)
            out = [[files[b][j].create_dataset(name, (sizes[b][j], *width), dtype=dtype).id for j in range(n_j)]
                   for b in range(_NBINS)]
            _copy_dataset(plan, name, dtype, out, inputs)
        del out  # the datasets' ids (the close below closes them anyway, and any other reference to them)
        with late_fsyncs():  # each file's writeback starts as it closes; the fsyncs wait below, once
            for b in range(_NBINS):
                for j in range(n_j):
                    # closed for good (every id of it, even one a profiler's frame still holds) before the rename
                    # and the md5 (issue 21)
                    h5_close_for_good(files[b][j])
                    faults("rename")
                    os.replace(shards.tmp[b][j], finals[b][j])
                    faults("file")
    # HDF5 rewrites its superblock when a file closes, so a shard's md5 is taken once it is complete: all of the
    # sub-group's files at once, side by side on this core, while the disk writes them back; then their fsyncs,
    # side by side (the file system commits them together), and the renames': on disk before the flow writes the
    # manifest that lists them
    done = [p for row in finals for p in row]
    for name, p, md5 in zip([nm for row in names for nm in row], done, md5_then_fsync(done), strict=True):
        entries.append([name, p.stat().st_size, md5])
    for row in finals:
        if row:
            fsync_dir(row[0].parent)
    return entries, sum(s == 0 for row in sizes for s in row)


def _copy_dataset(plan: list[tuple[str, int, int, list[tuple[int, int, np.ndarray, int, int]], dict[str, np.ndarray]]],
                  name: str, dtype: str, out: list[list[Any]], inputs: _Inputs) -> None:
    """Copy dataset ``name`` of every routed row into its shard (``out``: low-level dataset ids)."""
    for path, lo, hi, routes, data in plan:
        rows = data[name] if name in data else inputs.read(path, name, lo, hi)
        if rows.dtype != np.dtype(dtype):
            rows = rows.astype(dtype)
        for b, j, sel, o0, _ in routes:
            _write_rows(out[b][j], o0, rows[sel[0]:sel[-1] + 1] if sel[-1] - sel[0] + 1 == sel.size else rows[sel])


def _write_rows(dsid: Any, first: int, rows: np.ndarray) -> None:
    """``ds[first:first + len(rows)] = rows`` through h5py's low-level API (the same HDF5 write, without the
    high-level bookkeeping that costs more than the copy for a shard's few rows)."""
    from h5py import h5s

    rows = np.ascontiguousarray(rows)
    fspace = dsid.get_space()
    fspace.select_hyperslab((first,) + (0,) * (rows.ndim - 1), rows.shape)
    dsid.write(h5s.create_simple(rows.shape), fspace, rows)


class _OpenShards:
    """The output files of a sub-group, open under temporary names; removed unless renamed."""

    def __init__(self, finals: list[list[Path]], in_memory: list[list[bool]]) -> None:
        self.finals, self.in_memory = finals, in_memory
        self.tmp: list[list[Path]] = []
        self.files: list[list[Any]] = []

    def __enter__(self) -> list[list[Any]]:
        for row in self.finals:
            if row:
                row[0].parent.mkdir(parents=True, exist_ok=True)
            self.tmp.append([p.with_name(f".{p.name}.tmp-{os.getpid()}") for p in row])
            self.files.append([])
        try:
            for b, row in enumerate(self.tmp):
                for p, mem in zip(row, self.in_memory[b], strict=True):
                    # a small shard is built in memory and written at close (HDF5's core driver: the same
                    # bytes, fewer system calls); a large one goes straight to disk
                    self.files[b].append(h5_open_new(p, in_memory=mem))
        except BaseException as exc:
            self.__exit__(type(exc), exc, None)
            raise
        return self.files

    def __exit__(self, exc_type, exc, tb) -> None:
        from core.manifest import raise_if_disk_full

        if exc_type is None:
            return
        for row in self.files:
            for f in row:
                try:
                    if f.id.valid:
                        h5_close_for_good(f, fsync=False)
                except Exception:  # noqa: BLE001,S110 - closing after a failure: the file is removed anyway
                    pass
        for row in self.tmp:
            for p in row:
                p.unlink(missing_ok=True)
        if exc is not None:
            raise_if_disk_full(exc, self.finals[0][0])


# -- step 4: the manifest -----------------------------------------------------------------------------
def begin_pieces(out_dir: Path | str) -> None:
    """Before shard groups write into ``out_dir``: no manifest (the stage is being redone), no debris, and no
    link or folder where an old output (or one of its folders) was (core.manifest.begin_redo)."""
    begin_redo(out_dir)


def finish_split(out_dir: Path | str, counts: Sequence[dict[str, Any]], written: Sequence[dict[str, Any]],
                 cfg: Split4BinsConfig, upstream: Sequence[Manifest] = (), *, data_dir: str = "",
                 manifest_name: str = MANIFEST_NAME) -> Manifest:
    """The stage manifest from the groups' entries (files hashed while written); counters rows, rows_<bin>,
    empty_shards. ``data_dir``: the groups wrote into ``out_dir/data_dir``; ``manifest_name``: relative to
    ``out_dir``."""
    totals = Layout(counts, cfg.n_output_shards).totals
    n = cfg.n_output_shards
    got = {e[0] for w in written for e in w["entries"]}
    missing = [shard_name(b, k, n) for b in BIN_BOUNDS for k in range(n) if shard_name(b, k, n) not in got]
    if missing:  # pragma: no cover - the groups cover 0..N-1 by construction
        raise InputError(f"split-4bins: {len(missing)} shard(s) were not written (e.g. {missing[0]}); run again")
    prefix = f"{data_dir}/" if data_dir else ""
    with StageOutput(out_dir, "split_4bins", params=stage_params(cfg), upstream=upstream,
                     code_version=STAGE_VERSION, manifest_name=manifest_name) as out:
        for w in sorted(written, key=lambda w: w["k0"]):
            for name, _size, md5 in w["entries"]:
                out.add_file(prefix + name, md5)
        out.count("rows", sum(totals))
        for b, c in zip(BIN_BOUNDS, totals, strict=True):
            out.count(f"rows_{b}", c)
        out.count("empty_shards", sum(w["empty"] for w in written))
    return out.manifest


# -- all four steps in one call ---------------------------------------------------------------------
def _check_out_dir(out_dir: Path, expected: set[str]) -> None:
    """Refuse an output folder holding anything but this stage's own files."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise InputError(f"output {out_dir} exists and is not a directory")
    foreign = [p.relative_to(out_dir).as_posix() for p in sorted(out_dir.rglob("*"))
               if p.is_file() and ".tmp-" not in p.name
               and p.relative_to(out_dir).as_posix() not in expected | {MANIFEST_NAME}]
    if foreign:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise InputError(f"output folder {out_dir} already holds files that split-4bins would not write "
                         f"({', '.join(foreign[:3])}{more}); choose an empty or new folder")


def _warn_small_bins(totals: Sequence[int], n: int) -> None:
    for b, c in zip(BIN_BOUNDS, totals, strict=True):
        if c < n:  # the reference crashes (0 < c < n) or leaves empty files (c == 0) here
            log.warning("bin %d has %d rows for %d shards: %d shard(s) will hold zero rows", b, c, n, n - c)


def run_split_4bins(input_files: Sequence[Path], out_dir: Path, cfg: Split4BinsConfig = Split4BinsConfig(),
                    upstream: Sequence[Manifest] = (), *, workers: int = 1, data_dir: str = "",
                    manifest_name: str = MANIFEST_NAME) -> Manifest:
    """Stage function: ``out_dir/[data_dir/]{128,256,384,512}/part_<k>_of_<N>.hdf5``, the manifest at
    ``out_dir/manifest_name`` (relative to ``out_dir``); counters rows, rows_<bin>, empty_shards.

    ``workers`` processes count the inputs and then write groups of shards; the bytes do not depend on it.
    """
    files = [Path(p) for p in input_files]
    if not files:
        raise InputError("split-4bins got no input files (the reference reads <input_dir>/part*)")
    if cfg.n_output_shards < 1:
        raise InputError(f"n_output_shards must be at least 1, got {cfg.n_output_shards}")
    n = cfg.n_output_shards
    out_dir = Path(out_dir)
    prefix = f"{data_dir}/" if data_dir else ""
    _check_out_dir(out_dir, {prefix + shard_name(b, k, n) for b in BIN_BOUNDS for k in range(n)})
    verify_inputs(files, upstream, workers=workers)
    counts = run_all(count_bins, [(str(p), cfg) for p in files], workers)
    lay = Layout(counts, n)
    log.info("rows per bin %s: %s", "/".join(map(str, BIN_BOUNDS)), lay.totals)
    _warn_small_bins(lay.totals, n)
    groups = lay.groups(group_count(lay.rows, n, workers))
    begin_pieces(out_dir)
    (out_dir / manifest_name).unlink(missing_ok=True)  # a manifest kept outside out_dir: redone too
    written = run_all(write_shard_group, [(g, str(out_dir / data_dir), cfg) for g in groups], workers)
    return finish_split(out_dir, counts, written, cfg, upstream, data_dir=data_dir, manifest_name=manifest_name)


# -- the DAG's declaration of this stage (core/stage.py) -----------------------------------------------
def count_piece(paths: Sequence[str], hdf5_dirs: Sequence[str], out_dir: Path, cfg: Split4BinsConfig,
                ) -> dict[str, Any]:
    """DAG piece: check a few parts' HDF5 against their manifests (md5 re-hashed only if a stat changed), count
    them."""
    for d in hdf5_dirs:
        verify_manifest(d, trust_stat=True)
    return {"kind": "count-list", "counts": [count_bins(p, cfg) for p in paths]}


def parts_per_count(n_parts: int, workers: int) -> int:
    """Parts one count piece reads: a few dozen at most (a count is milliseconds for a small part, and each
    call costs a little), and about 8 pieces per worker."""
    return max(1, min(32, math.ceil(n_parts / (8 * max(1, workers)))))


def group_piece(group: ShardGroup, out_dir: Path, cfg: Split4BinsConfig) -> dict[str, Any]:
    """DAG piece: one group of shards, under the stage directory's ``data/`` (what trainers read)."""
    check_inside(Path(out_dir) / DAG_DATA_DIR, out_dir)  # a link there would lead the writes out of the stage
    return write_shard_group(group, Path(out_dir) / DAG_DATA_DIR, cfg)


def _plan_bins(plan: Any) -> list[Any]:
    """Pieces: count every part's HDF5, in part order (the reference's input order decides the shards)."""
    return count_pieces(plan, count_piece)


def count_pieces(plan: Any, run: Any) -> list[Any]:
    """The counting pieces of a stage that first counts the rows of the hdf5 stage's parts (bins, nvidia chop):
    groups of consecutive parts, one ``run(paths, hdf5_dirs, out_dir, cfg)`` call each, in part order."""
    h5 = plan.result("hdf5")
    shards = h5.shards
    step = parts_per_count(len(shards), plan.params.workers or default_workers())
    return [replace(plan.unit([str(h5.path(s + ".hdf5", s)) for s in part], [str(h5.unit_dir(s)) for s in part],
                              cfg=plan.cfg, shard=f"count/{part[0]}", upstream=[h5.unit_dir(s) for s in part]),
                    run=run, piece=True, pass_upstream=False, out_dir=str(plan.dir))
            for part in (shards[i:i + step] for i in range(0, len(shards), step))]


def _finish_bins(plan: Any, values: list[dict[str, Any]]) -> Manifest | list[Any]:
    """After the counts: the shard groups; after the groups: the stage manifest."""
    counts = [c for v in values if v["kind"] == "count-list" for c in v["counts"]]
    written = [v for v in values if v["kind"] == "shards"]
    n = plan.cfg.n_output_shards
    if not written:
        lay = Layout(counts, n)
        log.info("rows per bin %s: %s", "/".join(map(str, BIN_BOUNDS)), lay.totals)
        _warn_small_bins(lay.totals, n)
        begin_pieces(plan.dir)
        groups = lay.groups(group_count(lay.rows, n, plan.params.workers or default_workers()))
        return [replace(plan.unit(g, cfg=plan.cfg, shard=f"shards/{g.k0:05d}", upstream=[]), run=group_piece,
                    piece=True, pass_upstream=False, out_dir=str(plan.dir)) for g in groups]
    h5 = plan.result("hdf5")
    upstream = [load_manifest(h5.unit_dir(s)) for s in h5.shards]
    return finish_split(plan.dir, counts, written, plan.cfg, [m for m in upstream if m is not None],
                        data_dir=DAG_DATA_DIR)


DAG_STAGES = (Stage(name="bins", title="split_4bins: 4 length bins x N shards, what trainers read",
                    reads=("hdf5",), run=run_split_4bins, version=STAGE_VERSION, config=Split4BinsConfig,
                    configure=lambda p: Split4BinsConfig(n_output_shards=p.resolved_shards(),
                                                         max_predictions_per_seq=p.max_predictions_per_seq),
                    key_params=stage_params, plan=_plan_bins, finish=_finish_bins, outputs={"train_dir": DAG_DATA_DIR},
                    when=lambda p: "samsung-4bins" in chosen_targets(p), aliases=("split_4bins", "4bins")),)
