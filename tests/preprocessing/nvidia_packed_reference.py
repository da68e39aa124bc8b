"""NVIDIA's ``input_preprocessing/packed_data/`` scripts re-enacted in their own simple style, for the exactness
tests of ``bertpipe pack-nvidia`` (preprocessing/nvidia/pack.py).

Our own code, written from reading NVIDIA's scripts (training_results v2.0 ``gather_per_seqlength_data.py``;
the v2.x/v3.x ``generate_packing_strategy.py`` and ``create_packed_trainset.py``; the v3.1 packed_data README):
Python lists, the same recursion, the same NumPy/SciPy calls on the same dtypes, ``random`` (the module's global
generator, seeded here because the script is not), ``json.dumps`` and one h5py assignment per row. Nothing here
is fast; inputs are small. Where the scripts rely on NumPy 1 (``sum()`` over an int8 row) the sum is taken in
Python ints, as NumPy 1 does.

``create_per_seqlength_data.py`` itself was not found: it is re-enacted as what its README says it does (a
part's instances grouped by their number of valid tokens, in instance order), on padded rows.
"""

from __future__ import annotations

import json
import random
from functools import cache
from pathlib import Path

import h5py
import numpy as np

SIX = ("input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels")
GATHER_DTYPES = {"input_ids": "int16", "input_mask": "int8", "segment_ids": "int8", "masked_lm_positions": "int16",
                 "masked_lm_ids": "int16", "next_sentence_labels": "i1"}


def _sum(row) -> int:
    return sum(row.tolist())  # the scripts' builtin sum() over a NumPy row, as NumPy 1 adds it


# -- create_per_seqlength_data.py + gather_per_seqlength_data.py -----------------------------------------------
def per_seqlength(part_file: str | Path) -> dict[int, dict[str, list]]:
    """One part's padded rows grouped by sum(input_mask), in row order."""
    groups: dict[int, dict[str, list]] = {}
    with h5py.File(part_file, "r") as f:
        data = {k: f[k][:] for k in SIX}
    for i in range(len(data["input_ids"])):
        length = _sum(data["input_mask"][i])
        g = groups.setdefault(length, {k: [] for k in SIX})
        for k in SIX:
            g[k].append(data[k][i])
    return groups


def gather(parts: list[dict[int, dict[str, list]]], seq_length: int, width: int = 512, preds: int = 76) -> dict:
    """train_sentences_<seq_length>: that length's rows of every part, in part order, in the gather's dtypes."""
    out = {}
    for k in SIX:
        chunks = [np.asarray(p[seq_length][k]) for p in parts if seq_length in p]
        shape = (0,) if k == "next_sentence_labels" else (0, preds if "masked" in k else width)
        out[k] = (np.concatenate(chunks) if chunks else np.zeros(shape)).astype(GATHER_DTYPES[k])
    return out


# -- generate_packing_strategy.py -------------------------------------------------------------------------------------
@cache
def packing_strategies(start, previous, target, depth):
    gap = target - start
    strategies = []
    if depth == 1:
        if gap >= previous:
            strategies.append([gap])
    else:
        for new in range(previous, gap + 1):
            new_gap = target - start - new
            if new_gap == 0:
                strategies.append([new])
            else:
                options = packing_strategies(start + new, new, target, depth - 1)
                for option in options:
                    if len(option) > 0:
                        strategies.append([new] + option)
    return strategies


