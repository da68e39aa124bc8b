"""Stage 10: split padded HDF5 into 4 sequence-length bins x N shards (Samsung, spec §11).

Reference: Samsung MLPerf v1.1 ``cleanup_scripts/run_split_and_chop_hdf5_files.py``. A row's length
is ``sum(input_mask)``; bins (inclusive) [1,128] -> ``128/``, [129,256] -> ``256/``, [257,384] ->
``384/``, [385,512] -> ``512/``. Per bin with n rows: ``nominal = ceil(n / N)``, ``excess = N *
nominal - n``; the first ``excess`` shards hold ``nominal - 1`` rows, the others ``nominal``; rows go
to shards in input order (files in the given order, rows in order; no RNG). Files are
``<out>/<bin>/part_<k>_of_<N>.hdf5`` (not zero-padded), all 4N of them, each holding the six
MLPerf datasets created one after the other with their data (as ``create_dataset(data=...)``), which
gives the reference's bytes (h5py 3.14 / HDF5 1.14.6).

Differences, where the reference crashes or needs memory proportional to a shard:
* a bin with 0 < n < N rows (reference: IndexError) keeps the same formula: its first N - n shards
  get 0 rows, the last n shards 1 row each. A 0-row shard, like every shard of an empty bin (which the
  reference leaves as empty files), is an HDF5 file without datasets. Counter ``empty_shards``.
* a row whose length is 0 or above 512 (reference: IndexError) is refused, naming file and row.
* memory is bounded by ``chunk_rows`` input rows (the reference buffers whole shards in float64):
  rows are appended to per-bin scratch files and each shard is written from there when complete.

Layout: a trainer's data folder holds only the four int-named bin folders (Samsung's trainer sorts its
entries by ``int(name)``), so the manifest lives outside it. The DAG's stage writes
``work/bins/<key>/data/<bin>/part_<k>_of_<N>.hdf5`` (``data_dir="data"``; ``train_dir`` in last_run.json
is ``.../data``) with ``_manifest.json`` in ``work/bins/<key>/``; the standalone command writes the
reference's ``<out>/<bin>/...`` and its manifest beside the folder (``manifest_name``, ``<out>.manifest.json``).

    bertpipe split-4bins --input_dir hdf5/ --output_dir 4bins/ --n_output_shards 2048
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import InputError, RecordError
from core.manifest import DROPPED_NAME, MANIFEST_NAME, STAT_NAME, Manifest, StageOutput
from core.progress import progress
from core.schema import BIN_BOUNDS, HDF5_DATASETS
from core.stage import Stage
from preprocessing.hdf5_io import (
    chunks,
    open_padded,
    reading,
    sequence_lengths,
    stage_file,
    stage_params,
    verify_inputs,
)

log = logging.getLogger(__name__)

STAGE_VERSION = "2"  # 2: the DAG's shards moved under data/ (the manifest outside what trainers read)

#: Where the DAG's bins stage puts the bin folders inside its stage directory (last_run.json's train_dir).
DAG_DATA_DIR = "data"


@dataclass(frozen=True, kw_only=True)
class Split4BinsConfig:
    """Parameters of the 4-bin split."""

    n_output_shards: int = 2048  # shards per bin (reference default; golden/4bins uses 8)
    chunk_rows: int = 4096  # input rows read at once (~15 MB) and rows copied per write
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


def _bins_of_chunk(mask: np.ndarray, path: Path, first_row: int) -> np.ndarray:
    lengths = sequence_lengths(mask)
    bad = np.flatnonzero((lengths < 1) | (lengths > BIN_BOUNDS[-1]))
    if bad.size:
        raise RecordError(f"{path}: row {first_row + int(bad[0])} has sequence length {int(lengths[bad[0]])} "
                          f"(sum of input_mask); expected 1..{BIN_BOUNDS[-1]}")
    return bin_of(lengths)


class _BinWriter:
    """Fills the shards of one bin in order; rows wait in scratch files until their shard is full."""

    def __init__(self, out: StageOutput, bin_upper: int, sizes: list[int], widths: dict[str, tuple[int, ...]],
                 chunk_rows: int) -> None:
        self.out, self.bin, self.sizes, self.widths, self.chunk = out, bin_upper, sizes, widths, chunk_rows
        self.k, self.filled, self.empty = 0, 0, 0
        self.scratch = {name: open(out.path(f".scratch-{bin_upper}-{name}.tmp-split"), "w+b")  # noqa: SIM115
                        for name, _, _ in HDF5_DATASETS}
        self._skip_empty()

    def append(self, rows: dict[str, np.ndarray]) -> None:
        n, at = len(rows["input_ids"]), 0
        while at < n:
            take = min(n - at, self.sizes[self.k] - self.filled)
            for name, dtype, _ in HDF5_DATASETS:
                self.scratch[name].write(np.ascontiguousarray(rows[name][at:at + take], dtype=dtype).data)
            at, self.filled = at + take, self.filled + take
            if self.filled == self.sizes[self.k]:
                self._write_shard()
                self._skip_empty()

    def _skip_empty(self) -> None:
        while self.k < len(self.sizes) and self.sizes[self.k] == 0:
            self._write_shard()

    def _write_shard(self) -> None:
        import h5py

        n = self.sizes[self.k]
        with stage_file(self.out, shard_name(self.bin, self.k, len(self.sizes))) as tmp, h5py.File(tmp, "w") as f:
            for name, dtype, _ in HDF5_DATASETS if n else ():
                src = self.scratch[name]
                src.seek(0)
                ds = f.create_dataset(name, (n, *self.widths[name]), dtype=dtype)
                for a, b in chunks(n, self.chunk):
                    width = int(np.prod(self.widths[name], dtype=np.int64))
                    ds[a:b] = np.fromfile(src, dtype=dtype, count=(b - a) * width).reshape(b - a, *self.widths[name])
                src.seek(0)
                src.truncate()
        self.empty += n == 0
        self.k, self.filled = self.k + 1, 0

    def close(self) -> None:
        for f in self.scratch.values():
            f.close()
            Path(f.name).unlink(missing_ok=True)


class _DataOutput(StageOutput):
    """A :class:`StageOutput` whose files go under ``data_dir/`` of its directory; the manifest (and the
    ``.verified.json`` / ``_dropped.json`` bookkeeping) stay at the top, outside the folder trainers read.
    Names given to :meth:`path` and :meth:`add_file` are relative to ``data_dir``."""

    def __init__(self, *args: Any, data_dir: str = "", **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prefix = f"{data_dir.strip('/')}/" if data_dir.strip("/") else ""

    def path(self, name: str) -> Path:
        return super().path(self.prefix + name)

    def add_file(self, name: str, md5: str | None = None):  # noqa: ANN201 - FileEntry
        return super().add_file(self.prefix + name, md5)


def _check_out_dir(out_dir: Path, expected: set[str]) -> None:
    """Refuse an output folder holding anything but this stage's own files."""
    if not out_dir.exists():
        return
    if not out_dir.is_dir():
        raise InputError(f"output {out_dir} exists and is not a directory")
    foreign = [p.relative_to(out_dir).as_posix() for p in sorted(out_dir.rglob("*"))
               if p.is_file() and ".tmp-" not in p.name
               and p.relative_to(out_dir).as_posix() not in expected | {MANIFEST_NAME, STAT_NAME, DROPPED_NAME}]
    if foreign:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        raise InputError(f"output folder {out_dir} already holds files that split-4bins would not write "
                         f"({', '.join(foreign[:3])}{more}); choose an empty or new folder")


