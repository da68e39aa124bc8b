"""Habana's packed BERT training set: ``pack_pretraining_data_pytorch.py`` (HabanaAI Model-References).

Reference: HabanaAI/Model-References ``PyTorch/nlp/pretraining/bert/pack_pretraining_data_pytorch.py`` @ cf11d241
(later ``PyTorch/nlp/bert/``; the trainer ``PyTorch/nlp/bert/run_pretraining.py`` reads its files with
``--enable_packed_data_mode True``, its default). Graphcore's packing recipe (Krell et al. 2021, "Efficient
sequence packing without cross-contamination"), at most ``max_sequences_per_pack`` sequences per pack.

What the script does, and bertpipe with it:

1. **Inputs**: the regular files of ``--input_dir`` whose *name* contains ``training``, in ``os.listdir`` order
   (file-system dependent). bertpipe takes them **sorted by name** (:func:`training_files`); the script with a
   sorted listing packs exactly as bertpipe does. Each file's six padded MLPerf datasets are read; a row's
   length is ``sum(input_mask)``, its number of predictions the count of non-zero ``masked_lm_ids``.
2. **Seeds**: ``random.seed(seed + local_rank)`` and ``np.random.seed(seed + local_rank)`` (defaults 42 and -1, so
   41; ``--local_rank`` defaults to ``$LOCAL_RANK``). (The script also seeds torch, which it never draws from.)
3. **Recipe** (:func:`packing_recipe`): every non-decreasing list of at most ``max_sequences_per_pack`` lengths
   summing to ``max_sequence_length`` is a *strategy* (:func:`packing_strategies`, the script's order); up to 20
   rounds of ``scipy.optimize.nnls`` on the weighted strategy matrix, solutions rounded (``rint`` below 2, else
   ``floor``), a gradient step when a round rounds to nothing, deficits become padding "sequences"; lengths
   left over take the two-length strategy ``[l, L - l]``. Same NumPy/SciPy calls on the same arrays, so the same
   result (it depends on SciPy's NNLS and NumPy's sort: run both on one machine to compare).
4. **Assignment** (:func:`assign_packs`): per length, the list of its rows (input order) plus its padding
   slots is shuffled with Python's ``random.shuffle``, the lengths taken in the order of the dict the script
   fills (first appearance in the input, then the lengths without rows, ascending); the packs are the
   strategies' instances in ``np.random.permutation`` order; each pack pops, per length of its strategy, the
   last unused slot of that strategy's range of the shuffled list.
5. **Files**: packs are written 4,480 to a file, ``mixed_strategies_part_<i>.hdf5`` (i = 0, 1, ...), nine
   gzip-compressed datasets each (:data:`PACKED_DATASETS`; ``P`` = max_predictions_per_sequence, ``S`` =
   max_sequences_per_pack, ``L`` = max_sequence_length)::

       input_ids                (n, L)     i4  the pack's sequences' tokens, one after the other, then 0
       input_mask               (n, L)     i4  1 on the first sequence's tokens, 2 on the second's, ..., 0 after
       segment_ids              (n, L)     i1  each sequence's segment ids
       positions                (n, L)     i4  0, 1, ... restarting at each sequence (0 after the last)
       masked_lm_positions      (n, P + S) i4  masked positions within the pack (a sequence's + its start), then 0
       masked_lm_ids            (n, P + S) i4  the original token ids there, then 0
       next_sentence_positions  (n, S)     i4  where each sequence starts (its [CLS]), then 0
       next_sentence_labels     (n, S)     i1  each sequence's NSP label, then 0
       next_sentence_weights    (n, S)     i4  1 per sequence, then 0

Habana's trainer reads every regular file of its ``--input_dir`` (so the folder holds nothing else), and
``<input_dir>_metadata.json`` beside it for ``avg_seq_per_sample`` (without it: 1.2 at 128, 2.0 at 512, and a
failure at any other length).

Sources read: the script at cf11d241 (above); the trainer ``PyTorch/nlp/bert/run_pretraining.py`` @ 2be60441
(packed-mode ``pretraining_dataset``, file listing, ``read_avg_seq_per_sample``) and Habana's packed-data checker
``pytorch_packed_data_checker.py``; the metadata file's keys from Habana's MLPerf 2.1 packer
(``MLPERF2.1/Habana/benchmarks/bert/implementations/PyTorch/pack_pretraining_data_pytorch.py`` @ 236cc617,
``create_json_metadata``). The later copy of the script in ``PyTorch/nlp/bert/`` (which Habana's README says
writes that metadata file) was not readable in the sources searched: its packing is assumed unchanged.

Where bertpipe differs (each said in docs/stages.md):

* **The last, partial file.** The script keeps only whole files of 4,480 packs: the ``M mod 4480`` packs after
  the last whole file are silently dropped (with them their sequences; a set of fewer than 4,480 packs writes
  nothing). bertpipe writes them as one more, shorter file (every sequence once); ``keep_partial_last=False``
  (``--keep_partial_last=False``) gives the script's files exactly.
* A length-``L`` sequence left after the NNLS rounds: the script looks up the strategy ``[0, L]`` and crashes;
  bertpipe gives it a pack of its own. ``max_sequences_per_pack`` 1 is refused (the script then crashes on
  any shorter sequence).
* NumPy 2: the script sums int8 ``input_mask`` rows with Python's ``sum()``, which wraps at 128 under NEP 50
  (and then crashes); bertpipe sums in int64 (the script's NumPy 1 behaviour).
* Rows of length 0 or above ``L``, masked positions outside their sequence, and packs with ``P + S`` or more
  predictions (the script's assertion) are refused with one line naming the file (and row).

How bertpipe runs it (same bytes): every input's lengths are read (:func:`read_inputs`), the recipe and the
assignment made in one process (the packs written to the scratch folder as they are made; :func:`row_places`:
each row's place in them); then each input is read once more (memory-mapped where it is stored as
tfrecord-to-hdf5 writes it, the C loop of preprocessing.pack_fast copying each kept row's valid prefix once; else in
blocks), and its rows that the written packs hold, compact, sorted by their place in the packs, go to a scratch
folder beside the trainer's folder (:func:`scatter_input`, one call per input); each group of ``group_files`` files
then takes its places' rows from every input's scratch, a contiguous slice of each (:func:`_gather`),
and builds (each pack's row written once by the C loop) and writes its files (:func:`write_group`). Inputs and
groups run on ``workers`` processes.

Where the CPU goes: the gzip of the files (zlib's deflate at level 4, inside HDF5's filter; the published bytes
depend on it) is nearly all of it: 83-88 % of a real part's pack-habana besides the recipe (2026-11-27).
``compression="none"`` (``--compression none``, the ``habana-packed-raw`` target) writes the same datasets, values,
dtypes and shapes uncompressed and contiguous, which Habana's trainer reads alike (h5py), without that deflate:
not the script's bytes, and ~5.7x as many. ``dtypes="narrow"`` (``--dtypes narrow``, with ``--compression none``
the ``habana-packed-narrow`` target) stores the same values in :data:`NARROW_DTYPES` (int16 token ids and positions,
int8 sequence numbers and flags: ~3.4 kB a pack at L = 512 against ~7.3 kB): Habana's trainer casts every array to
int64 as it reads it (``input[index].astype(np.int64)``), so it builds the same tensors; a token id outside int16
(a vocabulary over 32,768 tokens) is refused, naming the file.

Memory: ~7 bytes a sequence in the main process (the lengths, 2 bytes, and predictions, 1 byte, read; the
shuffled lists, 4 bytes a slot, sorted and shuffled in place; each pack's strategy, 4 bytes a pack, kept in the
scratch while the lists are made; the packs written to the scratch as they are made, ``chunk_packs`` at a time;
then each row's place, 4 bytes): a synthetic full set (the real part's lengths and recipe x844, 156.6 M sequences,
123.6 M packs) plans in 1,187 MB peak RSS, where the whole-array plan took ~86 bytes a sequence (~13.5 GB). Plus
the largest input's compact rows (the scatter) or a group's rows and packs; scratch disk about the inputs'
unpadded size, and 12 bytes a pack for the packs' slots, while it runs; where that scratch would fill more than half
the memory available (the full set's), its big arrays are written and read back past the page cache
(``O_DIRECT``: preprocessing.packing.save_array / read_slices), as the shuffles' scratch is, and so are the packed
files, each built in memory by HDF5's core driver, written in one call and hashed from memory
(preprocessing.packing.ImageOutputs: the bytes HDF5's file driver writes). The script holds every row of the input in
Python objects.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import InputError, RecordError
from core.manifest import MANIFEST_NAME, Manifest, StageOutput, atomic_write_text
from core.pools import even_calls, run_all, shared_pool
from core.schema import H5_ERRORS, HDF5_FIELDS
from core.stage import Stage
from preprocessing import pack_fast
from preprocessing.hdf5_check import check_compact, check_padded, folder_entries
from preprocessing.hdf5_io import reading, stage_params, verify_inputs
from preprocessing.packing import (
    ImageLayout,
    ImageOutputs,
    check_strategy_space,
    distinct_argsort,
    forget_scratch_maps,
    h5_reserved,
    image_layout,
    padded_lengths,
    padded_maps,
    read_slices,
    save_segments,
    scratch_map,
    segment_item,
    segment_slices,
    stable_argsort,
    take_runs,
)
from preprocessing.packing import save_array as _save
from preprocessing.pyrandom import Shuffles
from preprocessing.scratch import use_direct

log = logging.getLogger(__name__)

STAGE_VERSION = "1"

#: Packs per output file (the script's ``num_sample_per_slice``).
PACKS_PER_FILE = 4480
#: The script's output names.
PART_NAME = "mixed_strategies_part_{}.hdf5"
PART_RE = re.compile(r"^mixed_strategies_part_(\d+)\.hdf5$")
_DEBRIS = re.compile(r"^\..+\.tmp-\d+$")  # a killed writer's temporary file (core.manifest's pattern)
#: The trainer's folder inside the DAG's stage directory (``<stage>/packed/``, ``<stage>/packed_metadata.json``).
DAG_DATA_DIR = "packed"
#: The padded datasets read, by name.
INPUT_DATASETS = HDF5_FIELDS
#: (name, dtype, width) of the packed datasets, in the script's creation order; width "L", "P+S" or "S".
PACKED_DATASETS = (
    ("input_ids", "i4", "L"),
    ("input_mask", "i4", "L"),
    ("segment_ids", "i1", "L"),
    ("positions", "i4", "L"),
    ("masked_lm_positions", "i4", "P+S"),
    ("masked_lm_ids", "i4", "P+S"),
    ("next_sentence_positions", "i4", "S"),
    ("next_sentence_labels", "i1", "S"),
    ("next_sentence_weights", "i4", "S"),
)
#: ``dtypes="narrow"`` (the ``habana-packed-narrow`` target): each dataset in the narrowest integer type its values
#: take (token ids below 2**15, positions below L, sequence numbers and 0/1 flags): the same values. Habana's
#: trainer casts every array to int64 as it reads it, so it gets the same tensors from ~46 % of the bytes.
NARROW_DTYPES = {"input_ids": "i2", "input_mask": "i1", "segment_ids": "i1", "positions": "i2",
                 "masked_lm_positions": "i2", "masked_lm_ids": "i2", "next_sentence_positions": "i2",
                 "next_sentence_labels": "i1", "next_sentence_weights": "i1"}
#: The recipe's constants (the script's): NNLS rounds at most, stop below this many sequences left, the
#: lengths up to ``_CUTOFF`` weigh less.
_ROUNDS, _ENOUGH, _CUTOFF = 20, 100, 8


@dataclass(frozen=True, kw_only=True)
class HabanaPackConfig:
    """The script's flags (its defaults), plus bertpipe's own."""

    max_sequence_length: int = 512
    max_predictions_per_sequence: int = 80
    max_sequences_per_pack: int = 3
    seed: int = 42
    local_rank: int = -1  # the script's default is $LOCAL_RANK, else -1 (the CLI reads it; the DAG does not)
    keep_partial_last: bool = True  # False: drop the packs after the last whole file, as the script does
    chunk_rows: int = 8 * PACKS_PER_FILE  # input rows read at once where an input is not mapped; speed only
    #: files one call writes (a group: its places' rows gathered from every input's scratch at once); speed and
    #: memory only. Each group reads a slice of each input's scratch files: at full size 500 inputs a group, so
    #: groups of 8 files (3,500 of them) cost ~0.2 CPU-s a group in that alone (~0.2 core-hours); 64 files, ~430
    #: groups of ~0.36 M rows (~0.3 GB of token ids read at once)
    group_files: int = 64
    #: "gzip": the script's files (every dataset gzip level 4, zlib's deflate: the bytes depend on it); "none": the
    #: same datasets, values, dtypes and shapes stored uncompressed (contiguous), which Habana's trainer reads alike
    #: (h5py decompresses transparently) for none of the deflate's CPU, at ~5.7x the bytes on the real set
    compression: str = "gzip"
    #: "script": the script's dtypes (int32 but for the two i1 datasets); "narrow": :data:`NARROW_DTYPES`, the same
    #: values in half the bytes or less (not the script's files; its trainer builds the same tensors from them)
    dtypes: str = "script"

    @property
    def rng_seed(self) -> int:
        return self.seed + self.local_rank


#: ``--compression`` choices: the script's gzip, or none (the trainer-equivalent files without the deflate).
COMPRESSIONS = ("gzip", "none")
#: ``--dtypes`` choices: the script's, or each dataset's narrowest type (:data:`NARROW_DTYPES`).
DTYPES = ("script", "narrow")


def dataset_dtypes(cfg: HabanaPackConfig) -> dict[str, np.dtype]:
    """Each packed dataset's stored dtype, in the script's creation order."""
    narrow = cfg.dtypes == "narrow"
    return {name: np.dtype(NARROW_DTYPES[name] if narrow else dt) for name, dt, _ in PACKED_DATASETS}


def key_params(cfg: HabanaPackConfig) -> dict[str, Any]:
    """The stage's parameters (manifest and cache key): ``compression`` only when it is not the script's gzip, so
    the gzip set keeps the key and manifest it had before the choice existed."""
    params = stage_params(cfg)
    if params.get("compression") == "gzip":
        del params["compression"]
    if params.get("dtypes") == "script":
        del params["dtypes"]
    return params


def check_config(cfg: HabanaPackConfig) -> None:
    """Refuse settings the script cannot run with, naming the flag."""
    if cfg.compression not in COMPRESSIONS:
        raise InputError(f"--compression must be one of {', '.join(COMPRESSIONS)}, got {cfg.compression!r}")
    if cfg.dtypes not in DTYPES:
        raise InputError(f"--dtypes must be one of {', '.join(DTYPES)}, got {cfg.dtypes!r}")
    if cfg.dtypes == "narrow" and (cfg.max_sequence_length > 2 ** 15 or cfg.max_sequences_per_pack > 127):
        raise InputError(f"--dtypes narrow stores positions as int16 and sequence numbers as int8: it takes "
                         f"--max_sequence_length up to {2 ** 15} and --max_sequences_per_pack up to 127 (got "
                         f"{cfg.max_sequence_length}, {cfg.max_sequences_per_pack}); use --dtypes script")
    if cfg.max_sequence_length < 2:
        raise InputError(f"--max_sequence_length must be at least 2, got {cfg.max_sequence_length}")
    if cfg.max_sequences_per_pack < 2:
        raise InputError(f"--max_sequences_per_pack must be at least 2, got {cfg.max_sequences_per_pack} (1 means "
                         "no packing; Habana's script then fails on any sequence shorter than max_sequence_length)")
    check_strategy_space(cfg.max_sequence_length, cfg.max_sequences_per_pack,  # grows as length^(k-1)
                         ("--max_sequences_per_pack", "--max_sequence_length"))
    if cfg.max_predictions_per_sequence < 1:
        raise InputError(f"--max_predictions_per_sequence must be at least 1, got {cfg.max_predictions_per_sequence}")
    if not 0 <= cfg.rng_seed < 2 ** 32:
        raise InputError(f"--seed + --local_rank = {cfg.rng_seed}: NumPy's seed must be 0..2**32-1 (the script "
                         "calls np.random.seed with it)")


def training_files(input_dir: Path | str) -> list[Path]:
    """The script's inputs, sorted: the entries of ``input_dir`` whose name holds "training", each a plain file (or
    a link to one): a folder, a FIFO or a broken link of such a name is refused in one line, not skipped."""
    return folder_entries(input_dir, lambda n: "training" in n)


# -- 1. reading the inputs ---------------------------------------------------------------------------------------
@dataclass
class Inputs:
    """Every input row's length and number of predictions, in input order (files in order, rows in order)."""

    files: list[str]
    starts: np.ndarray  # int64 (n_files + 1,): global index of each file's first row
    seq: np.ndarray  # sum(input_mask): uint16 (max_sequence_length < 65,536)
    pred: np.ndarray  # count of non-zero masked_lm_ids: uint8 when every count is below 256, else uint16


