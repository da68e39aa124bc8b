"""A re-enactment of Habana's ``pack_pretraining_data_pytorch.py`` for the exactness tests (test_pack_habana.py).

Read from HabanaAI/Model-References ``PyTorch/nlp/pretraining/bert/pack_pretraining_data_pytorch.py`` @ cf11d241
and written here in the script's own plain style, row by row (it shares no code with bertpipe's vectorized
``preprocessing/habana/pack.py``): seeds ``random`` and ``np.random`` with ``seed + local_rank``; reads every row
of the ``*training*`` files into a dict of lists keyed by length; the NNLS packing recipe with
``scipy.optimize.nnls``; ``random.shuffle`` of every length's list (with ``None`` padding slots), in the dict's
order; ``np.random.permutation`` of the strategy instances; slices popped from per-(strategy, length) stacks;
packs built one by one; 4,480 packs a file, ``mixed_strategies_part_<i>.hdf5``.

Deliberate differences from the script, where it cannot run as written or is not reproducible:
* the listing is sorted (the script takes ``os.listdir``'s order);
* a row's length is summed in int64 (the script's Python ``sum()`` over an int8 row: NumPy 1 upcasts, NumPy 2
  wraps at 128 and the script then crashes);
* a length-L sequence left after the NNLS rounds takes the strategy ``[L]`` (the script looks up ``[0, L]``
  and raises ValueError), as bertpipe does.
``keep_partial_last=True`` also writes the packs the script drops after its last whole file (bertpipe's default).
"""

from __future__ import annotations

import os
import random
import sys
from collections import defaultdict
from pathlib import Path

import h5py
import numpy as np
from scipy import optimize

SLICE = 4480


def strategies_of(start: int, previous: int, target: int, depth: int) -> list[list[int]]:
    gap = target - start
    found: list[list[int]] = []
    if depth == 1:
        if gap >= previous:
            found.append([gap])
        return found
    for new in range(previous, gap + 1):
        if target - start - new == 0:
            found.append([new])
        else:
            for option in strategies_of(start + new, new, target, depth - 1):
                if len(option) > 0:
                    found.append([new] + option)
    return found