def _count(files: Sequence[Path], cfg: Split4BinsConfig) -> list[int]:
    counts = np.zeros(len(BIN_BOUNDS), dtype=np.int64)
    for path in files:
        with open_padded(path, max_predictions_per_seq=cfg.max_predictions_per_seq) as f:
            mask = f["input_mask"]
            for a, b in chunks(mask.shape[0], cfg.chunk_rows):
                with reading(path, f"input_mask rows {a}..{b - 1}"):
                    rows = mask[a:b]
                counts += np.bincount(_bins_of_chunk(rows, path, a), minlength=len(BIN_BOUNDS))
    return counts.tolist()


def run_split_4bins(input_files: Sequence[Path], out_dir: Path, cfg: Split4BinsConfig = Split4BinsConfig(),
                    upstream: Sequence[Manifest] = (), *, data_dir: str = "",
                    manifest_name: str = MANIFEST_NAME) -> Manifest:
    """Stage function: ``out_dir/[data_dir/]{128,256,384,512}/part_<k>_of_<N>.hdf5``, the manifest at
    ``out_dir/manifest_name`` (a name relative to ``out_dir``); counters rows, rows_<bin>, empty_shards."""
    files = [Path(p) for p in input_files]
    if not files:
        raise InputError("split-4bins got no input files (the reference reads <input_dir>/part*)")
    if cfg.n_output_shards < 1:
        raise InputError(f"n_output_shards must be at least 1, got {cfg.n_output_shards}")
    n = cfg.n_output_shards
    prefix = f"{data_dir.strip('/')}/" if data_dir.strip("/") else ""
    _check_out_dir(Path(out_dir), {prefix + shard_name(b, k, n) for b in BIN_BOUNDS for k in range(n)})
    verify_inputs(files, upstream)
    counts = _count(files, cfg)  # pass 1
    log.info("rows per bin %s: %s", "/".join(map(str, BIN_BOUNDS)), counts)
    for b, c in zip(BIN_BOUNDS, counts, strict=True):
        if c < n:  # the reference crashes (0 < c < n) or leaves empty files (c == 0) here
            log.warning("bin %d has %d rows for %d shards: %d shard(s) will be empty HDF5 files (no datasets)",
                        b, c, n, n - c)
    widths = {name: {"seq": (512,), "pred": (cfg.max_predictions_per_seq,), "": ()}[kind]
              for name, _, kind in HDF5_DATASETS}
    with _DataOutput(out_dir, "split_4bins", params=stage_params(cfg), upstream=upstream,
                     code_version=STAGE_VERSION, data_dir=data_dir, manifest_name=manifest_name) as out:
        writers = [_BinWriter(out, b, shard_sizes(c, n), widths, cfg.chunk_rows) for b, c in zip(BIN_BOUNDS, counts,
                                                                                                   strict=True)]
        try:
            _route(files, writers, cfg, total=sum(counts))
        finally:
            for w in writers:
                w.close()
        incomplete = [w.bin for w in writers if w.k != len(w.sizes)]
        if incomplete:  # pass 1 counted the rows pass 2 routed: only a file changed meanwhile gets here
            raise InputError(f"bins {incomplete}: fewer rows than counted; did an input file change during the split?")
        out.count("rows", sum(counts))
        for b, c in zip(BIN_BOUNDS, counts, strict=True):
            out.count(f"rows_{b}", c)
        out.count("empty_shards", sum(w.empty for w in writers))
    return out.manifest