def _check_file(f: Any, path: Path) -> int:
    import h5py

    n = None
    for name in INPUT_DATASETS:
        ds = f.get(name)
        if not isinstance(ds, h5py.Dataset):
            raise InputError(f"{path} has no dataset {name!r}; Habana's packer reads padded MLPerf HDF5 with "
                             f"{', '.join(INPUT_DATASETS)}")
        two_d = name != "next_sentence_labels"
        ok = (len(ds.shape) == 2 if two_d else len(ds.shape) == 1 or (len(ds.shape) == 2 and ds.shape[1] == 1))
        if not ok or ds.dtype.kind not in "iu" or (n is not None and ds.shape[0] != n):
            raise InputError(f"{path}: dataset {name!r} has shape {ds.shape} and dtype {ds.dtype}; expected "
                             f"{'(N, width)' if two_d else '(N,)'} integers with the same N as input_ids")
        n = ds.shape[0]
    for a, b in (("input_mask", "input_ids"), ("segment_ids", "input_ids"),
                 ("masked_lm_ids", "masked_lm_positions")):
        if f[a].shape != f[b].shape:
            raise InputError(f"{path}: {a} has shape {f[a].shape} but {b} {f[b].shape}; the file is not padded MLPerf "
                             "HDF5")
    return int(n or 0)


@contextmanager
def _open(path: Path) -> Iterator[Any]:
    import h5py

    try:
        f = h5py.File(path, "r")
    except FileNotFoundError:
        raise InputError(f"HDF5 file {path} does not exist") from None
    except H5_ERRORS as exc:
        raise InputError(f"{path} is not a readable HDF5 file ({exc}); Habana's packer reads the padded HDF5 of "
                         "tfrecord-to-hdf5") from None
    try:
        yield f
    finally:
        f.close()


def _len_dtype(top: int) -> np.dtype:
    """The narrowest unsigned type holding 0..``top`` (int64 past 65,535)."""
    return np.dtype(np.uint8 if top < 2 ** 8 else np.uint16 if top < 2 ** 16 else np.int64)


def read_lengths(path: Path | str, cfg: HabanaPackConfig) -> tuple[np.ndarray, np.ndarray]:
    """(lengths, predictions) of every row of one input, checked (lengths 1..L, masked positions inside): uint16
    lengths (L < 65,536) and predictions of at most 255 (else uint16) a row, so 3 bytes a row."""
    path = Path(path)
    L = cfg.max_sequence_length
    with _open(path) as f:
        with reading(path, "its datasets"):
            n = _check_file(f, path)
        seq = np.empty(n, dtype=_len_dtype(L))  # 2 bytes a row (lengths 1..L, checked below)
        pred = np.empty(n, dtype=_len_dtype(f["masked_lm_ids"].shape[1]))
        step = max(1, cfg.chunk_rows)
        names = ("input_mask", "masked_lm_positions", "masked_lm_ids")
        maps = padded_maps(f, path, names) if n else None  # read in place where the file allows it
        for a in range(0, n, step):
            b = min(n, a + step)
            with reading(path, f"rows {a}..{b - 1}"):
                mask, pos, ids = (maps[k][a:b] if maps else f[k][a:b] for k in names)
            counted = pack_fast.padded_counts(mask, pos, ids)  # one pass: lengths, predictions, the rows' rules
            if counted is not None and counted[2] < 0:
                s, p, given = counted[0], counted[1], None
            else:  # a row breaks a rule (found below, in its words), or types the C loop does not take
                s, wrong = given = pack_fast.mask_lengths(mask)  # the lengths of well-formed masks
                p = None
                if wrong >= 0:
                    s = mask.sum(axis=1, dtype=np.int64)  # int64: Python's sum() of the row under NumPy 1
            bad = np.flatnonzero((s < 1) | (s > min(L, mask.shape[1])))
            if bad.size:
                r = int(bad[0])
                more = (f"; raise --max_sequence_length (it is {L})" if s[r] > L and s[r] <= mask.shape[1]
                        else ": the file is corrupt, re-create it")
                raise RecordError(f"{path}: row {a + r} has sequence length {int(s[r])} (sum of input_mask); "
                                  f"Habana's packer needs 1..{L}{more}")
            if p is None:
                padded_lengths(path, a, {"input_mask": mask, "masked_lm_positions": pos, "masked_lm_ids": ids}, given)
                p = np.count_nonzero(ids, axis=1)
            seq[a:b] = s
            pred[a:b] = p
    return seq, pred


def read_inputs(input_files: Sequence[Path | str], cfg: HabanaPackConfig, workers: int = 1) -> Inputs:
    """Every input's lengths and predictions (:func:`read_lengths`), the files on ``workers`` processes."""
    files = [str(p) for p in input_files]
    got = run_all(read_lengths, [(p, cfg) for p in files], min(workers, len(files)))
    counts = np.array([len(s) for s, _ in got], dtype=np.int64)
    if not counts.sum():
        raise InputError(f"pack-habana: the {len(files)} input file(s) hold no rows")
    starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
    # one array each, filled as each file's pieces are let go (no concatenation beside them)
    seq = np.empty(int(starts[-1]), np.result_type(*(s.dtype for s, _ in got)))
    top = max(int(q.max()) if len(q) else 0 for _, q in got)
    pred = np.empty(int(starts[-1]), _len_dtype(top) if top < 2 ** 16 else np.result_type(*(q.dtype for _, q in got)))
    for k in range(len(got)):
        s, q = got[k]
        got[k] = None
        seq[starts[k]:starts[k + 1]] = s
        pred[starts[k]:starts[k + 1]] = q
    return Inputs(files, starts, seq, pred)