def recipe(sequence_lengths: np.ndarray, L: int, S: int):
    histogram, _ = np.histogram(sequence_lengths, bins=np.arange(1, L + 2))
    strategy_set = strategies_of(0, 1, L, S)
    A = np.zeros((L, len(strategy_set)), dtype=np.int32)
    for i, strategy in enumerate(strategy_set):
        for seq_len in strategy:
            A[seq_len - 1, i] += 1
    w0 = np.ones([L])
    w0[:8] = 8 / (2 * L)
    w0 = np.sqrt(w0)
    padding = np.zeros([L], dtype=np.int32)
    mixture = np.zeros([len(strategy_set)], dtype=np.int32)
    b = histogram + padding
    for _ in range(20):
        partial, _ = optimize.nnls(np.expand_dims(w0, -1) * A, w0 * b)
        partial = np.where(partial < 2, np.rint(partial), np.floor(partial))
        if partial.max() == 0:
            grad = A.T @ (b * np.arange(1, L + 1))
            k = int(b.sum() // 2) + 1
            partial[np.argsort(-grad)[:k]] += 1
        mixture = mixture + partial
        residual = b - A @ partial
        padding = padding + np.where(residual < 0, -residual, 0)
        b = histogram + padding - A @ mixture
        assert np.all(b >= 0)
        if b.sum() < 100:
            break
    for n in np.arange(1, L + 1)[b > 0]:
        strategy = sorted([n, L - n]) if n != L else [L]  # the script: [0, L], a ValueError
        mixture[strategy_set.index(strategy)] += b[n - 1]
    b = histogram - A @ mixture
    padding = np.where(b < 0, -b, 0)
    b = histogram + padding - A @ mixture
    assert b.sum() == 0
    new = int(mixture.sum())
    avg = ((A.sum(0) * mixture).sum() - padding.sum()) / new
    slicing = np.zeros_like(A)
    slicing[:, 1:] = np.cumsum(A * mixture, axis=1)[:, :-1]
    return strategy_set, mixture.astype(np.int64), padding, slicing.T, avg


def one_pack(multi_sequence, P: int, L: int, S: int) -> dict[str, np.ndarray]:
    ids = np.zeros(L, dtype=np.int32)
    mask = np.zeros(L, dtype=np.int32)
    seg = np.zeros(L, dtype=np.int32)
    pos = np.zeros(L, dtype=np.int32)
    mlm_pos = np.zeros(P + S, dtype=np.int32)
    mlm_ids = np.zeros(P + S, dtype=np.int32)
    nsp_pos = np.zeros(S, dtype=np.int32)
    nsp_lab = np.zeros(S, dtype=np.int32)
    nsp_w = np.zeros(S, dtype=np.int32)
    offset = mlm_offset = 0
    index = 1
    for seq in multi_sequence:
        if seq is None:
            continue
        n = seq["input_mask"].sum()
        ids[offset:offset + n] = seq["input_ids"][:n]
        mask[offset:offset + n] = index
        seg[offset:offset + n] = seq["segment_ids"][:n]
        pos[offset:offset + n] = np.arange(0, n)
        m = (seq["masked_lm_ids"] != 0).sum()
        assert mlm_offset + m < P + S, "Too many LM predictions per sequences"
        mlm_pos[mlm_offset:mlm_offset + m] = offset + seq["masked_lm_positions"][:m]
        mlm_ids[mlm_offset:mlm_offset + m] = seq["masked_lm_ids"][:m]
        nsp_pos[index - 1] = offset
        nsp_lab[index - 1] = seq["next_sentence_labels"]
        nsp_w[index - 1] = 1
        index += 1
        offset += n
        mlm_offset += m
    return {"input_ids": ids, "input_mask": mask, "segment_ids": seg, "positions": pos,
            "masked_lm_positions": mlm_pos, "masked_lm_ids": mlm_ids, "next_sentence_positions": nsp_pos,
            "next_sentence_labels": nsp_lab, "next_sentence_weights": nsp_w}


NAMES = [("input_ids", "i4"), ("input_mask", "i4"), ("segment_ids", "i1"), ("positions", "i4"),
         ("masked_lm_positions", "i4"), ("masked_lm_ids", "i4"), ("next_sentence_positions", "i4"),
         ("next_sentence_labels", "i1"), ("next_sentence_weights", "i4")]


def pack(input_dir: Path, output_dir: Path, *, L: int = 512, P: int = 80, S: int = 3, seed: int = 42,
         local_rank: int = -1, keep_partial_last: bool = False) -> dict:
    """Run the re-enactment; returns {"avg_seq_per_sample", "packs", "files"}. Global RNG state is restored."""
    saved = random.getstate(), np.random.get_state()
    old_limit = sys.getrecursionlimit()
    try:
        # the script's random.seed / np.random.seed, as generators of their own: the same draws, and no other
        # thread of the test process (Prefect's, from earlier tests) can take a draw in between
        rnd = random.Random(seed + local_rank)
        nprnd = np.random.RandomState(seed + local_rank)
        files = sorted(os.path.join(input_dir, f) for f in os.listdir(input_dir)
                       if os.path.isfile(os.path.join(input_dir, f)) and "training" in f)
        by_length: dict[int, list] = defaultdict(list)
        lengths = []
        for path in files:
            with h5py.File(path, "r") as f:
                cols = {k: np.asarray(f[k][:]) for k in ("input_ids", "input_mask", "segment_ids",
                                                          "masked_lm_positions", "masked_lm_ids",
                                                          "next_sentence_labels")}
            for i in range(len(cols["input_ids"])):
                row = {k: v[i] for k, v in cols.items()}
                n = int(row["input_mask"].astype(np.int64).sum())
                by_length[n].append(row)
                lengths.append(n)
        strategy_set, mixture, padding, slicing, avg = recipe(np.array(lengths), L, S)
        for i in range(1, L + 1):
            if i not in by_length:
                by_length[i] = []
            by_length[i].extend([None] * int(padding[i - 1]))
        for key in by_length:
            rnd.shuffle(by_length[key])
        stacks: dict[str, list] = defaultdict(list)
        for strategy, offsets, count in zip(strategy_set, slicing, mixture, strict=True):
            for _ in range(count):
                for seq_len in strategy:
                    start = int(offsets[seq_len - 1])
                    offsets[seq_len - 1] = start + 1
                    stacks[f"{strategy}_{seq_len}"].append(start)
        order = nprnd.permutation(sum(mixture))
        expanded = [s for s, r in zip(strategy_set, mixture, strict=True) for _ in range(r)]
        packs = []
        for ind in order:
            strategy = expanded[ind]
            packs.append([by_length[seq_len][stacks[f"{strategy}_{seq_len}"].pop()] for seq_len in strategy])
        chunks = [packs[i:i + SLICE] for i in range(0, len(packs), SLICE)]
        if chunks and len(chunks[-1]) < SLICE and not keep_partial_last:
            chunks.pop()
        os.makedirs(output_dir, exist_ok=True)
        for part, chunk in enumerate(chunks):
            feats = defaultdict(list)
            for multi in chunk:
                for k, v in one_pack(multi, P, L, S).items():
                    feats[k].append(v)
            with h5py.File(os.path.join(output_dir, f"mixed_strategies_part_{part}.hdf5"), "w") as f:
                for name, dt in NAMES:
                    f.create_dataset(name, data=np.array(feats[name]), dtype=dt, compression="gzip")
        return {"avg_seq_per_sample": float(avg), "packs": len(packs), "files": len(chunks)}
    finally:
        random.setstate(saved[0])
        np.random.set_state(saved[1])
        sys.setrecursionlimit(old_limit)
