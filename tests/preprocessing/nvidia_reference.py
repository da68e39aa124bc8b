"""NVIDIA's MLPerf BERT data scripts re-enacted in their own simple row-by-row style, for the exactness tests.

Our own code, written from reading NVIDIA's scripts (training_results v1.1 .. v3.1, ``input_preprocessing/``):
the same loops, the same float64 buffers, the same h5py calls in the same order, run under the installed NumPy and
h5py, so that bertpipe's fast implementations can be compared with what the scripts do, on any input. Where a
script relies on NumPy 1 (``sum()`` of an int8 row), the re-enactment sums in Python ints, as NumPy 1 does (the
NumPy 2 truncation is shown by its own test). Nothing here is fast; inputs are small.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import random
from itertools import cycle
from pathlib import Path

import h5py
import numpy as np

SIX = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels")


def _sum_np1(row: np.ndarray) -> int:
    """``sum(row)`` as NumPy 1.x computes it (the scripts' builtin sum over an int8 row: upcast to int64)."""
    return sum(row.tolist())


# -- chop_hdf5_files.py (v1.1 / v2.0 / v2.1 ... its loop and its bug) --------------------------------------
def chop_hdf5_files(input_dir: str, output_dir: str, num_shards: int, max_seq_length: int = 512,
                    max_predictions_per_seq: int = 76) -> str:
    input_files = sorted(glob.glob(input_dir + "/part-00???-of-00500.hdf5", recursive=False))
    out_dir = os.path.join(output_dir, f"hdf5_{num_shards}_shards_uncompressed")
    os.makedirs(out_dir, exist_ok=True)
    prefix, suffix = os.path.join(out_dir, "part_"), f"_of_{num_shards:05d}.hdf5"
    n_samples = 0
    for ifile in input_files:
        h = h5py.File(ifile, "r")
        n_samples += h["next_sentence_labels"].shape[0]
        h.close()
    nominal = (n_samples + num_shards - 1) // num_shards
    n_excess = num_shards * nominal - n_samples
    handles = [h5py.File(f"{prefix}{k:05d}{suffix}", "w") for k in range(num_shards)]

    def buffers(n: int) -> list[np.ndarray]:
        return [np.ndarray((n, max_seq_length)), np.ndarray((n, max_seq_length)), np.ndarray((n, max_seq_length)),
                np.ndarray((n, max_predictions_per_seq)), np.ndarray((n, max_predictions_per_seq)), np.ndarray((n,))]

    try:
        ofile_idx, entry = 0, 0
        in_shard = nominal - 1
        o = buffers(in_shard)
        for ifile in input_files:
            h = h5py.File(ifile, "r")
            f = [h[k][:] for k in SIX]
            h.close()
            i = 0
            while i < f[0].shape[0]:
                if entry == in_shard:
                    for (name, dtype), buf in zip((("input_ids", "i2"), ("input_mask", "i1"), ("segment_ids", "i1"),
                                                   ("masked_lm_positions", "i2"), ("masked_lm_ids", "i2"),
                                                   ("next_sentence_labels", "i1")), o, strict=True):
                        handles[ofile_idx].create_dataset(name, data=buf, dtype=dtype, compression=None)
                    handles[ofile_idx].flush()
                    handles[ofile_idx].close()
                    entry = 0
                    ofile_idx += 1
                    in_shard = nominal
                    if entry < n_excess:  # (sic) the counter was just reset: true whenever n_excess > 0
                        in_shard -= 1
                    o = buffers(in_shard)
                for buf, src in zip(o, f, strict=True):
                    buf[entry] = src[i]
                entry += 1
                i += 1
    finally:
        for h in handles:  # what the interpreter does at exit
            if h.id.valid:
                h.close()
    return out_dir


def chop_shard_sizes(file_rows: list[int], num_shards: int) -> tuple[list[int], int]:
    """chop_hdf5_files.py's loop with counters only: (rows of every shard written, rows left in the last buffer).

    Raises what the script raises: ValueError (a negative buffer size: no rows), IndexError (a row for a buffer
    of size 0, or a shard past the last file handle)."""
    n_samples = sum(file_rows)
    nominal = (n_samples + num_shards - 1) // num_shards
    n_excess = num_shards * nominal - n_samples
    handles = list(range(num_shards))
    written: list[int] = []
    ofile_idx, entry = 0, 0
    in_shard = nominal - 1
    if in_shard < 0:
        raise ValueError("negative dimensions are not allowed")
    for rows in file_rows:
        for _ in range(rows):
            if entry == in_shard:
                written.append(handles[ofile_idx] * 0 + entry)  # IndexError past the last handle, as the script
                entry = 0
                ofile_idx += 1
                in_shard = nominal
                if entry < n_excess:
                    in_shard -= 1
            if entry >= in_shard:  # o_input_ids[entry] = ... on a buffer of in_shard rows
                raise IndexError(f"index {entry} is out of bounds for axis 0 with size {in_shard}")
            entry += 1
    return written, entry


# -- convert_fixed2variable.py ---------------------------------------------------------------------------------
def _varlen_datasets(w: h5py.File, n: int) -> dict[str, h5py.Dataset]:
    return {
        "input_ids": w.create_dataset("input_ids", (n,), dtype=h5py.vlen_dtype(np.dtype("int16")), compression=None),
        "segment_ids": w.create_dataset("segment_ids", (n,), dtype=h5py.vlen_dtype(np.dtype("int8")),
                                        compression=None),
        "masked_lm_positions": w.create_dataset("masked_lm_positions", (n,), dtype=h5py.vlen_dtype(np.dtype("int16")),
                                                compression=None),
        "masked_lm_ids": w.create_dataset("masked_lm_ids", (n,), dtype=h5py.vlen_dtype(np.dtype("int16")),
                                          compression=None),
        "next_sentence_labels": w.create_dataset("next_sentence_labels", data=np.zeros(n, dtype="int8"), dtype="i1",
                                                 compression=None),
    }


def _copy_row(out: dict[str, h5py.Dataset], i: int, src: h5py.File, idx: int) -> None:
    n = _sum_np1(src["input_mask"][idx])
    p = _sum_np1(src["masked_lm_positions"][idx] != 0)
    out["input_ids"][i] = src["input_ids"][idx, :n]
    out["segment_ids"][i] = src["segment_ids"][idx, :n]
    out["masked_lm_positions"][i] = src["masked_lm_positions"][idx, :p]
    out["masked_lm_ids"][i] = src["masked_lm_ids"][idx, :p]
    out["next_sentence_labels"][i] = src["next_sentence_labels"][idx]


def convert_fixed2variable(input_hdf5_file: str, output_hdf5_file: str) -> None:
    src = h5py.File(input_hdf5_file, "r")
    n = src.get("next_sentence_labels").shape[0]
    w = h5py.File(output_hdf5_file, "w")
    out = _varlen_datasets(w, n)
    for i in range(n):
        _copy_row(out, i, src, i)
    w.flush()
    w.close()
    src.close()


# -- pick_eval_samples_varlength.py --------------------------------------------------------------------------------
def pick_eval_samples_varlength(input_hdf5_file: str, output_hdf5_file: str, num_examples_to_pick: int = 10000) -> str:
    src = h5py.File(input_hdf5_file, "r")
    num_examples = src.get("next_sentence_labels").shape[0]
    w = h5py.File(output_hdf5_file + ".hdf5", "w")
    out = _varlen_datasets(w, num_examples_to_pick)
    ratio = num_examples / num_examples_to_pick
    for i in range(num_examples_to_pick):
        _copy_row(out, i, src, int(i * ratio))
    w.flush()
    w.close()
    src.close()
    return output_hdf5_file + ".hdf5"


# -- shuffle_samples: the index lists (random.Random(24)), then the shards (v3.1) -----------------------------------
def shuffle_index_lists(input_hdf5: str, output_hdf5: str, seed: int = 24) -> list[int]:
    input_files = sorted(glob.glob(input_hdf5 + "/part_0*.hdf5", recursive=False))
    counts = {}
    for k, path in enumerate(input_files):
        h = h5py.File(path, "r")
        counts[k] = h["input_ids"].shape[0]
        h.close()
    ind = [(i, j) for idx in range(len(input_files)) for i, j in zip(cycle([idx]), list(range(counts[idx])))]
    random.Random(seed).shuffle(ind)
    master = 0
    for k in range(len(input_files)):
        with open(f"{output_hdf5}/shard_indices_{k:05}.lst", "w") as f:
            f.write(json.dumps(ind[master:master + counts[k]]))
        master += counts[k]
    return [counts[k] for k in range(len(input_files))]


def shuffle_samples_write(input_hdf5: str, output_hdf5: str) -> list[str]:
    input_files = sorted(glob.glob(input_hdf5 + "/part_0*.hdf5", recursive=False))
    keys = ["input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels"]
    data = {}
    for k, path in enumerate(input_files):
        h = h5py.File(path, "r")
        data[k] = [np.asarray(h[key][:]) for key in keys]
        h.close()
    written = []
    for k in range(len(input_files)):
        with open(f"{output_hdf5}/shard_indices_{k:05}.lst") as f:
            ind = json.load(f)
        name = f"{output_hdf5}/part_{k:05d}_of_{len(input_files):05d}.hdf"  # (sic) .hdf: the chk lists say .hdf5
        w = h5py.File(name, "w")
        out = _varlen_datasets(w, len(ind))
        for o, (ifile, isample) in enumerate(ind):
            for key, arr in zip(keys, data[ifile], strict=True):
                out[key][o] = arr[isample]
        w.flush()
        w.close()
        written.append(name)
    return written


# -- hdf5_md5.py ----------------------------------------------------------------------------------------------------
def hdf5_md5(path: str | Path) -> str:
    f = h5py.File(path, "r")
    row_sums = [hashlib.md5(str(f["input_ids"][i].tolist()).encode("utf-8")).hexdigest()
                for i in range(f["input_ids"].shape[0])]
    f.close()
    return hashlib.md5(str(row_sums).encode("utf-8")).hexdigest()


# -- made-up inputs ---------------------------------------------------------------------------------------------
def padded_rows(lengths: list[int], seed: int, max_seq_length: int = 512, max_pred: int = 76) -> dict[str, np.ndarray]:
    """Rows in the Samsung padded layout with the given sequence lengths (1..max_seq_length), plausible content."""
    rng = np.random.default_rng(seed)
    n = len(lengths)
    ids = np.zeros((n, max_seq_length), np.int32)
    mask = np.zeros((n, max_seq_length), np.int8)
    seg = np.zeros((n, max_seq_length), np.int8)
    pos = np.zeros((n, max_pred), np.int32)
    lm = np.zeros((n, max_pred), np.int32)
    for r, L in enumerate(lengths):
        ids[r, :L] = rng.integers(104, 30522, L)
        ids[r, 0] = 101
        mask[r, :L] = 1
        seg[r, L // 2:L] = 1
        k = min(max_pred, max(0, (L - 1) * 15 // 100), L - 1)
        p = np.sort(rng.choice(np.arange(1, L), size=k, replace=False)) if k else np.zeros(0, int)
        pos[r, :k] = p
        lm[r, :k] = rng.integers(104, 30522, k)
    nsl = rng.integers(0, 2, n).astype(np.int8)
    return {"input_ids": ids, "input_mask": mask, "segment_ids": seg, "masked_lm_positions": pos,
            "masked_lm_ids": lm, "next_sentence_labels": nsl}


def write_padded(path: Path, rows: dict[str, np.ndarray]) -> Path:
    """A padded part file as Samsung's converter writes it (i4 ids, i1 mask/segments/labels)."""
    dtypes = {"input_ids": "i4", "input_mask": "i1", "segment_ids": "i1", "masked_lm_positions": "i4",
              "masked_lm_ids": "i4", "next_sentence_labels": "i1"}
    with h5py.File(path, "w") as f:
        for k in SIX:
            f.create_dataset(k, data=rows[k], dtype=dtypes[k])
    return path


def assert_same_content(a: str | Path, b: str | Path) -> None:
    """Names, dtypes, shapes and values (vlen rows one by one) of two HDF5 files are equal."""
    with h5py.File(a, "r") as x, h5py.File(b, "r") as y:
        assert sorted(x) == sorted(y), (a, sorted(x), sorted(y))
        for k in y:
            dx, dy = x[k], y[k]
            assert (dx.dtype, dx.shape, dx.compression) == (dy.dtype, dy.shape, dy.compression), (a, k)
            assert h5py.check_vlen_dtype(dx.dtype) == h5py.check_vlen_dtype(dy.dtype), (a, k)
            if h5py.check_vlen_dtype(dy.dtype) is None:
                np.testing.assert_array_equal(dx[:], dy[:], err_msg=f"{a} {k}")
            else:
                for i, (u, v) in enumerate(zip(dx[:], dy[:], strict=True)):
                    assert u.dtype == v.dtype and np.array_equal(u, v), f"{a} {k} row {i}"