# -- 2. the recipe -------------------------------------------------------------------------------------------------
def packing_strategies(target: int, depth: int) -> list[tuple[int, ...]]:
    """Every non-decreasing tuple of 1..``depth`` positive lengths summing to ``target``, in the script's order:
    by first length; for one first length, the longer tuples (by their next length) before the one that ends
    there; ``(target,)`` last."""
    out: list[tuple[int, ...]] = []

    def walk(prefix: tuple[int, ...], rest: int, low: int, left: int) -> None:
        if left == 1:
            if rest >= low:
                out.append(prefix + (rest,))
            return
        for new in range(low, rest + 1):
            if new == rest:
                out.append(prefix + (new,))
            else:
                walk(prefix + (new,), rest - new, new, left - 1)

    walk((), target, 1, depth)
    return out


@dataclass
class Recipe:
    """How many packs of each strategy (``mixture``) and how many padding slots of each length (``padding``)."""

    strategies: list[tuple[int, ...]]
    mixture: np.ndarray  # int64 (n_strategies,)
    padding: np.ndarray  # int64 (L,): padding slots of length l at index l - 1
    stats: dict[str, Any] = field(default_factory=dict)
    rounds: list[str] = field(default_factory=list)  # per round: "nnls", or "gradient" (all rounded to 0)
    leftover: list[int] = field(default_factory=list)  # lengths given [l, L - l] (or [L]) after the rounds


def strategy_matrix(strategies: Sequence[tuple[int, ...]], length: int) -> np.ndarray:
    """``A[l - 1, s]`` = how often length l occurs in strategy s (int32, as the script builds it)."""
    a = np.zeros((length, len(strategies)), dtype=np.int32)
    for s, strat in enumerate(strategies):
        for seq_len in strat:
            a[seq_len - 1, s] += 1
    return a


