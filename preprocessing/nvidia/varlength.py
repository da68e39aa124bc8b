"""Padded MLPerf HDF5 -> the packed (unpadded, variable-length) HDF5 NVIDIA's MLPerf BERT reads.

Reference: NVIDIA MLPerf v1.1 ``convert_fixed2variable.py`` (also ``chop_hdf5_files_to_varlength.py``,
``pick_eval_samples_varlength.py``; spec §10). Per row::

    input_ids[i]           = input_ids[i, :sum(input_mask[i])]                      vlen int16
    segment_ids[i]         = segment_ids[i, :sum(input_mask[i])]                    vlen int8
    masked_lm_positions[i] = masked_lm_positions[i, :sum(masked_lm_positions[i] != 0)]  vlen int16
    masked_lm_ids[i]       = masked_lm_ids[i, :sum(masked_lm_positions[i] != 0)]        vlen int16
    next_sentence_labels[i]                                                         int8

no input_mask. The NVIDIA scripts sum an int8 row with Python's ``sum()``: under NumPy >= 2 that
sum stays int8 and wraps (512 -> 0), silently truncating sequences. Lengths here are summed in
int64. Rows are converted and written in chunks (memory bounded by ``chunk_rows``); the content
equals the NVIDIA script's under NumPy 1.x (golden/nvidia_varlength), the byte layout differs
(the script writes row by row).

    bertpipe pack-varlength --input eval_10k.hdf5 --output eval_varlength/part_eval_10k.hdf5
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import InputError, RecordError
from core.manifest import Manifest, StageOutput
from core.progress import progress
from core.schema import HDF5_FIELDS
from preprocessing.hdf5_check import check_padded
from preprocessing.hdf5_io import (
    atomic_path,
    chunks,
    h5_create,
    open_padded,
    reading,
    sequence_lengths,
    stage_file,
    stage_params,
    verify_inputs,
)

log = logging.getLogger(__name__)

STAGE_VERSION = "1"

#: (name, element dtype of the vlen dataset, which length truncates it), in NVIDIA's creation order.
VARLEN_DATASETS = (
    ("input_ids", "int16", "seq"),
    ("segment_ids", "int8", "seq"),
    ("masked_lm_positions", "int16", "pred"),
    ("masked_lm_ids", "int16", "pred"),
)

#: The padded datasets read per chunk: the four converted ones, input_mask (lengths) and the labels.
_READ = HDF5_FIELDS


@dataclass(frozen=True, kw_only=True)
class PackConfig:
    """Parameters of the padded -> packed conversion."""

    max_seq_length: int = 512  # width of the padded input (checked)
    max_predictions_per_seq: int = 76
    chunk_rows: int = 4096  # rows read, converted and written at once


def _fits(values: np.ndarray, dtype: str, name: str, path: Path, first: int) -> None:
    info = np.iinfo(dtype)
    if values.size and (values.min() < info.min or values.max() > info.max):
        row = int(np.flatnonzero(((values < info.min) | (values > info.max)).any(axis=1))[0])
        raise InputError(f"{path}: row {first + row}: {name} holds a value outside {dtype}, which NVIDIA's packed "
                         "format stores (a vocabulary over 32,767 entries does not fit)")


def ragged_flat(values: np.ndarray, lengths: np.ndarray, dtype: str, name: str, path: Path, first: int) -> np.ndarray:
    """The rows' first ``lengths[i]`` values, back to back, as ``dtype`` (for hdf5_io.write_vlen), refusing values
    that do not fit ``dtype``."""
    _fits(values, dtype, name, path, first)
    keep = np.arange(values.shape[1]) < np.asarray(lengths)[:, None]
    return values[keep].astype(dtype)


def _ragged(values: np.ndarray, lengths: np.ndarray, dtype: str, name: str, path: Path, first: int) -> np.ndarray:
    """An object array of per-row truncated arrays, refusing values that do not fit ``dtype``."""
    _fits(values, dtype, name, path, first)
    cast = values.astype(dtype)
    if len(lengths) and (lengths == lengths[0]).all():
        # Rows of one length (a chunk of 512-token rows, a last chunk of one row): h5py would turn the
        # object array into a 2-D one it cannot write to a vlen dataset (TypeError "Can't broadcast").
        # Its own 2-D path splits a 2-D array into rows: give it that.
        return np.ascontiguousarray(cast[:, :int(lengths[0])])
    out = np.empty(len(values), dtype=object)
    for i, n in enumerate(lengths.tolist()):
        out[i] = cast[i, :n]
    return out


def _check_lengths(seq: np.ndarray, width: int, path: Path, first: int) -> None:
    """A row's length (sum of its input_mask) is 1..width; anything else is a corrupt input_mask."""
    bad = np.flatnonzero((seq < 1) | (seq > width))
    if bad.size:
        raise RecordError(f"{path}: row {first + int(bad[0])} has sequence length {int(seq[bad[0]])} (sum of "
                          f"input_mask); expected 1..{width}: the file is corrupt, re-create it")


