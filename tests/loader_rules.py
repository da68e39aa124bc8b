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
* NVIDIA's MLPerf trainer (training_results v1.1 and later, ``run_pretraining.py``): the files of its input dir
  whose name contains ``part`` (``part_`` from v2.x), five datasets of variable-length rows (the attention mask is
  made from each row's length), or in packed mode (``--packed_samples``) seven.
* Habana Model-References BERT in packed mode (its default): every file of the input dir, nine datasets, and
  ``<input_dir>_metadata.json`` beside the folder.
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


# -- NVIDIA's MLPerf trainer, variable-length rows (training_results v1.1 and later, run_pretraining.py) ------------
#: The datasets its ``pretraining_dataset`` reads when not packed (no input_mask: it is made from each row's length).
NVIDIA_VARLEN_KEYS = ("input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels")


def nvidia_v11_training_files(input_dir: str | os.PathLike) -> list[str]:
    """NVIDIA's MLPerf trainer v1.1: the files of the input dir whose name contains ``part``, sorted (then shuffled
    per epoch); later versions ask for ``part_`` (:func:`nvidia_mlperf_training_files`)."""
    return sorted(os.path.join(input_dir, f) for f in os.listdir(input_dir)
                  if os.path.isfile(os.path.join(input_dir, f)) and "part" in f)


class NvidiaVarlenDataset:
    """A shard read as NVIDIA's MLPerf ``pretraining_dataset`` does without ``--packed_samples``: the five datasets
    above by name; a sample's ``input_ids``/``segment_ids`` are the row zero-padded to ``max_seq_length``, its
    ``input_mask`` is 1 over ``len(row input_ids)`` (the row's length is the sequence: given a padded row it is all
    ones), ``masked_lm_labels`` hold masked_lm_ids at masked_lm_positions (0 elsewhere), and the NSP label."""

    def __init__(self, path: str | os.PathLike, max_seq_length: int = 512) -> None:
        import h5py

        with h5py.File(path, "r") as f:
            self.inputs = [np.asarray(f[key][:]) for key in NVIDIA_VARLEN_KEYS]  # KeyError on another layout
        self.max_seq_length = max_seq_length

    def __len__(self) -> int:
        return len(self.inputs[0])

    def __getitem__(self, i: int) -> list[np.ndarray]:
        s = self.max_seq_length
        ids, seg, pos, lm_ids, nsp = (np.asarray(x[i]).astype(np.int64) for x in self.inputs)
        input_ids, input_mask, segment_ids = (np.zeros(s, np.int64) for _ in range(3))
        n = ids.shape[-1]
        input_ids[:n], input_mask[:n], segment_ids[:n] = ids, 1, seg
        labels = np.zeros(s, np.int64)
        labels[pos] = lm_ids
        return [input_ids, segment_ids, input_mask, labels, nsp]


def wrong_masks(ds: NvidiaVarlenDataset) -> int:
    """Rows whose attention mask (as the trainer makes it) is not exactly the sequence's tokens. A sequence ends with
    [SEP] (never masked, never id 0), so its length is the index of its last non-zero id + 1 (id 0, [PAD], may occur
    inside it: the reference's random replacement of a masked token can draw it). A padded row read this way gets an
    all-ones mask: wrong unless the sequence fills the row."""
    bad = 0
    for i in range(len(ds)):
        ids, _, mask, _, _ = ds[i]
        nz = np.flatnonzero(ids)
        n = int(nz[-1]) + 1 if nz.size else 0
        bad += int(mask.sum()) != n or not bool(mask[:n].all())
    return bad


# -- NVIDIA's MLPerf trainer, packed mode (training_results v2.1-v3.1 run_pretraining.py --packed_samples) ---------
PACKED_KEYS = ("input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids", "packed_input_len",
               "packed_masked_lm_len", "next_sentence_labels")


def nvidia_mlperf_training_files(input_dir: str | os.PathLike) -> list[str]:
    """NVIDIA's MLPerf trainer (v2.0-v3.1): the files of the input dir whose name contains ``part_``, sorted
    (then shuffled per epoch with a seed)."""
    return sorted(os.path.join(input_dir, f) for f in os.listdir(input_dir)
                  if os.path.isfile(os.path.join(input_dir, f)) and "part_" in f)


class NvidiaPackedDataset:
    """A packed shard read as NVIDIA's ``pretraining_dataset(packed_samples=True)`` does: seven datasets by name;
    a sample is its pack padded to ``max_seq_length`` (input_mask 1 over all its tokens), masked-LM labels at the
    pack's positions (0 elsewhere), and next-sentence labels and sequence lengths zero-padded to 3."""

    def __init__(self, path: str | os.PathLike, max_seq_length: int = 512) -> None:
        import h5py

        with h5py.File(path, "r") as f:
            self.inputs = [np.asarray(f[key][:]) for key in PACKED_KEYS]  # KeyError on another layout
        self.max_seq_length = max_seq_length

    def __len__(self) -> int:
        return len(self.inputs[0])

    def __getitem__(self, i: int) -> list[np.ndarray]:
        s = self.max_seq_length
        ids, seg, pos, lm_ids, plen, _plm, nsp = (x[i].astype(np.int64) for x in self.inputs)
        input_ids, input_mask, segment_ids = (np.zeros(s, np.int64) for _ in range(3))
        n = ids.shape[-1]
        input_ids[:n], input_mask[:n], segment_ids[:n] = ids, 1, seg
        labels = np.zeros(s, np.int64)
        labels[pos] = lm_ids
        nsp3, plen3 = np.zeros(3, np.int64), np.zeros(3, np.int64)
        nsp3[:plen.shape[-1]], plen3[:plen.shape[-1]] = nsp, plen
        return [input_ids, segment_ids, input_mask, labels, nsp3, plen3]


def nvidia_packed_batch(samples: list[list[np.ndarray]]) -> dict[str, np.ndarray]:
    """What NVIDIA's ``preprocess_batch`` (pad_fmha, packed) makes of a batch: the tokens of all samples back to
    back (zero padding at the end), position ids restarting at every sequence, ``cu_seqlens`` of the sequences
    (block-diagonal attention), one NSP label per sequence."""
    ids, seg, mask, labels, nsp, plen = (np.stack([x[k] for x in samples]) for k in range(6))
    b, s = ids.shape
    lens = mask.sum(-1)
    keep = np.arange(s) < lens[:, None]

    def compact(t: np.ndarray) -> np.ndarray:
        out = np.zeros(b * s, np.int64)
        out[:int(lens.sum())] = t[keep]
        return out.reshape(b, s)

    flat_plen = plen.reshape(-1)
    nz = np.flatnonzero(flat_plen)
    seqlens = flat_plen[nz]
    pids = np.concatenate([np.arange(n) for n in seqlens] + [np.zeros(s * b - int(seqlens.sum()), np.int64)])
    return {"input_ids": compact(ids), "segment_ids": compact(seg), "labels_mlm": compact(labels),
            "position_ids": pids.reshape(b, s), "cu_seqlens": np.concatenate([[0], np.cumsum(seqlens)]),
            "labels_nsp": nsp.reshape(-1)[nz]}


# -- Habana Model-References BERT, packed mode (--enable_packed_data_mode True, its default) ------------------------
#: The nine datasets Habana's packed-mode ``pretraining_dataset`` reads, in its order (PyTorch/nlp/bert/run_pretraining.py).
HABANA_PACKED = ("input_ids", "input_mask", "segment_ids", "positions", "masked_lm_positions", "masked_lm_ids",
                 "next_sentence_positions", "next_sentence_labels", "next_sentence_weights")


def habana_packed_files(input_dir: str | os.PathLike) -> list[str]:
    """Packed mode: every regular file of the input dir ("Packed files have no 'training' pre/postfix"), sorted
    (then shuffled with ``random.Random(seed + epoch)``); each is opened as HDF5."""
    return sorted(os.path.join(input_dir, f) for f in os.listdir(input_dir)
                  if os.path.isfile(os.path.join(input_dir, f)))


def habana_avg_seq_per_sample(input_dir: str | os.PathLike, max_seq_length: int) -> float | None:
    """``read_avg_seq_per_sample``: ``<normpath(input_dir)>_metadata.json`` beside the folder, key
    ``avg_seq_per_sample`` (KeyError-like assertion if the file lacks it); without the file 1.2 (128) or 2.0 (512),
    and None for any other length (the trainer's ``assert f"..."`` is a no-op; it then fails dividing by None)."""
    import json

    head, tail = os.path.split(os.path.normpath(input_dir))
    path = os.path.join(head, tail + "_metadata.json")
    if not os.path.exists(path):
        return {128: 1.2, 512: 2.0}.get(max_seq_length)
    with open(path) as fh:
        meta = json.loads(fh.read())
    assert "avg_seq_per_sample" in meta, f"Key avg_seq_per_sample not present in {path}"
    return meta["avg_seq_per_sample"]


class HabanaPackedDataset:
    """A packed file read the way Habana's ``pretraining_dataset`` does in packed mode: the nine datasets by name;
    an item is (input_ids, segment_ids, input_mask, positions, masked_lm_labels, next_sentence_positions,
    next_sentence_labels) as int64, masked_lm_labels -1 but at masked_lm_positions[:index] (index: the first 0 in
    masked_lm_positions, else ``max_pred_length``), next_sentence_labels -1 where next_sentence_weights is 0."""

    def __init__(self, path: str | os.PathLike, max_pred_length: int) -> None:
        import h5py

        with h5py.File(path, "r") as f:
            self.inputs = [np.asarray(f[key][:]) for key in HABANA_PACKED]  # KeyError on an unpacked file
        self.max_pred_length = max_pred_length

    def __len__(self) -> int:
        return len(self.inputs[0])

    def __getitem__(self, i: int) -> list[np.ndarray]:
        ids, mask, seg, pos, mpos, mids, nsp_pos, nsp_lab, nsp_w = (x[i].astype(np.int64) for x in self.inputs)
        labels = np.full(ids.shape, -1, dtype=np.int64)
        zeros = np.flatnonzero(mpos == 0)
        index = int(zeros[0]) if zeros.size else self.max_pred_length
        labels[mpos[:index]] = mids[:index]
        nsp = (nsp_w == 1) * nsp_lab + (nsp_w == 0) * -1
        return [ids, seg, mask, pos, labels, nsp_pos, nsp]