def packing_recipe(lengths: np.ndarray, length: int, depth: int) -> Recipe:
    """The script's ``get_packing_recipe``: the same arithmetic, in the same dtypes, with the same SciPy/NumPy
    calls (``optimize.nnls``, ``np.argsort``), so the same mixture and padding."""
    try:
        from scipy import optimize
    except ImportError:
        raise InputError("pack-habana needs SciPy (scipy.optimize.nnls, the packing recipe's solver): "
                         "pip install scipy") from None
    lengths = np.asarray(lengths)
    if len(lengths) and (int(lengths.min()) < 1 or int(lengths.max()) > length):  # pragma: no cover - read_lengths
        raise InputError(f"pack-habana: a sequence length outside 1..{length} (internal error)")
    # np.histogram(lengths, bins=np.arange(1, length + 2)) of lengths 1..L, in pieces (no int64 copy of them)
    histogram = np.zeros(length + 1, np.int64)
    for a in range(0, len(lengths), _PIECE):
        histogram += np.bincount(lengths[a:a + _PIECE], minlength=length + 1)
    histogram = histogram[1:]
    strategies = packing_strategies(length, depth)
    a = strategy_matrix(strategies, length)
    w0 = np.ones([length])
    w0[:_CUTOFF] = _CUTOFF / (2 * length)
    w0 = np.sqrt(w0)
    weighted = np.expand_dims(w0, -1) * a
    padding: np.ndarray = np.zeros([length], dtype=np.int32)
    mixture: np.ndarray = np.zeros([len(strategies)], dtype=np.int32)
    b = histogram + padding
    rounds: list[str] = []
    for rnd in range(_ROUNDS):
        part, _ = optimize.nnls(weighted, w0 * b)
        part = np.where(part < 2, np.rint(part), np.floor(part))
        rounds.append("nnls")
        if part.max() == 0:  # everything rounded away (small sets): one pack of each of the best strategies
            grad = a.T @ (b * np.arange(1, length + 1))
            part[np.argsort(-grad)[:int(b.sum() // 2) + 1]] += 1
            rounds[-1] = "gradient"
        mixture = mixture + part
        residual = b - a @ part
        padding = padding + np.where(residual < 0, -residual, 0)
        b = histogram + padding - a @ mixture
        log.debug("recipe round %d: %d sequences left", rnd, int(b.sum()))
        if b.sum() < _ENOUGH:
            break
    index = {s: i for i, s in enumerate(strategies)}
    leftover = np.arange(1, length + 1)[b > 0].tolist()
    for seq_len in leftover:
        # the script looks up sorted([l, L - l]); for l == L that is [0, L], which it does not have (ValueError)
        pair = (length,) if seq_len == length else tuple(sorted((seq_len, length - seq_len)))
        mixture[index[pair]] += b[seq_len - 1]
    b = histogram - a @ mixture
    padding = np.where(b < 0, -b, 0)
    if (histogram + padding - a @ mixture).sum() != 0:  # pragma: no cover - the script's assertion
        raise InputError("pack-habana: the packing recipe does not cover every sequence (internal error)")
    stats = _recipe_stats(a, mixture, padding, lengths, length)
    mix = mixture.astype(np.int64)
    pad = padding.astype(np.int64)
    if not (np.array_equal(mix, mixture) and np.array_equal(pad, padding)):  # pragma: no cover
        raise InputError("pack-habana: the packing recipe is not integral (internal error)")
    return Recipe(strategies, mix, pad, stats, rounds, leftover)


#: Rows taken at once where the whole set's lengths are gone over (the recipe's histogram and figures).
_PIECE = 1 << 20


def _pairwise_sum(values: Any, a: int, n: int, leaf: int = _PIECE) -> np.float64:
    """NumPy's sum of a float64 array (its pairwise summation: halves split at a multiple of 8, blocks of at most
    128 summed by NumPy itself) of ``values(i, j)``, items ``a .. a + n - 1``, made ``leaf`` items at a time: the
    same float as ``values(a, a + n).sum()`` (so ``mean()``) without the whole array."""
    if n <= leaf:
        return np.add.reduce(values(a, a + n), initial=0.0)
    half = n // 2
    half -= half % 8
    return _pairwise_sum(values, a, half, leaf) + _pairwise_sum(values, a + half, n - half, leaf)


def _recipe_stats(a: np.ndarray, mixture: np.ndarray, padding: np.ndarray, lengths: np.ndarray,
                  length: int) -> dict[str, Any]:
    """The figures the script prints (and Habana's later packers write to ``<output_dir>_metadata.json``)."""
    new = int(mixture.sum())
    original = len(lengths)
    compression = 1 - new / original
    pad_tokens = (np.arange(1, length + 1) * padding).sum()
    return {
        "number_of_sequences_dropped": 0,
        "number_of_strategies_utilized": int(np.count_nonzero(mixture)),
        "new_number_of_samples": new,
        "original_number_of_samples": original,
        "compression_ratio": compression,
        "expected_speed_up": 1 / (1 - compression),
        "theoretical_speed_up": float(1.0 / (1 - _pairwise_sum(
            lambda i, j: 1 - lengths[i:j].astype(np.int64) / length, 0, original) / original)),
        "avg_seq_per_sample": float(((a.sum(0) * mixture).sum() - padding.sum()) / new),
        "padding_tokens_packed_dataset": float(pad_tokens),
        "padding_tokens_original_dataset": int(sum(int((length - lengths[i:i + _PIECE].astype(np.int64)).sum())
                                                   for i in range(0, original, _PIECE))),
        "packing_efficiency": float((new * length - pad_tokens) / (new * length)),
        "top_8_strategies": np.argsort(-mixture)[:8].tolist(),
    }


# -- 3. the assignment ---------------------------------------------------------------------------------------------
def shuffled_lists(seq: np.ndarray, padding: np.ndarray, cfg: HabanaPackConfig,
                   shuffles: Shuffles, piece: int = _PIECE) -> tuple[np.ndarray, np.ndarray]:
    """(flat, base): per length l, its rows (input order) then its padding slots (-1), shuffled as the script
    shuffles ``examples_by_length[l]``, at ``flat[base[l]:base[l + 1]]``. ``shuffles``: the successive
    ``random.shuffle`` permutations of the script's generator (pyrandom: the same draws, vectorized). Made in place
    (4 bytes a slot): the rows sorted into their lengths' ranges ``piece`` rows at a time, each range shuffled where
    it lies (:meth:`Shuffles.shuffle`)."""
    length = cfg.max_sequence_length
    n = len(seq)
    hist = np.zeros(length + 1, np.int64)
    first = np.full(length + 1, n, np.int64)  # each length's first row
    for a in range(0, n, piece):
        part = seq[a:a + piece]
        hist += np.bincount(part, minlength=length + 1)
        got, at = np.unique(part, return_index=True)
        first[got] = np.minimum(first[got], at + a)
    total = hist.copy()
    total[1:] += padding
    base = np.concatenate([[0], np.cumsum(total)]).astype(np.int64)
    dtype = np.int32 if n < 2 ** 31 else np.int64
    flat = np.empty(int(base[-1]), dtype=dtype)
    free = base[:-1].copy()  # the next place of each length's rows
    for a in range(0, n, piece):  # a stable counting sort: each length's rows in input order
        part = seq[a:a + piece]
        order = np.argsort(part, kind="stable")
        v = part[order]
        flat[free[v] + np.arange(len(v)) - np.searchsorted(v, v, side="left")] = order + a
        free += np.bincount(part, minlength=length + 1)
        del order, v
    for v in range(1, length + 1):
        flat[free[v]:base[v + 1]] = -1  # its padding slots, after its rows
    present = np.flatnonzero(hist[1:]) + 1
    keys = present[np.argsort(first[present], kind="stable")].tolist() + [v for v in range(1, length + 1)
                                                                          if hist[v] == 0]
    for v in keys:  # the dict's insertion order: first appearance, then the lengths without rows
        if base[v + 1] - base[v] > 1:  # (a list of 0 or 1 items draws nothing)
            shuffles.shuffle(flat[base[v]:base[v + 1]])
    return flat, base


class _Rows:
    """A 2-D array written front to back in blocks of rows: in memory, or (``path``) straight into a ``.npy``
    file (the whole set's packs are never held)."""

    def __init__(self, n: int, width: int, dtype: Any, path: Path | None) -> None:
        from preprocessing.hdf5_io import tmp_path

        self.shape, self.dtype, self.path, self.at = (n, width), np.dtype(dtype), path, 0
        if path is None:
            self.arr = np.empty(self.shape, self.dtype)
            return
        self.tmp = tmp_path(path)
        self.fh = open(self.tmp, "wb")  # noqa: SIM115 - closed by done()
        np.lib.format.write_array_header_1_0(self.fh, {"descr": np.lib.format.dtype_to_descr(self.dtype),
                                                       "fortran_order": False, "shape": self.shape})

    def put(self, block: np.ndarray) -> None:
        b = np.ascontiguousarray(block, dtype=self.dtype)
        if self.path is None:
            self.arr[self.at:self.at + len(b)] = b
        else:
            try:
                self.fh.write(b.data)
            except BaseException as exc:
                from core.manifest import raise_if_disk_full

                self.fh.close()
                self.tmp.unlink(missing_ok=True)
                raise_if_disk_full(exc, self.path)
                raise
        self.at += len(b)

    def done(self) -> np.ndarray:
        """The whole array (a read-only memory map of the file, renamed into place)."""
        if self.at != self.shape[0]:  # pragma: no cover
            raise InputError(f"pack-habana: {self.at} of {self.shape[0]} packs assigned (internal error)")
        if self.path is None:
            return self.arr
        self.fh.close()
        os.replace(self.tmp, self.path)
        return _load(self.path)


def row_blocks(arr: np.ndarray, a: int, b: int, step: int) -> Iterator[np.ndarray]:
    """Rows ``a .. b - 1`` of ``arr`` in blocks of ``step``: slices of an array in memory; of a memory-mapped
    ``.npy`` file, each block read from the file (its pages not mapped into this process)."""
    step = max(1, step)
    if not isinstance(arr, np.memmap):
        for c in range(a, b, step):
            yield arr[c:min(b, c + step)]
        return
    row = arr.dtype.itemsize * int(np.prod(arr.shape[1:], dtype=np.int64))
    with open(arr.filename, "rb") as f:
        for c in range(a, b, step):
            k = min(b, c + step) - c
            f.seek(arr.offset + c * row)
            got = np.fromfile(f, dtype=arr.dtype, count=k * row // arr.dtype.itemsize)
            yield got.reshape((k,) + arr.shape[1:])


def assign_packs(seq: np.ndarray, recipe: Recipe, cfg: HabanaPackConfig, chunk_packs: int = 1 << 18,
                 out: Path | None = None) -> np.ndarray:
    """``(n_packs, max_sequences_per_pack)``: each pack's slots in strategy order, a global row id or -1 for a
    padding slot; packs in the order the script writes them.

    Made ``chunk_packs`` packs at a time; ``out``: a file (``.npy``) the packs are written to as they are made,
    returned memory-mapped (the whole set's ~124 M packs are never held: the plan's memory is the shuffled slots,
    4 bytes each, and each pack's strategy, 4 bytes, besides the lengths). The same array either way."""
    depth = cfg.max_sequences_per_pack
    mixture = recipe.mixture
    n_strat = len(recipe.strategies)
    packs = int(mixture.sum())
    # np.random.seed(...); np.random.permutation(packs): RandomState's shuffle of arange(packs), whose swaps do not
    # depend on the item type, so the same values in 4 bytes; then each pack's strategy in place: the one holding
    # that position of the strategies' instances in strategy order (np.repeat(arange, mixture)[order])
    strat = np.arange(packs, dtype=np.int32 if packs < 2 ** 31 else np.int64)
    np.random.RandomState(cfg.rng_seed).shuffle(strat)
    ends = np.cumsum(mixture)
    step = max(1, chunk_packs)
    for c in range(0, packs, step):
        strat[c:c + step] = np.searchsorted(ends, strat[c:c + step], side="right")
    strat_file = None if out is None else Path(out).with_name(f"{Path(out).stem}_strategies.npy")
    if strat_file is not None:  # read back piece by piece below: not held beside the shuffled slots
        _save(strat_file, strat)
        strat = _load(strat_file)
    # random.seed(seed + local_rank), then random.shuffle of each length's list: the same draws
    flat, base = shuffled_lists(seq, recipe.padding, cfg, Shuffles(cfg.rng_seed))
    # per strategy and slot: the length, how often it occurs in the strategy (c) and which occurrence (u)
    lens = np.zeros((n_strat, depth), dtype=np.int64)
    for s, st in enumerate(recipe.strategies):
        lens[s, :len(st)] = st
    occ = np.zeros_like(lens)
    cnt = np.zeros_like(lens)
    for k in range(depth):
        same = lens[:, :k] == lens[:, k:k + 1]
        occ[:, k] = same.sum(axis=1)
        cnt[:, k] = (lens == lens[:, k:k + 1]).sum(axis=1)
    # the first slot of each strategy's range in length l's list: packs of the strategies before it, times c
    first_k = (occ == 0) & (lens > 0)
    s_idx, k_idx = np.nonzero(first_k)
    ls = lens[s_idx, k_idx]
    use = cnt[s_idx, k_idx] * mixture[s_idx]
    o = np.lexsort((s_idx, ls))  # by length, then strategy
    csum = np.cumsum(use[o])
    grp = np.searchsorted(ls[o], ls[o], side="left")
    excl = csum - use[o]
    start = np.empty_like(excl)
    start[o] = excl - excl[grp]
    offset = np.zeros_like(lens)
    offset[s_idx, k_idx] = start
    for k in range(depth):  # the later occurrences of a length share the first one's range
        same_first = np.argmax(lens == lens[:, k:k + 1], axis=1)
        offset[:, k] = offset[np.arange(n_strat), same_first]
    rows = _Rows(packs, depth, flat.dtype, None if out is None else Path(out))
    seen = np.zeros(n_strat, np.int64)  # packs of each strategy in the pieces before
    for st in row_blocks(strat, 0, packs, step):
        st = st.astype(np.int64)
        # rank: the pack is the t-th of its strategy in output order
        by = stable_argsort(st)
        sst = st[by]
        rank = np.empty(len(st), dtype=np.int64)
        rank[by] = seen[sst] + np.arange(len(st)) - np.searchsorted(sst, sst, side="left")
        seen += np.bincount(st, minlength=n_strat)
        del by, sst
        block = np.full((len(st), depth), -1, dtype=flat.dtype)
        r = mixture[st]
        for k in range(depth):
            v = lens[st, k]
            has = v > 0
            # the script pops the slot ranges back to front: the t-th pack takes c * (r - t) - 1 - u
            elem = offset[st, k] + cnt[st, k] * (r - rank) - 1 - occ[st, k]
            block[has, k] = flat[base[v[has]] + elem[has]]
        rows.put(block)
    if not np.array_equal(seen, mixture):  # pragma: no cover
        raise InputError("pack-habana: the packs do not follow the recipe's mixture (internal error)")
    del flat, strat
    if strat_file is not None:
        strat_file.unlink()
    return rows.done()


@dataclass
class Places:
    """Where each input row goes: its place among the written packs' real slots (row-major), or -1."""

    place: np.ndarray  # per row, int32 (int64 past 2**31 rows)
    file_first: np.ndarray  # int64 (files + 1,): the first place of each output file, then the total
    dropped_sequences: int  # real slots of the packs not written
    empty_packs: int  # written packs of padding slots only


def row_places(slots: np.ndarray, n_rows: int, bounds: list[tuple[int, int]], chunk_packs: int = 1 << 18) -> Places:
    """:class:`Places` of the packs ``slots`` written in files ``bounds``: ``slots`` read ``chunk_packs`` packs at a
    time (from its file when memory-mapped), the places ``n_rows`` values of 4 bytes."""
    written = bounds[-1][1] if bounds else 0
    place = np.full(n_rows, -1, dtype=np.int32 if n_rows < 2 ** 31 else np.int64)
    starts = np.array([a for a, _ in bounds] + [written], dtype=np.int64)
    file_first = np.zeros(len(starts), np.int64)
    q = empty = 0
    step = max(1, chunk_packs)
    for c, block in zip(range(0, written, step), row_blocks(slots, 0, written, step), strict=True):
        real = block >= 0
        per = real.sum(axis=1)
        ids = block[real]
        place[ids] = np.arange(q, q + len(ids), dtype=place.dtype)
        empty += int(np.count_nonzero(per == 0))
        here = (starts >= c) & (starts < c + len(block))  # files that start in this block
        file_first[here] = q + np.concatenate([[0], np.cumsum(per)])[starts[here] - c]
        q += len(ids)
    file_first[-1] = q
    dropped = sum(int(np.count_nonzero(b >= 0)) for b in row_blocks(slots, written, len(slots), step))
    return Places(place, file_first, dropped, empty)


# -- 4. the files ------------------------------------------------------------------------------------------------
def pack_files(packs: int, cfg: HabanaPackConfig) -> list[tuple[int, int]]:
    """(first pack, end) of each output file; the partial last one only with ``keep_partial_last``."""
    whole = packs // PACKS_PER_FILE
    bounds = [(i * PACKS_PER_FILE, (i + 1) * PACKS_PER_FILE) for i in range(whole)]
    if cfg.keep_partial_last and packs % PACKS_PER_FILE:
        bounds.append((whole * PACKS_PER_FILE, packs))
    return bounds


_ROW_DATASETS = ("input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels")
#: The scratch folder, beside the trainer's folder while the stage runs (removed at the end and at the next start).
SCRATCH_SUFFIX = ".pack_habana_scratch"
#: What the scatter keeps of each input, sorted by place: places, cumulative tokens and masked positions (from 0),
#: labels, and the rows' tokens, segment ids, masked positions and ids back to back.
_SCRATCH = ("keys", "tok", "prd", "nsl", "ids", "seg", "pos", "mlm")


def scratch_dir(data: Path) -> Path:
    """The scratch folder of the trainer's folder ``data``: a hidden folder beside it."""
    real = Path(data).resolve()
    return real.parent / f".{real.name}{SCRATCH_SUFFIX}"


def _load(path: Path) -> np.ndarray:
    return scratch_map(path)


def check_narrow_scratch(scratch: Path, files: Sequence[str]) -> None:
    """``dtypes="narrow"``: refuse, before any packed file is written, an input whose token ids do not fit int16
    (the scatter keeps an input's ids in 2 bytes where every one fits), naming the file."""
    for k, path in enumerate(files):
        for short, name in (("ids", "input_ids"), ("mlm", "masked_lm_ids")):
            v = _load(scratch / f"in_{k:05d}_{short}.npy")
            if v.dtype.itemsize > 2 and v.size:
                lo, hi = int(v.min()), int(v.max())
                if lo < -2 ** 15 or hi >= 2 ** 15:
                    raise InputError(f"{path}: its rows hold {name} values from {lo} to {hi}, and --dtypes narrow "
                                     "stores token ids as int16 (-32768..32767: a vocabulary of at most 32,768 "
                                     "tokens); use --dtypes script (the habana-packed-raw target)")


def scatter_input(k: int, path: str, keys: np.ndarray, seq: np.ndarray, pred: np.ndarray, scratch: str,
                  chunk: int, direct: bool = False) -> int:
    """Input ``k``'s rows that the written packs hold (``keys``: each row's place, row-major over the packs' real
    slots, or -1), compact (a row's first ``seq`` tokens and ``pred`` masked positions), sorted by place, into
    ``scratch``: the input is read once (a padded file stored as tfrecord-to-hdf5 writes it: memory-mapped, the
    kept rows read in the file's order and each row's valid prefix written once to its place by the C loop,
    pack_fast.place_runs; else in blocks of ``chunk`` rows). ``direct``: the compact values (the big arrays) saved
    past the page cache (:func:`save_array`; the groups read them with :func:`read_slices`). Segment ids that are
    0s then 1s (a BERT instance's) are kept as one number a row (preprocessing.packing.save_segments). Returns
    the rows kept."""
    p, sd = Path(path), Path(scratch)
    n = len(keys)
    parts: dict[str, list[np.ndarray]] = {name: [] for name in _ROW_DATASETS}
    with _open(p) as f:
        dsets = {name: f[name] for name in _ROW_DATASETS}
        if dsets["input_ids"].shape[0] != n:
            raise InputError(f"{p} changed while pack-habana ran ({dsets['input_ids'].shape[0]} rows, {n} read "
                             "first); run again")
        maps = padded_maps(f, p, _ROW_DATASETS) if pack_fast.available() and n else None
        if maps is not None:
            key, s, q, nsl, arrays = _scatter_mapped(p, maps, keys, seq, pred)
            _save(sd / f"in_{k:05d}_keys.npy", key)
            _save(sd / f"in_{k:05d}_tok.npy", np.concatenate([[0], np.cumsum(s)]))
            _save(sd / f"in_{k:05d}_prd.npy", np.concatenate([[0], np.cumsum(q)]))
            _save(sd / f"in_{k:05d}_nsl.npy", nsl)
            for short in ("ids", "pos", "mlm"):
                _save(sd / f"in_{k:05d}_{short}.npy", arrays[short], direct=direct)
            save_segments(sd, f"in_{k:05d}", arrays["seg"], arrays["segb"], direct)
            return int(len(key))
        dtypes = {name: ds.dtype for name, ds in dsets.items()}
        for a in range(0, n, max(1, chunk)):
            b = min(n, a + max(1, chunk))
            use = keys[a:b] >= 0
            if not use.any():
                continue
            with reading(p, f"rows {a}..{b - 1}"):
                d = {name: ds[a:b] for name, ds in dsets.items()}
            d["next_sentence_labels"] = d["next_sentence_labels"].reshape(b - a)
            check_padded(p, a, {"input_ids": d["input_ids"], "segment_ids": d["segment_ids"],
                                "next_sentence_labels": d["next_sentence_labels"]})
            if not use.all():
                d = {name: v[use] for name, v in d.items()}
            s, q = seq[a:b][use], pred[a:b][use]
            valid = np.arange(d["input_ids"].shape[1]) < s[:, None]
            pvalid = np.arange(d["masked_lm_positions"].shape[1]) < q[:, None]
            for name in ("input_ids", "segment_ids"):
                parts[name].append(d[name][valid])
            for name in ("masked_lm_positions", "masked_lm_ids"):
                parts[name].append(d[name][pvalid])
            parts["next_sentence_labels"].append(d["next_sentence_labels"])
    comp = {name: np.concatenate(v) if v else np.zeros(0, dtypes[name]) for name, v in parts.items()}
    del parts
    for name, v in comp.items():  # 2-byte values where they fit (a 30,522-token vocabulary): the same values
        if v.dtype.itemsize > 2 and v.size and -2**15 <= int(v.min()) and int(v.max()) < 2**15:
            comp[name] = v.astype(np.int16)
    kept = keys >= 0
    key, s, q = keys[kept], seq[kept].astype(np.int64), pred[kept].astype(np.int64)
    order = distinct_argsort(key)  # places: each held once
    _save(sd / f"in_{k:05d}_keys.npy", key[order])
    _save(sd / f"in_{k:05d}_tok.npy", np.concatenate([[0], np.cumsum(s[order])]))
    _save(sd / f"in_{k:05d}_prd.npy", np.concatenate([[0], np.cumsum(q[order])]))
    _save(sd / f"in_{k:05d}_nsl.npy", comp.pop("next_sentence_labels")[order])
    for lens, names in ((s, (("ids", "input_ids"), ("seg", "segment_ids"))),
                        (q, (("pos", "masked_lm_positions"), ("mlm", "masked_lm_ids")))):
        for (short, _), arr in zip(names, take_runs([comp.pop(name) for _, name in names], lens, order), strict=True):
            if short == "seg":
                save_segments(sd, f"in_{k:05d}", arr, None, direct)
            else:
                _save(sd / f"in_{k:05d}_{short}.npy", arr, direct=direct)
    return int(len(key))


def _scatter_planned(k: int, path: str, scratch: str, a: int, b: int, chunk: int, direct: bool = False) -> int:
    """:func:`scatter_input` of input ``k``, rows ``a .. b - 1`` of the set: their places, lengths and predictions
    read from the plan's files in ``scratch`` (``plan_keys``, ``plan_seq``, ``plan_pred``: mapped for this call
    only)."""
    sd = Path(scratch)
    keys, seq, pred = (np.array(_load(sd / f"plan_{name}.npy")[a:b]) for name in ("keys", "seq", "pred"))
    return scatter_input(k, path, keys, seq, pred, scratch, chunk, direct)


def _scatter_mapped(p: Path, maps: dict[str, np.ndarray], keys: np.ndarray, seq: np.ndarray,
                    pred: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict[str, np.ndarray]]:
    """:func:`scatter_input` on a padded file's memory maps: the kept rows' (sorted) places, lengths, predictions
    and labels in place order, and their compact values (``ids``, ``seg``, ``pos``, ``mlm``: 2-byte ids and 1-byte
    segments where the values fit, else the file's type; ``segb``, each row's 0s, where every row's segment ids are
    0s then 1s, and then ``seg`` None), each value copied once; checked as the compact rows the packs hold (token
    ids >= 0, segment ids and labels 0 or 1: one line naming the file's row)."""
    kept = np.flatnonzero(keys >= 0)
    order = distinct_argsort(keys[kept])  # places: each held once
    rows_at = kept[order].astype(np.int64)
    s, q = seq[rows_at].astype(np.int64), pred[rows_at].astype(np.int64)
    out: dict[str, np.ndarray] = {}
    checked = True  # token ids >= 0 and segment ids 0 or 1, checked as they are copied
    # the compact values: saved to the scratch before the worker's next call, which takes the same buffers
    space = pack_fast.process_space("pack-habana-scatter")
    # the kept rows read in the file's order, each written to its place (pack_fast.place_runs; the gather in place
    # order below where a value is out of bounds, for its refusal)
    s_file, q_file = seq[kept].astype(np.int64), pred[kept].astype(np.int64)
    dests = {}
    for what, lens in (("tok", s), ("prd", q)):
        dests[what] = np.empty(len(kept), np.int64)
        dests[what][order] = np.cumsum(lens) - lens
    m = maps["segment_ids"]
    segb = pack_fast.segment_bounds(m.reshape(-1), kept.astype(np.int64) * m.shape[1], s_file)
    out["segb"] = segb[order] if segb is not None else None  # type: ignore[assignment]
    for short, name, lens, narrow, lo, hi in (("ids", "input_ids", s, np.int16, 0, None),
                                              ("seg", "segment_ids", s, np.int8, 0, 1),
                                              ("pos", "masked_lm_positions", q, np.int16, None, None),
                                              ("mlm", "masked_lm_ids", q, np.int16, None, None)):
        m = maps[name]
        src = np.dtype(m.dtype)
        flat = m.reshape(-1)
        dt = np.dtype(narrow) if np.dtype(narrow).itemsize < src.itemsize or src.kind != "i" else src
        if short == "seg" and segb is not None:  # 0s then 1s, so 0 or 1 (check_compact's rule) each
            out["seg"] = None  # type: ignore[assignment]
            continue
        at = "tok" if short in ("ids", "seg") else "prd"
        placed = pack_fast.place_runs(flat, None, kept.astype(np.int64) * m.shape[1], s_file if at == "tok"
                                      else q_file, dests[at], dt, lo=lo, hi=hi, space=space, name=short)
        if placed is not None:
            out[short] = placed
            continue
        try:
            out[short] = pack_fast.gather_runs([flat], None, rows_at * m.shape[1], lens, dt, lo=lo, hi=hi,
                                               space=space, name=short)
            continue
        except pack_fast.OutOfRange:
            checked = checked and lo is None and hi is None
        try:
            out[short] = pack_fast.gather_runs([flat], None, rows_at * m.shape[1], lens, dt, space=space,
                                               name=short)
        except pack_fast.OutOfRange:  # wider values: kept as the file has them (a bad one is refused below)
            out[short] = pack_fast.gather_runs([flat], None, rows_at * m.shape[1], lens,
                                               src if src.kind == "i" else np.int64, space=space, name=short)
    nsl = np.asarray(maps["next_sentence_labels"]).reshape(len(keys))[rows_at]
    if checked:
        check_compact(p, 0, s, q, nsl=nsl, row_ids=rows_at)
    else:  # a value outside its bounds: the full check's one-line refusal
        seg = out["seg"] if out["seg"] is not None else pack_fast.fill_segments(out["segb"], s)
        check_compact(p, 0, s, q, ids=out["ids"], seg=seg, nsl=nsl, row_ids=rows_at)
    return keys[rows_at], s, q, nsl, out


@dataclass(frozen=True)
class RowRuns:
    """Rows' values in place order, left where the group read them (not copied into place order first): row r's
    values are ``sources[which[r]][starts[r]:starts[r] + n]`` for its length n (the caller's). build_packs copies
    each straight into its pack's row."""

    sources: tuple[np.ndarray, ...]
    which: np.ndarray  # int64, per row
    starts: np.ndarray  # int64, per row

    def __getitem__(self, rows: slice) -> RowRuns:
        return RowRuns(self.sources, self.which[rows], self.starts[rows])

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(self.sources[0].dtype)

    def values(self, lens: np.ndarray) -> np.ndarray:
        """The rows' values back to back (rows of ``lens`` values)."""
        return pack_fast.gather_runs(list(self.sources), self.which, self.starts, lens, self.dtype)


@dataclass(frozen=True)
class SegmentRuns:
    """Rows' segment ids in place order as one number a row, its 0s (then 1s to its length): build_packs writes
    each pack's row of them straight from these."""

    bounds: np.ndarray

    def __getitem__(self, rows: slice) -> SegmentRuns:
        return SegmentRuns(self.bounds[rows])

    @property
    def dtype(self) -> np.dtype:
        return np.dtype(np.int8)

    def values(self, lens: np.ndarray) -> np.ndarray:
        return pack_fast.fill_segments(self.bounds, lens)


def _gather(scratch: str, n_inputs: int, q0: int, q1: int) -> dict[str, Any]:
    """The compact rows placed at ``q0..q1-1``, in place order, from every input's sorted scratch: ``seq``,
    ``pred``, ``next_sentence_labels`` per row; ``input_ids``, ``segment_ids`` (``masked_lm_positions``,
    ``masked_lm_ids``) the rows' values back to back; with the C loop, ``input_ids`` as :class:`RowRuns` and
    ``segment_ids`` (kept as one number a row) as :class:`SegmentRuns` instead, copied once, into the packs. The big arrays' slices: :func:`read_slices` (memory-mapped,
    or read past the page cache into the worker's buffers where the scatter saved them so)."""
    sd = Path(scratch)
    cols: dict[str, list[np.ndarray]] = {n: [] for n in ("keys", "seq", "pred", "nsl", "ids", "pos", "mlm")}
    wanted: dict[str, list[tuple[Path, int, int]]] = {n: [] for n in ("ids", "pos", "mlm")}
    segs: list[Any] = []
    for k in range(n_inputs):
        key = _load(sd / f"in_{k:05d}_keys.npy")
        a, b = (int(x) for x in np.searchsorted(key, [q0, q1]))
        if b <= a:
            continue
        tok, prd = _load(sd / f"in_{k:05d}_tok.npy")[a:b + 1], _load(sd / f"in_{k:05d}_prd.npy")[a:b + 1]
        t0, t1, m0, m1 = int(tok[0]), int(tok[-1]), int(prd[0]), int(prd[-1])
        cols["keys"].append(key[a:b])
        cols["seq"].append(np.diff(tok))
        cols["pred"].append(np.diff(prd))
        cols["nsl"].append(_load(sd / f"in_{k:05d}_nsl.npy")[a:b])
        wanted["ids"].append((sd / f"in_{k:05d}_ids.npy", t0, t1))
        segs.append(segment_item(sd, f"in_{k:05d}", a, b, t0, t1, cols["seq"][-1]))
        for name in ("pos", "mlm"):
            wanted[name].append((sd / f"in_{k:05d}_{name}.npy", m0, m1))
    space = pack_fast.process_space("pack-habana")  # the group's buffers (write_group's)
    for name, slices in wanted.items():
        cols[name] = read_slices(slices, space, f"gather-{name}")
    small = {n: np.concatenate(cols[n]) if cols[n] else np.zeros(0, np.int64) for n in ("keys", "seq", "pred", "nsl")}
    order = distinct_argsort(small["keys"])  # checked below: each place once
    if not np.array_equal(small["keys"][order], np.arange(q0, q1)):  # pragma: no cover - each place once
        raise InputError(f"pack-habana: places {q0}..{q1 - 1} are not each held once by the scratch (internal error)")
    seq, pred = small["seq"][order], small["pred"][order]
    out = {"seq": seq, "pred": pred, "next_sentence_labels": small["nsl"][order]}
    if segs and all(isinstance(it[0], np.ndarray) for it in segs):  # one number a row: filled in place order
        bounds = np.concatenate([it[0] for it in segs])[order]
        out["segment_ids"] = SegmentRuns(bounds) if pack_fast.available() else pack_fast.fill_segments(
            bounds, seq, space, "gather-seg-placed")
    else:
        cols["seg"] = segment_slices(segs, space, "gather-seg")
    # each input's slice read in its order, each row written to its place (pack_fast.place_runs), where the C loop
    # runs and the inputs' slices share a type; else the concatenation taken in place order (NumPy)
    which = np.concatenate([np.full(len(v), i, np.int64) for i, v in enumerate(cols["seq"])]) if cols["seq"] else \
        np.zeros(0, np.int64)
    for short, name, lens in (("ids", "input_ids", small["seq"]), ("seg", "segment_ids", small["seq"]),
                              ("pos", "masked_lm_positions", small["pred"]), ("mlm", "masked_lm_ids", small["pred"])):
        if name in out:
            continue
        srcs = cols[short]
        placed = None
        if srcs and len({np.dtype(x.dtype) for x in srcs}) == 1:
            starts = np.concatenate([np.cumsum(x) - x for x in (cols["seq"] if lens is small["seq"] else cols["pred"])])
            if short == "ids" and pack_fast.available():  # left where they were read: build_packs copies them once
                out[name] = RowRuns(tuple(srcs), which[order], starts[order])
                continue
            dests = np.empty(len(order), np.int64)
            dests[order] = np.cumsum(lens[order]) - lens[order]
            placed = pack_fast.place_runs(srcs, which, starts, lens, dests, srcs[0].dtype, space=space,
                                          name=f"gather-{short}-placed")  # not build_packs' names
        if placed is None:
            flat = np.concatenate(srcs) if srcs else np.zeros(0, np.int64)
            placed = take_runs((flat,), lens, order)[0]
        out[name] = placed
    return out


def build_packs(slots: np.ndarray, seq: np.ndarray, pred: np.ndarray, rows: dict[str, np.ndarray],
                cfg: HabanaPackConfig, where: str, space: pack_fast.Space | None = None,
                into: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """The nine packed arrays (the values the script's int32 arrays hold, in the dtypes it stores, or in
    :data:`NARROW_DTYPES` with ``cfg.dtypes == "narrow"``) of packs
    ``slots``; ``seq``, ``pred`` and ``rows``: the lengths, predictions and compact rows (:func:`_gather`: each row's
    first ``seq`` tokens and segment ids, first ``pred`` masked positions and ids, back to back) of the packs' real
    slots, in row-major order. The C loop (pack_fast.gather_runs) writes each pack's row once where it runs: its
    sequences' values, then zeros to the row's end; NumPy's masked assignments otherwise (the same arrays). With
    ``space`` the C loop's arrays are views of its buffers, valid until the next call with it (a file's arrays are
    written before the next file's are built: the pages of fresh 30 MB arrays, zeroed by the kernel on first touch
    for every file, are touched once per group). ``into``: each array written there instead (name -> an array of
    its shape and stored type, contents undefined: a laid-out file's image, packing.ImageOutputs.create_laid_out),
    and ``into`` returned."""
    n, depth = slots.shape
    length, width = cfg.max_sequence_length, cfg.max_predictions_per_sequence + depth
    real = slots >= 0
    pack = np.nonzero(real)[0]
    j = (np.cumsum(real, axis=1) - 1)[real]  # the sequence's index in its pack (padding slots skipped)
    seq = seq.astype(np.int64)
    pred = pred.astype(np.int64)
    first = np.searchsorted(pack, pack, side="left")
    cs = np.cumsum(seq) - seq
    off = cs - cs[first]  # where the sequence starts in its pack
    total = np.bincount(pack, weights=pred, minlength=n).astype(np.int64)
    over = np.flatnonzero(total >= width)
    if over.size:
        q = int(over[0])
        raise InputError(f"pack-habana: {where}, pack {q} holds {int(total[q])} masked positions; Habana's script "
                         f"asserts fewer than max_predictions_per_sequence + max_sequences_per_pack = {width}: raise "
                         f"--max_predictions_per_sequence (it is {cfg.max_predictions_per_sequence})")
    tok = np.bincount(pack, weights=seq, minlength=n)
    if (tok > length).any():  # pragma: no cover - a strategy sums to L
        raise InputError("pack-habana: a pack exceeds max_sequence_length (internal error)")
    # each array in its stored dtype (the script's int32 arrays, converted by HDF5 to i1 where it stores i1: the
    # same values, so the same bytes, without HDF5's conversion; or the narrow dtypes, the same values)
    dts = dataset_dtypes(cfg)
    if not pack_fast.available():  # the NumPy path takes values back to back
        rows = {k: v.values(seq) if isinstance(v, (RowRuns, SegmentRuns)) else v for k, v in rows.items()}
    if cfg.dtypes == "narrow":
        for name in ("input_ids", "masked_lm_ids"):
            v, info = rows[name], np.iinfo(dts[name])
            if isinstance(v, RowRuns) and v.dtype.itemsize > info.bits // 8:
                v = v.values(seq)
            if v.dtype.itemsize > info.bits // 8 and v.size and (int(v.min()) < info.min or int(v.max()) > info.max):
                raise InputError(f"pack-habana --dtypes narrow: {where}: the inputs hold {name} values from "
                                 f"{int(v.min())} to {int(v.max())}, outside {dts[name]}'s {info.min}..{info.max} "
                                 "(a vocabulary over 32,768 tokens): use --dtypes script (the habana-packed-raw "
                                 "target)")
    cols = {"L": length, "P+S": width, "S": depth}
    small = {name: np.zeros((n, cols[w]), dts[name]) for name, _, w in PACKED_DATASETS if w == "S"}
    if into is not None:
        for name in small:
            into[name][...] = 0
            small[name] = into[name]
    dest = into if into is not None else {}
    small["next_sentence_positions"][pack, j] = off
    small["next_sentence_labels"][pack, j] = rows["next_sentence_labels"]
    small["next_sentence_weights"][pack, j] = 1
    mpos = rows["masked_lm_positions"] + np.repeat(off, pred)
    if pack_fast.available():
        tok = tok.astype(np.int64)
        cnt = real.sum(axis=1)
        return {**{name: _padded_rows(rows[name], tok, length, dts[name], space, name, dest.get(name), seq, cnt)
                   for name in ("input_ids", "segment_ids")},
                "input_mask": _padded_seqs(j + 1, seq, cnt, length, dts["input_mask"], space, "input_mask",
                                           dest.get("input_mask")),
                "positions": _padded_seqs(np.zeros_like(j), seq, cnt, length, dts["positions"], space, "positions",
                                          dest.get("positions")),
                "masked_lm_positions": _padded_rows(mpos, total, width, dts["masked_lm_positions"], space,
                                                    "masked_lm_positions", dest.get("masked_lm_positions")),
                "masked_lm_ids": _padded_rows(rows["masked_lm_ids"], total, width, dts["masked_lm_ids"], space,
                                              "masked_lm_ids", dest.get("masked_lm_ids")), **small}
    out = {name: np.zeros((n, cols[w]), dts[name]) for name, _, w in PACKED_DATASETS if w != "S"}
    out.update(small)
    # Each pack's tokens (its masked positions) are its sequences' back to back, then zeros: a row-major boolean
    # mask of the packs' filled cells takes the compact values in row-major order, which is pack order.
    filled = np.arange(length) < tok.astype(np.int64)[:, None]
    out["input_ids"][filled] = rows["input_ids"]
    out["segment_ids"][filled] = rows["segment_ids"]
    out["input_mask"][filled] = np.repeat(j + 1, seq)
    out["positions"][filled] = np.arange(int(seq.sum())) - np.repeat(cs, seq)
    filled = np.arange(width) < total[:, None]
    out["masked_lm_positions"][filled] = mpos
    out["masked_lm_ids"][filled] = rows["masked_lm_ids"]
    for name, v in dest.items():
        if v is not out[name]:
            v[...] = out[name]
    return {name: dest.get(name, out[name]) for name, _, _ in PACKED_DATASETS}


def _padded_rows(values: Any, counts: np.ndarray, width: int, dt: np.dtype,
                 space: pack_fast.Space | None = None, name: str = "gather", out: np.ndarray | None = None,
                 seq: np.ndarray | None = None, cnt: np.ndarray | None = None) -> np.ndarray:
    """``(len(counts), width)``: row i = the next ``counts[i]`` of ``values`` (back to back), then zeros; each value
    copied once (the C loop), converted to ``dt`` (into ``out``, or ``space``'s buffer ``name``, where given).
    ``values`` a :class:`RowRuns` or :class:`SegmentRuns` (``seq``: its rows' lengths; ``cnt``: each pack's rows):
    each row's values copied from where they are into their pack's row."""
    if isinstance(values, (RowRuns, SegmentRuns)):
        return _padded_runs(values, seq, cnt, counts, width, dt, space, name, out)
    n = len(counts)
    values = np.ascontiguousarray(values)
    zeros = np.zeros(width, values.dtype)
    which = np.tile(np.array([0, 1], np.int64), n)
    starts = np.zeros(2 * n, np.int64)
    starts[0::2] = np.cumsum(counts) - counts
    lens = np.empty(2 * n, np.int64)
    lens[0::2] = counts
    lens[1::2] = width - counts
    return pack_fast.gather_runs([values, zeros], which, starts, lens, dt, space=space, name=name,
                                 out=out).reshape(n, width)


def _padded_runs(values: RowRuns | SegmentRuns, seq: np.ndarray, cnt: np.ndarray, tok: np.ndarray, width: int,
                 dt: np.dtype, space: pack_fast.Space | None, name: str, out: np.ndarray | None) -> np.ndarray:
    """:func:`_padded_rows` of rows that are :class:`RowRuns` (one run a row, from where the group read it) or
    :class:`SegmentRuns` (two a row: its 0s, then its 1s), each pack's zeros after its rows: one C gather."""
    n, k = len(cnt), len(seq)
    per = 1 if isinstance(values, RowRuns) else 2  # runs a row
    pack_of = np.repeat(np.arange(n), cnt)
    at = per * np.arange(k) + pack_of  # a row's (first) run: after its pack's earlier rows' and earlier packs'
    pad = per * np.cumsum(cnt) + np.arange(n)  # each pack's zeros, after its rows
    which = np.empty(per * k + n, np.int64)
    starts = np.empty(per * k + n, np.int64)
    lens = np.empty(per * k + n, np.int64)
    if isinstance(values, RowRuns):
        srcs = [*values.sources, np.zeros(width, values.dtype)]
        which[at], starts[at], lens[at] = values.which, values.starts, seq
    else:  # one source: width 0s, then width 1s
        srcs = [np.repeat(np.arange(2, dtype=np.int8), width)]
        b = values.bounds.astype(np.int64)
        which[at], starts[at], lens[at] = 0, 0, b
        which[at + 1], starts[at + 1], lens[at + 1] = 0, width, seq - b
    which[pad] = len(srcs) - 1 if isinstance(values, RowRuns) else 0
    starts[pad] = 0
    lens[pad] = width - tok
    return pack_fast.gather_runs(srcs, which, starts, lens, dt, space=space, name=name, out=out).reshape(n, width)


def _padded_seqs(level: np.ndarray, seq: np.ndarray, cnt: np.ndarray, width: int, dt: np.dtype,
                 space: pack_fast.Space | None = None, name: str = "gather", out: np.ndarray | None = None) -> np.ndarray:
    """``(len(cnt), width)``: pack i holds the next ``cnt[i]`` sequences; sequence r's cells are ``level[r]``
    (``level`` > 0: input_mask) or 0, 1, ... (``level`` 0: positions), then zeros to ``width``."""
    n = len(cnt)
    depth = int(level.max()) if len(level) else 0
    # one source: [0, 1, ..., width-1] (zeros where no sequence counts its positions), then width zeros, then width
    # 1s, 2s, ...: every run is a slice of it; in the output's type where its values fit (a plain copy a run)
    counts = bool(len(level)) and not (level > 0).all()
    top = max(width - 1 if counts else 0, depth)
    src_dt = np.dtype(dt) if top <= np.iinfo(np.dtype(dt)).max else np.dtype(np.int32)
    src = np.concatenate([np.arange(width) if counts else np.zeros(width, np.int64), np.zeros(width, np.int64),
                          np.repeat(np.arange(1, depth + 1), width)]).astype(src_dt)
    end = np.cumsum(cnt)
    runs = len(seq) + n
    starts = np.empty(runs, np.int64)
    lens = np.empty(runs, np.int64)
    pack_of = np.repeat(np.arange(n), cnt)
    at = np.arange(len(seq)) + pack_of  # a sequence's run: after its pack's earlier sequences and earlier packs
    starts[at] = np.where(level > 0, (level + 1) * width, 0)
    lens[at] = seq
    tok = np.bincount(pack_of, weights=seq, minlength=n).astype(np.int64)
    pad = end + np.arange(n)  # each pack's zeros, after its sequences
    starts[pad] = width
    lens[pad] = width - tok
    return pack_fast.gather_runs([src], None, starts, lens, dt, space=space, name=name, out=out).reshape(n, width)


def write_packed_file(path: Path, arrays: dict[str, np.ndarray], compression: str = "gzip",
                      dtypes: dict[str, np.dtype] | None = None, outputs: ImageOutputs | None = None) -> None:
    """One packed file: the nine datasets, created in the script's order as it creates them
    (``create_dataset(data=<int32 array>, dtype=..., compression="gzip")``: the deflate of each chunk, zlib's level
    4, is nearly all of this call's CPU); ``compression="none"``: the same datasets stored contiguous, uncompressed.
    ``dtypes``: each dataset's stored type (default: the script's; :func:`dataset_dtypes`).
    Written by HDF5's file driver with its disk space reserved first (packing.h5_reserved: the uncompressed size
    bounds it): a full disk fails the reservation, never an HDF5 write (which crashed the process). ``outputs``:
    built in memory and written in one go instead (packing.ImageOutputs: the same bytes)."""
    gzip = "gzip" if compression == "gzip" else None
    dts = dtypes if dtypes is not None else {name: np.dtype(dt) for name, dt, _ in PACKED_DATASETS}
    bound = sum(dts[name].itemsize * arrays[name].size for name, _, _ in PACKED_DATASETS)
    bound += bound // 8 + (1 << 20)
    with (outputs.create(path, bound) if outputs is not None else h5_reserved(path, bound)) as f:
        _create_datasets(f, arrays, gzip, dts)


def _create_datasets(f: Any, arrays: dict[str, np.ndarray], gzip: str | None, dts: dict[str, np.dtype]) -> None:
    for name, _, _ in PACKED_DATASETS:
        f.create_dataset(name, data=arrays[name], dtype=dts[name], compression=gzip)


#: The most bytes of uncompressed files held for hashing at once (:func:`held_bytes`).
HELD_BYTES_MAX = 576 << 20


def held_bytes(n: int, cfg: HabanaPackConfig) -> int:
    """The bytes of images a group holds before hashing them (ImageOutputs.held_bytes), for files of ``n`` packs:
    uncompressed files (their size known from their layout) up to ImageOutputs.LANES of them, at most
    :data:`HELD_BYTES_MAX`. The raw set's 33 MB files: 16 hash side by side (6.9 GB/s on 8 parts) where 256 MB
    held 8 (5.1 GB/s: 1.67 of its 7.1 CPU-s); the stage's peak memory 889 -> 1,114 MB. Compressed files: the
    default."""
    layout = packed_layout(n, cfg)
    if layout is None:
        return ImageOutputs.HELD_BYTES
    return min(HELD_BYTES_MAX, max(ImageOutputs.HELD_BYTES, ImageOutputs.LANES * layout.size))


def packed_layout(n: int, cfg: HabanaPackConfig) -> ImageLayout | None:
    """:func:`_packed_layout`, looked up once per file count and configuration (a group asks for each of its files)."""
    key = (n, cfg)
    if key not in _PACKED_LAYOUTS:
        if len(_PACKED_LAYOUTS) >= 8:
            _PACKED_LAYOUTS.clear()
        _PACKED_LAYOUTS[key] = _packed_layout(n, cfg)
    return _PACKED_LAYOUTS[key]


_PACKED_LAYOUTS: dict[tuple[int, HabanaPackConfig], ImageLayout | None] = {}


def _packed_layout(n: int, cfg: HabanaPackConfig) -> ImageLayout | None:
    """With ``compression="none"``: the :class:`~preprocessing.packing.ImageLayout` of a packed file of ``n`` packs
    (write_packed_file's datasets, created as it creates them), or None (gzip; or HDF5 put a dataset where its
    values cannot be written straight: the file goes through HDF5)."""
    if cfg.compression != "none":
        return None
    dts = dataset_dtypes(cfg)
    cols = {"L": cfg.max_sequence_length, "P+S": cfg.max_predictions_per_sequence + cfg.max_sequences_per_pack,
            "S": cfg.max_sequences_per_pack}
    shapes = {name: (n, cols[w]) for name, _, w in PACKED_DATASETS}
    key = ("pack-habana", tuple((name, shapes[name], dts[name].str) for name, _, _ in PACKED_DATASETS))
    return image_layout(key, lambda f: _create_datasets(f, {k: np.zeros(v, dts[k]) for k, v in shapes.items()},
                                                         None, dts), [name for name, _, _ in PACKED_DATASETS])


def metadata_json(stats: dict[str, Any]) -> str:
    """``<output_dir>_metadata.json``: the keys of Habana's packers (MLPerf 2.1's ``create_json_metadata``)."""
    return json.dumps(stats, sort_keys=True, indent=2)


def _prepare_out(data: Path) -> None:
    """Refuse a trainer folder holding anything but this stage's files; drop its old part files."""
    if not data.exists():
        return
    if not data.is_dir():
        raise InputError(f"{data} is a file; pack-habana writes a folder of packed files there")
    for e in os.scandir(data):
        if PART_RE.match(e.name) and e.is_file(follow_symlinks=False):
            os.unlink(e.path)  # a stale part (the previous run may have written more) would be read
        elif not (_DEBRIS.match(e.name) and e.is_file(follow_symlinks=False)):  # debris: StageOutput sweeps it
            raise InputError(f"{data} holds {e.name}; Habana's trainer reads every file of its --input_dir as "
                             "packed data: choose an empty folder, or remove it")


def _rows_of(v: Any, t0: int, t1: int, r0: int, r1: int) -> Any:
    """Rows ``r0 .. r1 - 1`` (tokens ``t0 .. t1 - 1``) of a group's values: :class:`RowRuns` and
    :class:`SegmentRuns` by rows, arrays by tokens."""
    return v[r0:r1] if isinstance(v, (RowRuns, SegmentRuns)) else v[t0:t1]


def write_group(first: int, bounds: list[tuple[int, int]], slots: str | np.ndarray, q0: int, scratch: str,
                n_inputs: int, data: str, cfg: HabanaPackConfig, direct: bool = False) -> list[tuple[str, str]]:
    """Output files ``first``, ``first + 1``, ... of packs ``bounds`` (``slots``: every pack's slots, or the
    ``.npy`` file holding them, read from ``bounds``' first pack to its last; their real slots, row-major, hold
    places ``q0``, ``q0 + 1``, ... of the scratch, whose rows give their lengths and predictions), each written to
    a temporary name and closed; then hashed and fsynced (side by side: core.manifest.md5_then_fsync) and renamed
    into ``data``. Returns (name, md5) per file. One call per group of files: in this process or a pool's worker.
    The files are built in memory and written in one go (packing.ImageOutputs; ``direct``: past the page cache, as
    the scratch is), hashed from memory."""
    from core.manifest import late_fsyncs, md5_then_fsync, raise_if_disk_full
    from preprocessing.hdf5_io import tmp_path

    a = bounds[0][0]
    slots = next(row_blocks(_load(Path(slots)) if isinstance(slots, str) else slots, a, bounds[-1][1],
                            bounds[-1][1] - a))
    n_real = int(np.count_nonzero(slots >= 0))
    rows = _gather(scratch, n_inputs, q0, q0 + n_real)
    seq, pred = rows["seq"], rows["pred"]  # the places' rows, in place order: the packs' real slots, row-major
    if len(seq) != n_real:  # pragma: no cover
        raise InputError("pack-habana: the scratch holds fewer rows than the packs' slots (internal error)")
    tok = np.concatenate([[0], np.cumsum(rows["seq"])])
    prd = np.concatenate([[0], np.cumsum(rows["pred"])])
    done = 0
    names, tmps = [], []
    final = Path(data)
    final.mkdir(parents=True, exist_ok=True)
    # one file's big arrays, used again for the next (each file written before it) and by the worker's next call
    space = pack_fast.process_space("pack-habana")
    outputs = ImageOutputs(space, direct)
    if outputs.usable and bounds:
        outputs.held_bytes = held_bytes(bounds[0][1] - bounds[0][0], cfg)
    try:
        # each file's writeback started as it closes, all fsynced after their md5s; the images written behind
        # (ImageOutputs.BEHIND), every write done when the block ends
        with outputs, late_fsyncs():
            for i, (p0, p1) in enumerate(bounds, start=first):
                part = slots[p0 - a:p1 - a]
                k = int((part >= 0).sum())
                name = PART_NAME.format(i)
                t0, t1, m0, m1 = int(tok[done]), int(tok[done + k]), int(prd[done]), int(prd[done + k])
                make = partial(build_packs, part, seq[done:done + k], pred[done:done + k],
                               {"input_ids": _rows_of(rows["input_ids"], t0, t1, done, done + k),
                                "segment_ids": _rows_of(rows["segment_ids"], t0, t1, done, done + k),
                                "masked_lm_positions": rows["masked_lm_positions"][m0:m1],
                                "masked_lm_ids": rows["masked_lm_ids"][m0:m1],
                                "next_sentence_labels": rows["next_sentence_labels"][done:done + k]}, cfg, name, space)
                done += k
                final = Path(data) / name
                tmps.append(tmp_path(final))
                names.append(name)
                layout = packed_layout(len(part), cfg) if outputs.usable else None
                if layout is not None:  # the values built straight into the file's image
                    with outputs.create_laid_out(tmps[-1], layout) as into:
                        make(into=into)
                else:
                    write_packed_file(tmps[-1], make(), cfg.compression, dataset_dtypes(cfg), outputs)
            known = outputs.md5s()
        md5s = md5_then_fsync(tmps, known)  # on the disk before the renames
        for name, tmp in zip(names, tmps, strict=True):
            os.replace(tmp, Path(data) / name)
    except BaseException as exc:
        for tmp in tmps:
            tmp.unlink(missing_ok=True)
        raise_if_disk_full(exc, final)
        raise
    return list(zip(names, md5s, strict=True))


def run_pack_habana(input_files: Sequence[Path | str], out_dir: Path | str,
                    cfg: HabanaPackConfig = HabanaPackConfig(), upstream: Sequence[Manifest] = (), *,
                    data_dir: str = "", manifest_name: str = MANIFEST_NAME, workers: int = 1) -> Manifest:
    """Stage function: Habana's packed set of ``input_files`` (in this order).

    Writes ``out_dir/[data_dir/]mixed_strategies_part_<i>.hdf5`` (the trainer's folder: nothing else in it),
    ``<that folder>_metadata.json`` beside it, and the manifest ``out_dir/manifest_name`` last (relative to
    ``out_dir``: the CLI keeps it outside the trainer's folder). The metadata is one of the stage's files when it
    lies inside ``out_dir`` (the DAG's layout: ``data_dir="packed"``). Counters: sequences, packs, files,
    dropped_packs, dropped_sequences, padding_slots, empty_packs, strategies_used, avg_seq_per_sample, speedup.
    ``workers`` processes scatter the inputs, then write groups of ``group_files`` files; the bytes
    do not depend on it. Scratch: a hidden folder beside the trainer's folder (:func:`scratch_dir`), removed.
    """
    check_config(cfg)
    files = [Path(p) for p in input_files]
    if not files:
        raise InputError("pack-habana got no input files (the script reads the files of --input_dir whose name "
                         "contains 'training')")
    verify_inputs(files, upstream)
    out_dir = Path(out_dir)
    data = out_dir / data_dir if data_dir else out_dir
    real = data.resolve()
    meta_path = real.parent / f"{real.name}_metadata.json"
    inside = data_dir != ""
    if inside and (os.path.islink(data) or not real.is_relative_to(out_dir.resolve())):
        raise InputError(f"{data} is a symbolic link (to {os.path.realpath(data)}): pack-habana writes its packed "
                         f"files, and its scratch folder beside them, in {out_dir} only; remove the link")
    t0 = time.perf_counter()
    inputs = read_inputs(files, cfg, workers)
    t1 = time.perf_counter()
    log.info("pack-habana: %d sequences in %d file(s), mean length %.2f (read in %.1f s)", len(inputs.seq),
             len(files), inputs.seq.mean(), t1 - t0)
    recipe = packing_recipe(inputs.seq, cfg.max_sequence_length, cfg.max_sequences_per_pack)
    st = recipe.stats
    t2 = time.perf_counter()
    log.info("pack-habana (--compression %s%s): %d packs (expected speed-up %.3f, %.5f sequences a pack, %d "
             "strategies used); recipe: %d NNLS round(s) in %.1f s", cfg.compression,
             " --dtypes narrow" if cfg.dtypes == "narrow" else "", st["new_number_of_samples"], st["expected_speed_up"],
             st["avg_seq_per_sample"], st["number_of_strategies_utilized"], len(recipe.rounds), t2 - t1)
    sd = scratch_dir(data)
    shutil.rmtree(sd, ignore_errors=True)  # an earlier run's, killed
    sd.mkdir(parents=True)
    try:
        # the packs go to the scratch as they are made (memory-mapped after): the plan's memory is ~4 bytes a slot
        slots = assign_packs(inputs.seq, recipe, cfg, out=sd / "slots.npy")
        log.info("pack-habana: packs assigned in %.1f s", time.perf_counter() - t2)
        bounds = pack_files(len(slots), cfg)
        (out_dir / manifest_name).unlink(missing_ok=True)  # the stage is being redone (a manifest outside out_dir)
        _prepare_out(data)
        prefix = f"{data_dir}/" if data_dir else ""
        # groups of whole files, at most chunk_rows packs each, as many for each worker and of even sizes
        # (core.pools.even_calls: 9 files on 2 workers are 2 groups of 5 and 4, not 8 and 1)
        n_groups = even_calls(len(bounds), max(1, cfg.group_files), workers)
        cuts = [len(bounds) * g // n_groups for g in range(n_groups + 1)]
        groups = [(a, bounds[a:b]) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]
        written = bounds[-1][1] if bounds else 0
        # each row's place: its slot's index among the real slots of the written packs, row-major (-1: not written)
        places = row_places(slots, len(inputs.seq), bounds)
        n_seq = len(inputs.seq)
        with StageOutput(out_dir, "pack_habana", params=key_params(cfg), upstream=upstream,
                         code_version=STAGE_VERSION, manifest_name=manifest_name) as out:
            # the rows' places, lengths and predictions to the scratch, let go here: each scatter call reads its
            # input's rows of them (this process holds none of them while the inputs are scattered)
            for name, arr in (("keys", places.place), ("seq", inputs.seq), ("pred", inputs.pred)):
                _save(sd / f"plan_{name}.npy", arr)
            st_ = inputs.starts.tolist()
            # the compact rows' big arrays past the page cache where the scratch would crowd the memory (at full
            # size: ~1.5 GB a GB of padded input, read back once; preprocessing.scratch.use_direct)
            direct = use_direct(sd, 3 * int(inputs.seq.sum()) + 4 * int(inputs.pred.sum()))
            scatter = [(k, p, str(sd), st_[k], st_[k + 1], max(1, cfg.chunk_rows), direct)
                       for k, p in enumerate(inputs.files)]
            n_inputs, in_files = len(inputs.files), [str(p) for p in inputs.files]
            inputs = places.place = None
            with shared_pool(workers) as pool:  # one pool for the scatter and the writes
                run_all(_scatter_planned, scatter, min(workers, len(scatter)), pool)
                if cfg.dtypes == "narrow":
                    check_narrow_scratch(sd, in_files)
                log.info("pack-habana: rows scattered in %.1f s", time.perf_counter() - t2)
                # each group's packs read from the scratch's slots by its call (none of them pickled from here)
                calls = [(g, group, str(sd / "slots.npy"), int(places.file_first[g]), str(sd), n_inputs, str(data), cfg,
                          direct) for g, group in groups]
                for entries in run_all(write_group, calls, min(workers, len(calls)), pool):
                    for name, md5 in entries:
                        out.add_file(prefix + name, md5)
            log.info("pack-habana: %d file(s) written in %.1f s", len(bounds), time.perf_counter() - t2)
            forget_scratch_maps(sd)
            shutil.rmtree(sd, ignore_errors=True)
            text = metadata_json(st)
            if inside:
                with out.open_text(f"{data_dir}_metadata.json") as fh:
                    fh.write(text)
            else:
                atomic_write_text(meta_path, text)
            out.count("sequences", n_seq)
            out.count("packs", written)
            out.count("files", len(bounds))
            out.count("dropped_packs", len(slots) - written)
            out.count("dropped_sequences", places.dropped_sequences)
            out.count("padding_slots", int(recipe.padding.sum()))
            out.count("empty_packs", places.empty_packs)  # padding slots only (the script too)
            out.count("strategies_used", st["number_of_strategies_utilized"])
            out.count("avg_seq_per_sample", round(st["avg_seq_per_sample"], 6))
            out.count("speedup", round(st["expected_speed_up"], 6))
    finally:
        forget_scratch_maps(sd)  # this process's maps of it: the space freed
        shutil.rmtree(sd, ignore_errors=True)
    return out.manifest


# -- the DAG's declaration (core/stage.py); the lead adds it to preprocessing/registry.py ---------------------------
def configure(p: Any) -> HabanaPackConfig:
    """The run's parameters -> the stage's config (MLPerf data: 76 predictions a sequence, so 79 a pack)."""
    return HabanaPackConfig(max_sequence_length=getattr(p, "max_seq_length", 512),
                            max_predictions_per_sequence=getattr(p, "max_predictions_per_seq", 76),
                            max_sequences_per_pack=getattr(p, "max_sequences_per_pack", 3),
                            seed=getattr(p, "habana_pack_seed", 42))


def configure_raw(p: Any) -> HabanaPackConfig:
    """``habana-packed-raw``: the same packs as ``habana-packed``, stored uncompressed (``compression="none"``)."""
    from dataclasses import replace

    return replace(configure(p), compression="none")


def configure_narrow(p: Any) -> HabanaPackConfig:
    """``habana-packed-narrow``: the same packs uncompressed in the narrow dtypes (:data:`NARROW_DTYPES`)."""
    from dataclasses import replace

    return replace(configure(p), compression="none", dtypes="narrow")


def _plan_dag(plan: Any) -> list[Any]:
    """One call over every part's padded HDF5, in part order (its groups of files on the run's workers)."""
    h5 = plan.result("hdf5")
    files = [str(h5.path(s + ".hdf5", s)) for s in h5.shards]
    from core.pools import default_workers

    workers = getattr(plan.params, "workers", 0) or default_workers()
    return [plan.unit(files, cfg=plan.cfg, data_dir=DAG_DATA_DIR, workers=workers,
                      upstream=[h5.unit_dir(s) for s in h5.shards])]


DAG_STAGES = (Stage(name="habana_packed", title="pack_habana: Habana's packed set (<= 3 sequences a pack), what its "
                    "trainer reads with --enable_packed_data_mode True",
                    reads=("hdf5",), run=run_pack_habana, version=STAGE_VERSION, config=HabanaPackConfig,
                    configure=configure, key_params=key_params, plan=_plan_dag,
                    when=lambda p: "habana-packed" in getattr(p, "targets", ()),
                    outputs={"habana_packed_dir": DAG_DATA_DIR}, aliases=("pack_habana",)),
              Stage(name="habana_packed_raw", title="pack_habana --compression none: Habana's packed set stored "
                    "uncompressed (the same datasets and values, which its trainer reads alike; no gzip level 4)",
                    reads=("hdf5",), run=run_pack_habana, version=STAGE_VERSION, config=HabanaPackConfig,
                    configure=configure_raw, key_params=key_params, plan=_plan_dag,
                    when=lambda p: "habana-packed-raw" in getattr(p, "targets", ()),
                    outputs={"habana_packed_raw_dir": DAG_DATA_DIR}),
              Stage(name="habana_packed_narrow", title="pack_habana --compression none --dtypes narrow: Habana's packed "
                    "set uncompressed, each dataset in its narrowest integer type (the same values; its trainer casts "
                    "them to int64 as it reads them: the same tensors from ~46 % of the raw set's bytes)",
                    reads=("hdf5",), run=run_pack_habana, version=STAGE_VERSION, config=HabanaPackConfig,
                    configure=configure_narrow, key_params=key_params, plan=_plan_dag,
                    when=lambda p: "habana-packed-narrow" in getattr(p, "targets", ()),
                    outputs={"habana_packed_narrow_dir": DAG_DATA_DIR}),)
