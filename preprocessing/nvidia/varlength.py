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
