"""How the reference trainers find and read their HDF5 data, re-enacted from their documented rules (our own code,
not theirs), for tests/test_loader_layouts.py and tests/flows/test_loader_layouts_dag.py.

* Samsung MLPerf v2.0 (4-bin training): the input dir's entries, sorted by ``int(name)`` (any other entry is a
  ValueError), each a bin folder holding the shard files (``part_<k>_of_<N>.hdf5``).
* MLPerf eval (Samsung, NVIDIA's and Habana's MLPerf trainers): the files of the eval dir whose name contains
  ``part``.
* NVIDIA DeepLearningExamples and Habana Model-References (bert, deepspeed-bert): the files (``os.path.isfile``,
  which follows symlinks) of one flat input dir whose name contains ``training``, sorted.
* Every one of them opens a file with h5py and reads the six datasets by name into arrays; the data set's
  length is ``len(input_ids)``; ``masked_lm_labels`` are ``masked_lm_ids`` at ``masked_lm_positions`` up to
  the first 0 position (-1 elsewhere).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

SIX = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels")


def samsung_bins(train_dir: str | os.PathLike) -> list[tuple[int, list[str]]]:
    """(bin, its shard files) in the order Samsung's trainer takes them; ValueError on a non-int entry."""
    out = []
    for entry in sorted(os.scandir(train_dir), key=lambda e: int(e.name)):
        files = sorted(os.path.join(entry.path, f) for f in os.listdir(entry.path)
                       if os.path.isfile(os.path.join(entry.path, f)))
        out.append((int(entry.name), files))
    return out


def mlperf_eval_files(eval_dir: str | os.PathLike) -> list[str]:
    return sorted(os.path.join(eval_dir, f) for f in os.listdir(eval_dir)
                  if os.path.isfile(os.path.join(eval_dir, f)) and "part" in f)


def flat_training_files(input_dir: str | os.PathLike) -> list[str]:
    """NVIDIA DeepLearningExamples / Habana Model-References: flat, name contains "training"."""
    return sorted(os.path.join(input_dir, f) for f in os.listdir(input_dir)
                  if os.path.isfile(os.path.join(input_dir, f)) and "training" in f)


class PretrainingDataset:
    """A shard read the way those trainers' ``pretraining_dataset`` classes do: six datasets by name."""

    def __init__(self, path: str | os.PathLike, max_pred_length: int = 76) -> None:
        import h5py

        with h5py.File(path, "r") as f:
            self.inputs = [np.asarray(f[key][:]) for key in SIX]  # KeyError on a file without datasets
        self.max_pred_length = max_pred_length

    def __len__(self) -> int:
        return len(self.inputs[0])

    def __getitem__(self, i: int) -> list[np.ndarray]:
        ids, mask, seg, pos, lm_ids, nsp = (x[i] for x in self.inputs)
        labels = np.full(ids.shape, -1, dtype=np.int64)
        zeros = np.flatnonzero(pos == 0)
        n = int(zeros[0]) if zeros.size else self.max_pred_length
        labels[pos[:n]] = lm_ids[:n]
        return [ids, seg, mask, labels, nsp]


def rows_of(path: Path | str) -> int:
    """Rows of a shard through the reference reading (every row's masked labels built, as a trainer would)."""
    ds = PretrainingDataset(path)
    for i in range(len(ds)):
        labels = ds[i][3]
        assert (labels >= 0).sum() >= 1, (path, i)  # every MLPerf row has at least one masked position
    shapes = {len(x) for x in ds.inputs}
    assert shapes == {len(ds)}, (path, shapes)
    return len(ds)