@dataclass(frozen=True)
class PaddedMap:
    """Where the six padded datasets of a file lie (each contiguous, unfiltered, native byte order): row ranges
    are mapped on demand, so only the rows at work are resident (a map of the whole file would count all of
    it in the process's RSS by the end)."""

    path: str
    layout: tuple[tuple[str, int, str, tuple[int, ...]], ...]  # (name, offset, dtype, shape)

    def rows(self, a: int, b: int) -> dict[str, np.ndarray]:
        """Rows a..b-1 of each dataset, read-only maps of the file (read from the page cache when touched)."""
        out = {}
        for name, offset, dt, shape in self.layout:
            row = int(np.prod(shape[1:], dtype=np.int64)) * np.dtype(dt).itemsize
            out[name] = np.memmap(self.path, dtype=dt, mode="r", offset=offset + a * row, shape=(b - a, *shape[1:]))
        return out


def mapped_padded(f: Any, path: Path) -> PaddedMap | None:
    """The layout of the six padded datasets of ``f`` (opened with ``open_padded``) when each is stored
    contiguous and unfiltered in native byte order (as tfrecord-to-hdf5 writes them) and the file can be
    memory-mapped; else None (chunked or compressed files are read through h5py)."""
    layout = []
    size = Path(path).stat().st_size
    for name in HDF5_FIELDS:
        ds = f[name]
        if ds.chunks is not None or ds.compression is not None or not ds.dtype.isnative or ds.size == 0:
            return None
        offset = ds.id.get_offset()
        if offset is None:
            return None
        if offset + ds.id.get_storage_size() > size or ds.id.get_storage_size() != ds.size * ds.dtype.itemsize:
            raise InputError(f"{path}: dataset {name!r} lies outside the file; the file is truncated or corrupt, "
                             "re-create it")
        layout.append((name, int(offset), ds.dtype.str, tuple(ds.shape)))
    out = PaddedMap(str(path), tuple(layout))
    try:
        out.rows(0, 1)
    except (OSError, ValueError):  # a file system that cannot map files: read through h5py
        return None
    return out


@dataclass(frozen=True)
class Compact:
    """A chunk of padded rows cut as ``convert_fixed2variable.py`` cuts them: the lengths (int64), the four
    datasets' values back to back in their vlen element types (:data:`VARLEN_DATASETS`), the labels (int8)."""

    seq: np.ndarray
    pred: np.ndarray
    flat: dict[str, np.ndarray]
    nsl: np.ndarray

    def lengths(self, kind: str) -> np.ndarray:
        return self.seq if kind == "seq" else self.pred


def _in(a: np.ndarray, lo: int, hi: int) -> bool:
    return not a.size or (int(a.min()) >= lo and int(a.max()) <= hi)


def _row_counts(mask: np.ndarray) -> np.ndarray:
    """Ones per row of a 0/1 mask (int64): bit counts of its 8-byte words when it is one byte a value."""
    m = np.ascontiguousarray(mask)
    if m.dtype.itemsize == 1 and m.ndim == 2 and m.shape[1] % 8 == 0 and m.shape[1]:
        return np.bitwise_count(m.view(np.uint64)).sum(axis=1, dtype=np.int64)
    return m.sum(axis=1, dtype=np.int64)


def _fast_ok(rows: dict[str, np.ndarray], width: int) -> np.ndarray | None:
    """The rows' lengths when every rule of the slow path holds (checked with a few reductions); else None."""
    mask = rows["input_mask"]
    if not _in(mask, 0, 1) or (mask[:, 1:] > mask[:, :-1]).any():
        return None
    seq = _row_counts(mask)
    if seq.size and (int(seq.min()) < 1 or int(seq.max()) > width):
        return None
    pos = rows["masked_lm_positions"]
    if not (_in(rows["input_ids"], 0, 32767) and _in(rows["segment_ids"], 0, 1) and _in(pos, 0, 32767)
            and _in(rows["masked_lm_ids"], 0, 32767) and _in(rows["next_sentence_labels"], 0, 1)):
        return None
    if pos.size and (pos >= seq[:, None]).any() and ((pos != 0) & (pos >= seq[:, None])).any():
        return None
    return seq


def _prefixes(values: np.ndarray, lengths: np.ndarray, dtype: str) -> np.ndarray:
    """Each row's first ``lengths[i]`` values, back to back, as ``dtype`` (range checked by the caller)."""
    from preprocessing import pack_fast

    v = np.ascontiguousarray(values)
    if pack_fast.available() and v.dtype.kind == "i" and v.dtype.isnative:
        starts = np.arange(len(v), dtype=np.int64) * v.shape[1]
        return pack_fast.gather_runs([v.reshape(-1)], None, starts, lengths, dtype)
    return v[np.arange(v.shape[1]) < np.asarray(lengths)[:, None]].astype(dtype)