def _route(files: Sequence[Path], writers: list[_BinWriter], cfg: Split4BinsConfig, total: int) -> None:
    """Pass 2: rows to their bin's writer, in input order."""
    with progress(total=total, desc="split-4bins", unit="row") as bar:
        for path in files:
            with open_padded(path, max_predictions_per_seq=cfg.max_predictions_per_seq) as f:
                for a, b in chunks(f["input_mask"].shape[0], cfg.chunk_rows):
                    with reading(path, f"rows {a}..{b - 1}"):
                        data = {name: f[name][a:b] for name, _, _ in HDF5_DATASETS}
                    bins = _bins_of_chunk(data["input_mask"], path, a)
                    for i, w in enumerate(writers):
                        sel = bins == i
                        if sel.any():
                            w.append({name: v[sel] for name, v in data.items()})
                    bar.update(b - a)


# -- the DAG's declaration of this stage (core/stage.py) -----------------------------------------------
def _plan_bins(plan: Any) -> list[Any]:
    """Every part's HDF5, in part order (the reference's input order decides which shard a row lands in)."""
    h5 = plan.result("hdf5")
    files = [str(h5.path(s + ".hdf5", s)) for s in h5.shards]
    return [plan.unit(files, cfg=plan.cfg, data_dir=DAG_DATA_DIR, upstream=[h5.unit_dir(s) for s in h5.shards])]


DAG_STAGES = (Stage(name="bins", title="split_4bins: 4 length bins x N shards, what trainers read",
                    reads=("hdf5",), run=run_split_4bins, version=STAGE_VERSION, config=Split4BinsConfig,
                    configure=lambda p: Split4BinsConfig(n_output_shards=p.resolved_shards(),
                                                         max_predictions_per_seq=p.max_predictions_per_seq),
                    key_params=stage_params, plan=_plan_bins, outputs={"train_dir": DAG_DATA_DIR},
                    aliases=("split_4bins", "4bins")),)