def get_packing_recipe(histogram, max_sequence_length, max_sequences_per_pack=3):
    from scipy import optimize

    strategy_set = packing_strategies(0, 1, max_sequence_length, max_sequences_per_pack)
    num_strategies = len(strategy_set)
    A = np.zeros((max_sequence_length, num_strategies), dtype=np.int32)
    for i in range(num_strategies):
        for seq_len in strategy_set[i]:
            A[seq_len - 1, i] += 1
    padding_cutoff = 8
    w0 = np.ones([max_sequence_length])
    w0[:padding_cutoff] = padding_cutoff / (2 * max_sequence_length)
    w0 = np.sqrt(w0)
    padding = np.zeros([max_sequence_length], dtype=np.int32)
    mixture = np.zeros([num_strategies], dtype=np.int32)
    b = histogram + padding
    for _ in range(0, 20):
        partial_mixture, rnorm = optimize.nnls(np.expand_dims(w0, -1) * A, w0 * b)
        partial_mixture = np.where(partial_mixture < 2, np.rint(partial_mixture), np.floor(partial_mixture))
        if partial_mixture.max() == 0:
            grad = A.T @ (b * np.arange(1, max_sequence_length + 1))
            k = int(b.sum() // 2) + 1
            topk = np.argsort(-grad)[:k]
            partial_mixture[topk] += 1
        mixture = mixture + partial_mixture
        residual = b - A @ partial_mixture
        partial_padding = np.where(residual < 0, -residual, 0)
        padding = padding + partial_padding
        b = histogram + padding - A @ mixture
        assert np.all(b >= 0), b
        if b.sum() < 100:
            break
    unpacked_seqlen = np.arange(1, max_sequence_length + 1)[b > 0]
    for l in unpacked_seqlen:  # noqa: E741 - the script's name
        strategy = sorted([l, max_sequence_length - l])
        strategy_index = strategy_set.index(strategy)  # ValueError for l == max_sequence_length (the script's crash)
        mixture[strategy_index] += b[l - 1]
    b = histogram - A @ mixture
    padding = np.where(b < 0, -b, 0)
    b = histogram + padding - A @ mixture
    assert b.sum() == 0
    mixture = mixture.astype(np.int64)
    return strategy_set, mixture, padding


def generate_packing_strategy(counts: list[int], max_seq_length: int, max_seq_per_sample: int, shards_num: int,
                              seed: int) -> list[str]:
    """The shard lists' texts, with ``random.seed(seed)`` first (the script itself is unseeded)."""
    saved = random.getstate()
    rnd = random.Random(seed)  # random.seed(seed) as a generator of its own: no other thread draws in between
    try:
        strategy_set, mixture, padding = get_packing_recipe(counts, max_seq_length, max_seq_per_sample)
        per_seqlength_idxs = [list(range(n)) for n in counts]
        for seq_length, pad in enumerate(padding):
            per_seqlength_idxs[seq_length].extend([None] * int(pad))
            rnd.shuffle(per_seqlength_idxs[seq_length])
        all_strategies = [instance for idx, strategy in enumerate(strategy_set)
                          for instance in [strategy] * mixture[idx]]
        rnd.shuffle(all_strategies)
    finally:
        random.setstate(saved)
    seq_length_idx = [0] * max_seq_length
    assignments = []
    for strategy_instance in all_strategies:
        assignment = []
        for seq_length in strategy_instance:
            if per_seqlength_idxs[seq_length - 1][seq_length_idx[seq_length - 1]] is not None:
                assignment += [(seq_length, per_seqlength_idxs[seq_length - 1][seq_length_idx[seq_length - 1]])]
            seq_length_idx[seq_length - 1] += 1
        assignments.append(assignment)
    n = len(assignments)
    shard_size, reminder = n // shards_num, n % shards_num
    shards = [shard_size + 1 * (i < reminder) for i in range(shards_num)]
    texts, offset = [], 0
    for shard in shards:
        texts.append(json.dumps(assignments[offset:offset + shard]))
        offset += shard
    return texts


# -- create_packed_trainset.py ------------------------------------------------------------------------------------------
def create_packed_shard(train_sentences: dict[int, dict], shard_list_text: str, out_file: str | Path) -> None:
    assignments = json.loads(shard_list_text)
    n = len(assignments)
    f = h5py.File(out_file, "w")
    vl = h5py.vlen_dtype
    input_ids = f.create_dataset("input_ids", (n,), dtype=vl(np.dtype("int16")), compression=None)
    segment_ids = f.create_dataset("segment_ids", (n,), dtype=vl(np.dtype("int8")), compression=None)
    packed_input_len = f.create_dataset("packed_input_len", (n,), dtype=vl(np.dtype("int16")), compression=None)
    masked_lm_positions = f.create_dataset("masked_lm_positions", (n,), dtype=vl(np.dtype("int16")), compression=None)
    masked_lm_ids = f.create_dataset("masked_lm_ids", (n,), dtype=vl(np.dtype("int16")), compression=None)
    packed_masked_lm_len = f.create_dataset("packed_masked_lm_len", (n,), dtype=vl(np.dtype("int16")),
                                            compression=None)
    next_sentence_labels = f.create_dataset("next_sentence_labels", (n,), dtype=vl(np.dtype("int8")), compression=None)
    for oindex, assignment in enumerate(assignments):
        _ids, _seg, _pos, _mlm, _nsl, _plen, _pmlm = [], [], [], [], [], [], []
        offset = 0
        for seq_length, iindex in assignment:
            h = train_sentences[seq_length]
            valid_input = _sum(h["input_mask"][iindex])
            valid_lm_positions = _sum(h["masked_lm_positions"][iindex] != 0)
            _ids += list(h["input_ids"][iindex, :valid_input])
            _seg += list(h["segment_ids"][iindex, :valid_input])
            _pos += list(h["masked_lm_positions"][iindex, :valid_lm_positions] + offset)
            _mlm += list(h["masked_lm_ids"][iindex, :valid_lm_positions])
            _nsl += [h["next_sentence_labels"][iindex]]
            _plen += [valid_input]
            _pmlm += [valid_lm_positions]
            offset += valid_input
        input_ids[oindex] = _ids
        segment_ids[oindex] = _seg
        masked_lm_positions[oindex] = _pos
        masked_lm_ids[oindex] = _mlm
        next_sentence_labels[oindex] = _nsl
        packed_input_len[oindex] = _plen
        packed_masked_lm_len[oindex] = _pmlm
    f.flush()
    f.close()


def reference_pack(part_files: list[str | Path], out_dir: str | Path, max_seq_length: int = 512,
                   max_seq_per_sample: int = 3, shards_num: int = 4320, seed: int = 12345) -> list[str]:
    """All four steps on padded part files (in this order): ``out_dir/shard_list_NNNNN.lst`` and
    ``out_dir/part_NNNNN`` (v3.1 create_packed_trainset.py's names); returns the shard lists' texts."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    parts = [per_seqlength(p) for p in part_files]
    train_sentences = {length: gather(parts, length) for length in range(1, max_seq_length + 1)}
    counts = [train_sentences[length]["input_ids"].shape[0] for length in range(1, max_seq_length + 1)]
    texts = generate_packing_strategy(counts, max_seq_length, max_seq_per_sample, shards_num, seed)
    for i, text in enumerate(texts):
        (out / f"shard_list_{i:05}.lst").write_text(text)
        create_packed_shard(train_sentences, text, out / f"part_{i:05}")
    return texts