def compact_padded(rows: dict[str, np.ndarray], path: Path, first: int, width: int, *,
                   row_ids: np.ndarray | None = None, space: Any = None) -> Compact:
    """A chunk of padded rows (the six datasets, memory maps or arrays; ``first``: the file's row of its first row)
    checked and cut: the rules and refusals of the row-by-row path (``_check_lengths``, ``check_padded``, the
    range of the vlen types, the labels' cast), in its order, with the values of every row kept as the reference
    keeps them. Valid rows take one pass in C (pack_fast.cut_padded), or without it a few reductions and one gather
    a dataset; a chunk that breaks a rule goes through the checks one after the other, which raise the error they
    always raised (``row_ids``: the file's row of each row, for check_padded's refusal, when the rows are a pick).
    ``space`` (a pack_fast.Space): the C pass's arrays are views of its buffers, valid until its next use."""
    from preprocessing import pack_fast

    cut = pack_fast.cut_padded(rows, space) if rows["input_mask"].shape[1] == width else None
    if cut:  # the C pass: every rule held
        seq, pred, ids, seg, pos, mlm, nsl = cut
        return Compact(seq=seq, pred=pred, nsl=nsl, flat={"input_ids": ids, "segment_ids": seg,
                                                          "masked_lm_positions": pos, "masked_lm_ids": mlm})
    seq = _fast_ok(rows, width) if cut is None else None
    if seq is None:  # the slow path: the same checks, in the same order, raise the same error
        rows = {k: np.asarray(v) for k, v in rows.items()}
        seq = sequence_lengths(rows["input_mask"])
        _check_lengths(seq, width, path, first)
        check_padded(path, first, rows, row_ids=row_ids)
        for name, dt, _ in VARLEN_DATASETS:  # (the labels are 0 or 1 by now: their cast to int8 cannot fail)
            _fits(rows[name], dt, name, path, first)
    pred = np.count_nonzero(np.asarray(rows["masked_lm_positions"]), axis=1).astype(np.int64)
    lens = {"seq": seq, "pred": pred}
    flat = {name: _prefixes(rows[name], lens[kind], dt) for name, dt, kind in VARLEN_DATASETS}
    return Compact(seq=seq, pred=pred, flat=flat, nsl=np.asarray(rows["next_sentence_labels"]).astype("i1"))


def pack_varlength(input_hdf5: Path, output_hdf5: Path, cfg: PackConfig = PackConfig()) -> int:
    """Write the packed form of ``input_hdf5`` to ``output_hdf5``; returns the row count.

    Raises:
        InputError: the input misses a dataset, has the wrong shape, or values overflow int16.
    """
    import h5py

    input_hdf5 = Path(input_hdf5)
    with open_padded(input_hdf5, max_seq_length=cfg.max_seq_length,
                     max_predictions_per_seq=cfg.max_predictions_per_seq) as src, \
            h5_create(output_hdf5) as dst:
        n = src["input_ids"].shape[0]
        out = {name: dst.create_dataset(name, (n,), dtype=h5py.vlen_dtype(np.dtype(dt)))
               for name, dt, _ in VARLEN_DATASETS}
        nsl = dst.create_dataset("next_sentence_labels", data=np.zeros(n, dtype="i1"), dtype="i1")
        with progress(total=n, desc=input_hdf5.name, unit="row") as bar:
            for a, b in chunks(n, cfg.chunk_rows):
                with reading(input_hdf5, f"rows {a}..{b - 1}"):
                    rows = {name: src[name][a:b] for name in _READ}
                lengths = {"seq": sequence_lengths(rows["input_mask"]),
                           "pred": (rows["masked_lm_positions"] != 0).sum(axis=1, dtype=np.int64)}
                _check_lengths(lengths["seq"], cfg.max_seq_length, input_hdf5, a)
                check_padded(input_hdf5, a, rows)  # the shared rules (preprocessing/hdf5_check.py)
                for name, dt, kind in VARLEN_DATASETS:
                    out[name][a:b] = _ragged(rows[name], lengths[kind], dt, name, input_hdf5, a)
                nsl[a:b] = rows["next_sentence_labels"].astype("i1")
                bar.update(b - a)
    return n


def run_pack_varlength(input_files: Sequence[Path], out_dir: Path, cfg: PackConfig = PackConfig(), *,
                       output_names: Sequence[str] | None = None, upstream: Sequence[Manifest] = ()) -> Manifest:
    """Stage function: one packed HDF5 per input in ``out_dir`` (same file names unless ``output_names``)."""
    files = [Path(p) for p in input_files]
    names = list(output_names) if output_names is not None else [p.name for p in files]
    if len(names) != len(files):
        raise InputError(f"{len(files)} inputs but {len(names)} output names")
    verify_inputs(files, upstream)
    with StageOutput(out_dir, "pack_varlength", params=stage_params(cfg), upstream=upstream,
                     code_version=STAGE_VERSION) as out:
        for src, name in zip(files, names, strict=True):
            with stage_file(out, name) as tmp:
                out.count("rows", pack_varlength(src, tmp, cfg))
            out.count("files", 1)
    return out.manifest


def pack_varlength_file(input_hdf5: Path, output_hdf5: Path, cfg: PackConfig = PackConfig()) -> int:
    """The CLI's file form: write ``output_hdf5`` atomically, without a manifest."""
    with atomic_path(Path(output_hdf5)) as tmp:
        return pack_varlength(Path(input_hdf5), tmp, cfg)
