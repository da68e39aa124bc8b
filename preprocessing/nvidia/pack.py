"""NVIDIA's packed MLPerf BERT training set (``input_preprocessing/packed_data/``), as one stage.

Reference: NVIDIA's MLPerf BERT submissions, training_results v2.0-v3.1,
``NVIDIA/benchmarks/bert/implementations/pytorch/input_preprocessing/packed_data/`` (README.md of v3.1;
``prepare_data.sh``). Four scripts, run one after the other:

1. ``create_per_seqlength_data.py`` (flags of create_pretraining_data.py, one run per text part
   ``results4/part-XXXXX-of-00500``): the part's training instances, grouped by sequence length (the number of
   valid tokens, ``sum(input_mask)``), one file per length: ``per_seqlen_parts/part-XXXXX/seqlength_NNN.hdf5``.
2. ``gather_per_seqlength_data.py --seq_length L`` (one run per length 1..512): the length-L rows of every part
   dir (``glob(<input>/part-*/)``) concatenated, ``per_seqlen/train_sentences_LLL.hdf5`` (padded rows:
   input_ids int16, input_mask int8, segment_ids int8, masked_lm_positions int16, masked_lm_ids int16,
   next_sentence_labels int8).
3. ``generate_packing_strategy.py --max_seq_length 512 --max_seq_per_sample 3 --shards_num 4320``: the
   "packing recipe" of Graphcore's packed BERT (Krell et al. 2021) from the histogram of lengths: every
   non-decreasing list of at most ``max_seq_per_sample`` lengths summing to exactly ``max_seq_length`` is a
   *strategy*; ``scipy.optimize.nnls`` (weighted, up to 20 rounds, integer rounding, deficits become padding
   "sequences") says how often each is used; the lengths' index lists (padded with ``None`` slots) and the list
   of strategy instances are shuffled with Python's ``random``, strategy instances take the next index of each of
   their lengths, and the packs (lists of ``(length, index)``, ``None`` slots dropped) are cut into
   ``shards_num`` consecutive shards (the first ``n % shards_num`` one pack larger), written as JSON:
   ``packed_data/shard_list_NNNNN.lst``. It prints "The expected speed-up from packing: 1.999" on the real set.
4. ``create_packed_trainset.py``: per shard list, one HDF5 of packs. Seven datasets of ``(n_packs,)``
   variable-length rows, created in this order::

       input_ids            vlen int16  the pack's sequences' tokens, concatenated (length <= max_seq_length)
       segment_ids          vlen int8   their segment ids, concatenated
       packed_input_len     vlen int16  each sequence's length (1..3 entries)
       masked_lm_positions  vlen int16  each sequence's masked positions + the start of the sequence in the pack
       masked_lm_ids        vlen int16  the original ids at those positions, concatenated
       packed_masked_lm_len vlen int16  each sequence's number of masked positions
       next_sentence_labels vlen int8   each sequence's label

   NVIDIA's trainer (``run_pretraining.py --packed_samples``) takes the files of its input dir whose name holds
   ``part_``, pads a pack to max_seq_length with ``input_mask`` = 1 over the pack's tokens, and gives
   ``packed_input_len`` (zero-padded to 3) to ``preprocess_batch``, which restarts the position ids at every
   sequence and makes ``cu_seqlens`` (block-diagonal attention) and one NSP label per sequence from it.

What bertpipe reads: the training instances, in part order, as padded MLPerf HDF5 (``part-XXXXX-of-00500.hdf5``,
what create_pretraining_data + tfrecord-to-hdf5 write: the same instances, in the same order, that step 1 groups)
or any unshuffled re-sharding of them, padded or variable-length (NVIDIA's ``chop_hdf5_files.py`` /
``chop_hdf5_files_to_varlength.py`` shards in shard order). Steps 1 and 2 then amount to a stable sort of all rows
by length: the length-L rows get indices 0, 1, ... in input order. Not a shuffled set (``shuffle_samples.py``):
its packs are valid but not NVIDIA's.

How bertpipe runs it (same outputs; memory bounded by the largest input file, and in the plan by ~10 bytes a
sequence: the full set's in ~1.4 GB):

a. :func:`count_lengths` per input (parallel): every row's length, checked, into a scratch ``.npy`` (with the
   file's size and modification time, which the scatter checks instead of reading the masks again);
b. :func:`plan_packing` (one process): the recipe (:func:`packing_recipe`, the reference's arithmetic with the
   same NumPy/SciPy calls) and the assignment (:func:`assign_packs`: the same draws of a Python ``random.Random``,
   in the same order), kept as arrays: pack -> its sequences, and (length, index) -> its place;
c. :func:`scatter_input` per input (parallel): the input's rows, compacted, sorted by their place, into scratch
   (its big arrays past the page cache where the whole scratch would fill more than half the memory available, as
   the plan decides: ``O_DIRECT``, preprocessing.packing.save_array; the groups read each file as it was saved).
   Segment ids that are 0s then 1s, as a BERT instance's are, are kept as one number a row (the count of 0s:
   preprocessing.packing.save_segments), other ones as a byte a token;
d. :func:`write_shard_group` per group of shards (parallel): the shard lists and packed shards, from the
   contiguous slices of every input's scratch that the group's packs hold; every file to a temporary name,
   closed, renamed; :func:`finish_pack` writes the manifest last. A shard is built in memory by HDF5's core driver
   and written in one call, past the page cache where the scratch is, then hashed from memory
   (preprocessing.packing.ImageOutputs: the bytes HDF5's file driver writes).

The loops run in C where ``preprocessing._pack_native`` is available (:mod:`preprocessing.pack_fast`): a padded
input is memory-mapped and its rows read in the file's order, each row's valid prefix converted, range-checked and
written once to its place (``place_runs``: rows read in another order than stored cost a cache miss each, ~2.7x
the copy); a group reads each input's scratch slice in its order and places its rows in pack order likewise; the
shuffles are CPython's loop; the shard lists are formatted in C. Without it (``BERTPIPE_NATIVE=0``, no compiler)
the NumPy paths write the same bytes (tested), in ~2.5x the CPU.

Differences from the reference, where it is unseeded, unordered or crashes:

* **Seed**: the reference never seeds ``random`` (each run packs differently). bertpipe draws from
  ``random.Random(seed)`` (``--seed``, default 12345): the reference with ``random.seed(seed)`` at its top writes
  the same shard lists.
* **Order of the parts**: step 2 concatenates ``glob(part-*/)``, in directory order (file-system dependent);
  bertpipe takes the inputs in the order given (the CLI: sorted names).
* **Output names**: v3.1's ``create_packed_trainset.py`` writes ``<output_hdf5>/part_NNNNN`` (no suffix; the
  trainer reads files whose name holds ``part_``). bertpipe writes ``<output>/part_NNNNN.hdf5``
  (``reference_names``: ``<output>/part_NNNNN``, the script's names) beside the shard lists.
* A shard with no packs (fewer packs than shards): the reference writes the file, then crashes on it
  (``oindex`` unbound); bertpipe writes it (seven datasets of 0 rows) and goes on.
* A length-``max_seq_length`` sequence left over after the NNLS rounds: the reference looks up the strategy
  ``[0, max_seq_length]`` and crashes (ValueError); bertpipe gives it a pack of its own (``[max_seq_length]``).
  ``max_seq_per_sample`` 1 is refused (the reference crashes on any shorter sequence).
* NumPy 2: the reference sums int8 ``input_mask`` rows with Python's ``sum()`` (wraps at 128 under NEP 50, as in
  ``convert_fixed2variable.py``); bertpipe sums in int64 (NumPy 1 behaviour).
* Rows longer than ``max_seq_length`` (the reference silently leaves them out) or of length 0 are refused.

Unverified (no copy of ``create_per_seqlength_data.py`` was found): that step 1 keeps create_pretraining_data's
instances, their order and masks (it takes that script's flags and seed) and lays rows out as NVIDIA's HDF5
create_pretraining_data does. Verified against the found sources: steps 2-4 (gather v2.0; generate and create,
training_results v2.x/v3.x copies) and the trainer's packed reader (v2.0, v3.1).

    bertpipe pack-nvidia --input_hdf5 hdf5/ --output_hdf5 packed_data/ --shards_num 4320 --workers 8
"""

from __future__ import annotations

import logging
import math
import os
import re
import shutil
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from core.errors import BertpipeError, InputError, RecordError
from core.manifest import (
    DROPPED_NAME,
    MANIFEST_NAME,
    Manifest,
    StageOutput,
    late_fsyncs,
    load_manifest,
    md5_then_fsync,
    raise_if_disk_full,
    remove_debris,
    verify_manifest,
)
from core.pools import default_workers, run_all, shared_pool
from core.schema import H5_ERRORS, HDF5_FIELDS
from core.stage import Stage
from preprocessing import pack_fast
from preprocessing.hdf5_check import check_compact, check_padded
from preprocessing.hdf5_io import chunks, reading, stage_params, tmp_path, verify_inputs
from preprocessing.packing import (  # noqa: F401 - re-exported: both packers' shared pieces
    MAX_STRATEGIES,
    TAKE_RUNS,
    ImageOutputs,
    check_strategy_space,
    distinct_argsort,
    forget_scratch_maps,
    h5_reserved,
    padded_lengths,
    padded_maps,
    read_slices,
    save_array,
    save_segments,
    scratch_map,
    segment_item,
    segment_slices,
    stable_argsort,
    strategy_count,
    take_runs,
)
from preprocessing.scratch import use_direct

log = logging.getLogger(__name__)

STAGE_VERSION = "1"
#: ``random.Random(DEFAULT_SEED)`` draws the shuffles (the reference leaves ``random`` unseeded).
DEFAULT_SEED = 12345
#: Scratch folder inside the output folder while the stage runs (removed at the end, and at the next start).
SCRATCH = ".pack_nvidia_scratch"
#: The packed shard's datasets, in the reference's creation order: (name, element dtype).
PACKED_DATASETS = (("input_ids", "int16"), ("segment_ids", "int8"), ("packed_input_len", "int16"),
                   ("masked_lm_positions", "int16"), ("masked_lm_ids", "int16"), ("packed_masked_lm_len", "int16"),
                   ("next_sentence_labels", "int8"))
#: Sequences a shard-group call aims at: fewer calls than shards (at full size ~300 calls of ~14 shards, hashed side
#: by side), and a call's peak memory under 1.5 GB (its compact rows, ~0.5 GB at the full set's ~256 tokens a
#: sequence, plus as much of the scratch files mapped).
SEQS_PER_GROUP = 1 << 19
#: The scatter's and the groups' big arrays: one set of buffers per worker, kept from call to call
#: (:func:`preprocessing.pack_fast.process_space`).
SPACE_OWNER = "pack-nvidia"
#: The buffers of SPACE_OWNER the count and scatter steps use (the groups use these and more): a process that runs
#: them after a run's groups (pack-nvidia run again in a long-lived worker) frees the others first, else its scatter
#: held the groups' ~1.1 GB besides its own (1.8 GB peak, where one run peaks at 1.3 GB). A full-size worker runs
#: its scatters before its groups, so this frees nothing there.
SCATTER_BUFFERS = ("ids", "seg", "pos", "mlm")
#: The reference's NNLS rounds and the residual below which it stops.
NNLS_ROUNDS, NNLS_STOP = 20, 100
#: Lengths below this get a small residual weight in the NNLS (the reference's ``padding_cutoff``).
PADDING_CUTOFF = 8


@dataclass(frozen=True, kw_only=True)
class PackNvidiaConfig:
    """Parameters of the packed set (the reference's flags) and how it is written."""

    max_seq_length: int = 512  # generate_packing_strategy / create_packed_trainset --max_seq_length
    max_seq_per_sample: int = 3  # --max_seq_per_sample
    shards_num: int = 4320  # --shards_num
    seed: int = DEFAULT_SEED  # random.Random(seed) draws the shuffles (the reference: unseeded)
    reference_names: bool = False  # shards named part_NNNNN (v3.1 script's) instead of part_NNNNN.hdf5
    chunk_rows: int = 4096  # input rows read at once (execution only)


def shard_name(k: int, cfg: PackNvidiaConfig) -> str:
    return f"part_{k:05d}" if cfg.reference_names else f"part_{k:05d}.hdf5"


def list_name(k: int) -> str:
    return f"shard_list_{k:05d}.lst"


def output_names(cfg: PackNvidiaConfig) -> list[str]:
    """Every file the stage writes (besides its manifest)."""
    return [n for k in range(cfg.shards_num) for n in (list_name(k), shard_name(k, cfg))]


#: More shards than packs leave empty shards (NVIDIA's script writes them too); above this many shards, each
#: shard must hold a pack (a flag in range must not make 100,000 empty files).
MAX_EMPTY_SHARDS_TO = 4320


def check_config(cfg: PackNvidiaConfig) -> None:
    if not 2 <= cfg.max_seq_length <= 32767:
        raise InputError(f"max_seq_length must be 2..32767 (int16 positions), got {cfg.max_seq_length}")
    if cfg.max_seq_per_sample < 2:
        raise InputError(f"max_seq_per_sample must be at least 2, got {cfg.max_seq_per_sample} (with 1 no sequence "
                         "is packed; NVIDIA's script crashes on any sequence shorter than max_seq_length)")
    if cfg.shards_num < 1:
        raise InputError(f"shards_num must be at least 1, got {cfg.shards_num}")
    check_strategy_space(cfg.max_seq_length, cfg.max_seq_per_sample, ("--max_seq_per_sample", "--max_seq_length"))


def check_shards(shards_num: int, n_packs: int) -> None:
    """More shards than packs: allowed up to :data:`MAX_EMPTY_SHARDS_TO` shards (empty ones, as NVIDIA's script
    writes), refused above it before any shard is written."""
    if shards_num > n_packs and shards_num > MAX_EMPTY_SHARDS_TO:
        raise InputError(f"--shards_num {shards_num:,}: the inputs make {n_packs:,} packs, so {shards_num - n_packs:,} "
                         f"shards would be empty files; use at most {max(n_packs, MAX_EMPTY_SHARDS_TO):,} (more shards "
                         f"than packs are written only up to {MAX_EMPTY_SHARDS_TO:,}, NVIDIA's count)")


# -- reading the inputs ----------------------------------------------------------------------------------------
@dataclass
class Rows:
    """Rows of an input, compact: per row its length, masked count and label; tokens concatenated."""

    seq: np.ndarray  # int64 lengths (valid tokens)
    pred: np.ndarray  # int64 masked positions per row
    nsl: np.ndarray  # int8
    ids: np.ndarray  # int16, the rows' first seq[i] input ids, concatenated
    seg: np.ndarray  # int8, segment ids likewise
    pos: np.ndarray  # int16, the rows' first pred[i] masked positions, concatenated
    mlm: np.ndarray  # int16, masked_lm_ids likewise
    #: ``seg`` None: each row's segment ids are ``segb[i]`` 0s then 1s (pack_fast.fill_segments makes the values
    #: where they are written: a shard's, not a whole group's, 0.2 GB at full size's group size)
    segb: np.ndarray | None = None

    @staticmethod
    def concat(parts: Sequence[Rows]) -> Rows:
        if not parts:
            return Rows(*(np.zeros(0, dt) for dt in ("i8", "i8", "i1", "i2", "i1", "i2", "i2")))
        return Rows(*(np.concatenate([getattr(p, f) for p in parts]) for f in Rows.__dataclass_fields__
                      if f != "segb"))

    def slice(self, a: int, b: int, tok: np.ndarray, prd: np.ndarray) -> Rows:
        """Rows a..b-1 (views); ``tok``/``prd``: cumulative token / masked-position counts, from 0."""
        return Rows(seq=self.seq[a:b], pred=self.pred[a:b], nsl=self.nsl[a:b], ids=self.ids[tok[a]:tok[b]],
                    seg=self.seg[tok[a]:tok[b]] if self.seg is not None else None, pos=self.pos[prd[a]:prd[b]],
                    mlm=self.mlm[prd[a]:prd[b]], segb=self.segb[a:b] if self.segb is not None else None)

    def segment_ids(self, space: Any = None) -> np.ndarray:
        """``seg``, or the values ``segb`` stands for (in ``space``'s buffer ``"shard-seg"``)."""
        if self.seg is not None:
            return self.seg
        return pack_fast.fill_segments(self.segb, self.seq, space, "shard-seg")

    def take(self, order: np.ndarray) -> Rows:
        """The rows in ``order`` (a permutation or selection of row indices)."""
        ids, seg = take_runs((self.ids, self.seg), self.seq, order)
        pos, mlm = take_runs((self.pos, self.mlm), self.pred, order)
        return Rows(seq=self.seq[order], pred=self.pred[order], nsl=self.nsl[order], ids=ids, seg=seg, pos=pos,
                    mlm=mlm)


class InputFile:
    """One input HDF5 (padded MLPerf rows, or NVIDIA's variable-length rows), checked when opened."""

    def __init__(self, path: Path | str) -> None:
        import h5py

        self.path = Path(path)
        try:
            self.f = h5py.File(self.path, "r")
        except FileNotFoundError:
            raise InputError(f"HDF5 file {self.path} does not exist") from None
        except H5_ERRORS as exc:
            raise InputError(f"{self.path} is not a readable HDF5 file ({exc}); give padded MLPerf HDF5 "
                             "(tfrecord-to-hdf5) or NVIDIA's variable-length shards (pack-varlength)") from None
        try:
            with reading(self.path, "its datasets"):
                self.kind, self.n = self._check()
        except BaseException:
            self.f.close()
            raise

    def _check(self) -> tuple[str, int]:
        import h5py

        need = ["input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels"]
        padded = "input_mask" in self.f
        for name in need + (["input_mask"] if padded else []):
            if not isinstance(self.f.get(name), h5py.Dataset):
                raise InputError(f"{self.path} has no dataset {name!r}; pack-nvidia reads padded MLPerf HDF5 "
                                 "(input_ids, input_mask, segment_ids, masked_lm_positions, masked_lm_ids, "
                                 "next_sentence_labels) or NVIDIA's variable-length rows (no input_mask)")
        n = self.f["input_ids"].shape[0] if self.f["input_ids"].shape else -1
        for name in need + (["input_mask"] if padded else []):
            ds = self.f[name]
            vlen = h5py.check_vlen_dtype(ds.dtype)
            base = vlen if vlen is not None else ds.dtype
            if name == "next_sentence_labels":
                ok = ds.ndim == 1 and vlen is None
            elif padded:
                ok = ds.ndim == 2 and vlen is None
            else:
                ok = ds.ndim == 1 and vlen is not None
            if not ok or np.dtype(base).kind not in "iu" or ds.shape[0] != n:
                form = "padded (N, width)" if padded else "variable-length (N,)"
                raise InputError(f"{self.path}: dataset {name!r} has shape {ds.shape} and dtype {ds.dtype}; "
                                 f"expected {n} rows of integers, {form} as its input_ids (a file of "
                                 "another layout?)")
        if padded:
            w = self.f["input_ids"].shape[1]
            if self.f["input_mask"].shape[1] != w or self.f["segment_ids"].shape[1] != w or \
                    self.f["masked_lm_ids"].shape[1] != self.f["masked_lm_positions"].shape[1]:
                raise InputError(f"{self.path}: the widths of input_ids / input_mask / segment_ids or of "
                                 "masked_lm_positions / masked_lm_ids differ; the file is not MLPerf padded HDF5")
        return ("padded" if padded else "varlength"), n

    def close(self) -> None:
        self.f.close()

    def __enter__(self) -> InputFile:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def mapped(self) -> dict[str, np.ndarray] | None:
        """The padded datasets as read-only memory maps of the file (2-D; ``next_sentence_labels`` 1-D) when
        each is stored contiguous and unfiltered in native byte order (as tfrecord-to-hdf5 writes them); else
        None (chunked or compressed files are read through h5py)."""
        if self.kind != "padded" or self.n <= 0:
            return None
        return padded_maps(self.f, self.path, HDF5_FIELDS)

    def lengths(self, a: int, b: int) -> np.ndarray:
        """Sequence lengths (int64) of rows a..b-1."""
        with reading(self.path, f"rows {a}..{b - 1}"):
            if self.kind == "padded":
                return self.f["input_mask"][a:b].sum(axis=1, dtype=np.int64)
            return np.fromiter(map(len, self.f["input_ids"][a:b]), dtype=np.int64, count=b - a)

    def rows(self, a: int, b: int) -> Rows:
        """Rows a..b-1, compact (the reference's ``row[:sum(input_mask)]`` and ``row[:sum(positions != 0)]``)."""
        with reading(self.path, f"rows {a}..{b - 1}"):
            d = {k: self.f[k][a:b] for k in ("input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids",
                                             "next_sentence_labels")}
            if self.kind == "padded":
                mask = self.f["input_mask"][a:b]
        if self.kind == "padded":
            seq = mask.sum(axis=1, dtype=np.int64)
            pred = (d["masked_lm_positions"] != 0).sum(axis=1, dtype=np.int64)
            keep = np.arange(d["input_ids"].shape[1]) < seq[:, None]
            pkeep = np.arange(d["masked_lm_positions"].shape[1]) < pred[:, None]
            ids, seg = d["input_ids"][keep], d["segment_ids"][keep]
            pos, mlm = d["masked_lm_positions"][pkeep], d["masked_lm_ids"][pkeep]
        else:
            seq = np.fromiter(map(len, d["input_ids"]), dtype=np.int64, count=b - a)
            pred = np.fromiter(map(len, d["masked_lm_positions"]), dtype=np.int64, count=b - a)
            for name, want in (("segment_ids", seq), ("masked_lm_ids", pred)):
                got = np.fromiter(map(len, d[name]), dtype=np.int64, count=b - a)
                if (got != want).any():
                    r = a + int(np.flatnonzero(got != want)[0])
                    raise RecordError(f"{self.path}: row {r}: {name} has {int(got[r - a])} values, expected "
                                      f"{int(want[r - a])}; the file is corrupt, re-create it")
            ids, seg, pos, mlm = (_flat(d[k]) for k in ("input_ids", "segment_ids", "masked_lm_positions",
                                                         "masked_lm_ids"))
        if self.kind == "padded":
            check_padded(self.path, a, {"input_mask": mask})
        check_compact(self.path, a, seq, pred, ids=ids, seg=seg, pos=pos, mlm=mlm, nsl=d["next_sentence_labels"])
        rows = [ids, seg, pos, mlm, d["next_sentence_labels"]]
        names = ("input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels")
        dts = ("int16", "int8", "int16", "int16", "int8")
        out = []
        for values, name, dt, lens in zip(rows, names, dts, (seq, seq, pred, pred, None), strict=True):
            info = np.iinfo(dt)
            if values.size and (values.min() < info.min or values.max() > info.max):
                bad = np.flatnonzero((values < info.min) | (values > info.max))[0]
                r = a + (int(np.searchsorted(np.cumsum(lens), bad, side="right")) if lens is not None else int(bad))
                raise InputError(f"{self.path}: row {r}: {name} holds a value outside {dt}, which NVIDIA's packed "
                                 "format stores (a vocabulary over 32,767 entries does not fit)")
            out.append(values.astype(dt, copy=False))
        return Rows(seq=seq, pred=pred, nsl=out[4], ids=out[0], seg=out[1], pos=out[2], mlm=out[3])


def _flat(rows: np.ndarray) -> np.ndarray:
    """A chunk of a vlen dataset (an object array of 1-D arrays) concatenated."""
    if rows.dtype != object:
        return rows.reshape(-1)
    return np.concatenate(list(rows)) if len(rows) else np.zeros(0, np.int64)


def _check_lengths(seq: np.ndarray, cfg: PackNvidiaConfig, path: Path, first: int) -> None:
    bad = np.flatnonzero((seq < 1) | (seq > cfg.max_seq_length))
    if bad.size:
        r, n = first + int(bad[0]), int(seq[bad[0]])
        more = ("longer than --max_seq_length: NVIDIA's scripts leave such rows out silently; pack with the "
                "instances' --max_seq_length") if n > cfg.max_seq_length else "the file is corrupt, re-create it"
        raise RecordError(f"{path}: row {r} has sequence length {n}; expected 1..{cfg.max_seq_length} ({more})")


# -- step a: lengths ----------------------------------------------------------------------------------------------
def _scratch_file(scratch: Path, name: str) -> Path:
    return Path(scratch) / name


_save = save_array


def _load(path: Path, mmap: bool = False) -> np.ndarray:
    return scratch_map(path) if mmap else np.load(path, allow_pickle=False)


def count_lengths(k: int, path: str, scratch: str, cfg: PackNvidiaConfig) -> dict[str, Any]:
    """Step a for input ``k``: every row's length (checked 1..max_seq_length) into ``scratch/len_<k>.npy``;
    returns the histogram of lengths 1..max_seq_length (JSON types).

    Raises:
        InputError: the file is missing, not HDF5, of another layout, or a row's length is out of range.
    """
    pack_fast.process_space(SPACE_OWNER).keep_only(SCATTER_BUFFERS)
    p = Path(path)
    preds: list[np.ndarray] | None = []  # masked positions a row (while every row's are non-zeros, then zeros)
    with InputFile(p) as f:
        maps = f.mapped()
        parts = []
        for a, b in chunks(f.n, cfg.chunk_rows):
            if maps:  # the padded rows' masks, masked positions and labels (ids and segments: when gathered)
                mask, pos, nsl = (maps[name][a:b] for name in ("input_mask", "masked_lm_positions",
                                                               "next_sentence_labels"))
                counted = pack_fast.position_counts(mask, pos)  # one pass: lengths, predictions, the rules
                if counted is not None and counted[2] < 0 and not ((nsl != 0) & (nsl != 1)).any():
                    seq = counted[0]
                    if preds is not None:
                        preds = preds + [counted[1].astype(np.int16)] if counted[3] else None
                    _check_lengths(seq, cfg, p, a)
                    parts.append(seq.astype(np.int16))
                    continue
                # a row breaks a rule (padded_lengths names it), or types the C loop does not take
                seq = padded_lengths(p, a, {"input_mask": mask, "masked_lm_positions": pos,
                                            "next_sentence_labels": nsl})
                if preds is not None:
                    pred, bad = pack_fast.prefix_lengths(maps["masked_lm_positions"][a:b])
                    preds = preds + [pred.astype(np.int16)] if bad < 0 else None
            else:
                seq = f.lengths(a, b)
            _check_lengths(seq, cfg, p, a)
            parts.append(seq.astype(np.int16))
    lengths = np.concatenate(parts) if parts else np.zeros(0, np.int16)
    _save(_scratch_file(Path(scratch), f"len_{k:05d}.npy"), lengths)
    _save(_scratch_file(Path(scratch), f"stat_{k:05d}.npy"), file_identity(p))
    pred_file = _scratch_file(Path(scratch), f"pred_{k:05d}.npy")
    if maps and preds is not None and parts:  # the scatter takes them, and needs no check of the positions
        _save(pred_file, np.concatenate(preds))
    else:
        pred_file.unlink(missing_ok=True)
    hist = np.bincount(lengths, minlength=cfg.max_seq_length + 1)[1:]
    return {"kind": "lengths", "k": k, "file": str(p), "rows": int(f.n), "hist": hist.tolist()}


def file_identity(path: Path) -> np.ndarray:
    """What says an input is the file its lengths were counted from: its size and modification time (ns)."""
    st = os.stat(path)
    return np.array([st.st_size, st.st_mtime_ns], dtype=np.int64)


# -- step b: the packing recipe (generate_packing_strategy.py) -------------------------------------------------------
def packing_strategies(target: int, depth: int) -> list[tuple[int, ...]]:
    """Every non-decreasing list of 1..``depth`` positive lengths summing to ``target``, in the reference's order
    (its recursion lists them lexicographically)."""
    out: list[tuple[int, ...]] = []

    def walk(prefix: tuple[int, ...], left: int, lo: int, d: int) -> None:
        for new in range(lo, left + 1):
            if new == left:
                out.append((*prefix, new))
            elif d > 1 and left - new >= new:  # the rest, each >= new, must still fit
                walk((*prefix, new), left - new, new, d - 1)

    walk((), target, 1, depth)
    return out


@dataclass
class Recipe:
    """How often each strategy is used and how many padding "sequences" of each length it takes."""

    strategies: list[tuple[int, ...]]
    mixture: np.ndarray  # int64, per strategy
    padding: np.ndarray  # float64, per length 1..max_seq_length (the reference's array; whole numbers)
    stats: dict[str, Any] = field(default_factory=dict)
    report: list[str] = field(default_factory=list)


def strategy_matrix(strategies: Sequence[tuple[int, ...]], max_seq_length: int) -> np.ndarray:
    """``A[L-1, s]``: how many sequences of length L strategy s holds (int32, as the reference)."""
    a = np.zeros((max_seq_length, len(strategies)), dtype=np.int32)
    col = np.repeat(np.arange(len(strategies)), [len(s) for s in strategies])
    row = np.fromiter((x - 1 for s in strategies for x in s), dtype=np.int64, count=len(col))
    np.add.at(a, (row, col), 1)
    return a


def packing_recipe(histogram: Sequence[int] | np.ndarray, max_seq_length: int, max_seq_per_sample: int = 3,
                   say: Callable[[str], None] | None = None) -> Recipe:
    """The reference's ``get_packing_recipe``: the same operations on the same dtypes (the integer rounding, the
    tie order of ``argsort`` and SciPy's NNLS decide the packs), so the same mixture and padding.

    ``histogram[L-1]``: sequences of length L. ``say``: each line the reference prints (also in ``.report``).
    """
    from scipy import optimize

    t = max_seq_length
    report: list[str] = []

    def out(line: str) -> None:
        report.append(line)
        if say is not None:
            say(line)

    hist = np.asarray([int(x) for x in histogram], dtype=np.int64)  # the reference's list, as NumPy sees it
    if hist.shape != (t,) or (hist < 0).any() or not hist.sum():
        raise InputError(f"packing needs a histogram of {t} non-negative counts with at least one sequence")
    lengths = np.arange(1, t + 1)
    n_seq = int(hist.sum())
    out("Begin packing pass".center(80, "_"))
    out(f"Unpacked mean sequence length: {float((lengths * hist).sum()) / n_seq:3.2f}")
    strategies = packing_strategies(t, max_seq_per_sample)
    out(f"Found {len(strategies)} unique packing strategies.")
    a = strategy_matrix(strategies, t)

    w0 = np.ones([t])
    w0[:PADDING_CUTOFF] = PADDING_CUTOFF / (2 * t)
    w0 = np.sqrt(w0)
    weighted = np.expand_dims(w0, -1) * a
    padding: np.ndarray = np.zeros([t], dtype=np.int32)
    mixture: np.ndarray = np.zeros([len(strategies)], dtype=np.int32)
    b = hist + padding
    rounds = 0
    for i in range(NNLS_ROUNDS):
        rounds = i + 1
        out(f"\nIteration: {i}: sequences still to pack:  {b.sum()}")
        t0 = time.time()
        part, rnorm = optimize.nnls(weighted, w0 * b)
        out(f"Solving nnls took {time.time() - t0:3.2f} seconds.")
        out(f"Residual norm:  {rnorm:3.5e}")
        part = np.where(part < 2, np.rint(part), np.floor(part))
        if part.max() == 0:  # rounding left nothing (a small set): add the strategies the gradient favours
            grad = a.T @ (b * lengths)
            k = int(b.sum() // 2) + 1
            part[np.argsort(-grad)[:k]] += 1
        mixture = mixture + part
        residual = b - a @ part
        out(f"Max residual:   {abs(residual).max()}")
        out(f"Residual on first 8 categories: {np.around(residual[:8], 4)}")
        out(f"Residual on last 8 categories:  {np.around(residual[-8:], 4)}")
        more = np.where(residual < 0, -residual, 0)
        out(f"Added {(more * lengths).sum():3.2e} tokens of padding.")
        padding = padding + more
        b = hist + padding - a @ mixture
        if not np.all(b >= 0):  # pragma: no cover - the reference asserts this; it follows from the algebra
            raise BertpipeError("packing recipe: a negative remainder (the reference's assertion)")
        if b.sum() < NNLS_STOP:
            break
    for length in lengths[b > 0]:  # each leftover sequence: a pack of two, the partner slot padding
        strategy = tuple(sorted([int(length), int(t - length)]))
        if strategy[0] == 0:  # the reference: list.index ValueError; bertpipe: a pack of its own
            log.warning("%d sequence(s) of length %d left after the NNLS rounds: packed alone (NVIDIA's script "
                        "crashes here)", int(b[length - 1]), t)
            strategy = (t,)
        mixture[strategies.index(strategy)] += b[length - 1]
    b = hist - a @ mixture
    padding = np.where(b < 0, -b, 0)
    b = hist + padding - a @ mixture
    if b.sum() != 0:  # pragma: no cover - the reference's assertion
        raise BertpipeError("packing recipe: sequences left unpacked (the reference's assertion)")

    out("Done solving for packing order".center(80, "_"))
    pad_tokens = (lengths * padding).sum()
    pad_tokens_orig = int(((t - lengths) * hist).sum())
    out(f"Number of sequences dropped:  {b.sum()}")
    used = int(np.count_nonzero(mixture))
    out(f"Number of strategies utilized: {used}")
    n_packs = int(mixture.sum())
    compression = 1 - n_packs / n_seq
    out(f"New number of samples: {n_packs:3.2f}, original {n_seq}. A compression ratio of {compression:3.3f}")
    speedup = 1 / (1 - compression)
    out(f"The expected speed-up from packing: {speedup:3.3f}")
    upper = 1.0 / (1 - (1 - float((lengths * hist).sum()) / n_seq / t))
    out(f"Theoretical upper bound on speed-up: {upper:3.3f}")
    avg = ((a.sum(0) * mixture).sum() - padding.sum()) / n_packs
    out(f"Average sequences/sample {avg:3.5f}")
    out(f"Added {pad_tokens:3.2e} padding tokens. Original dataset used {pad_tokens_orig:3.2e} padding tokens")
    efficiency = (n_packs * t - pad_tokens) / (n_packs * t)
    out(f"Packing efficiency (fraction of real tokens): {efficiency:3.4f}")
    out("Top 8 strategies")
    for i in np.argsort(-mixture)[:8]:
        out(f"Strategy {list(strategies[i])} which is used {int(mixture[i])} times")
    out("".center(80, "_"))
    stats = {"sequences": n_seq, "packs": n_packs, "strategies": len(strategies), "strategies_used": used,
             "nnls_rounds": rounds, "padding_tokens": int(pad_tokens), "padding_tokens_unpacked": pad_tokens_orig,
             "speedup": round(float(speedup), 6), "speedup_upper_bound": round(upper, 6),
             "sequences_per_pack": round(float(avg), 6), "packing_efficiency": round(float(efficiency), 6)}
    return Recipe(strategies=strategies, mixture=mixture.astype(np.int64), padding=padding, stats=stats,
                  report=report)


# -- step b: the assignment (the reference's shuffles and index walk) -------------------------------------------------
@dataclass
class Assignment:
    """The packs in order: pack p holds ``seq_len[pack_off[p]:pack_off[p+1]]`` (lengths) with indices ``seq_idx``
    (the index among the length's sequences in input order); ``dest[len_off[L] + i]`` is the place ``q`` of the
    i-th length-L sequence in that order."""

    pack_off: np.ndarray  # int64 (packs + 1)
    seq_len: np.ndarray  # int16 (sequences)
    seq_idx: np.ndarray  # int32 (int64 past 2**31 sequences)
    dest: np.ndarray  # likewise
    len_off: np.ndarray  # int64 (max_seq_length + 2): first index of length L in dest
    empty_packs: int = 0  # packs of padding slots only

    @property
    def packs(self) -> int:
        return len(self.pack_off) - 1


class _Column:
    """A 1-D array written front to back in pieces: in memory, or (``path``) straight into a ``.npy`` file, so
    the full set's plan never holds it (nor a concatenation of its pieces) in memory."""

    def __init__(self, n: int, dtype: Any, path: Path | None) -> None:
        self.n, self.dtype, self.path, self.at = n, np.dtype(dtype), path, 0
        if path is None:
            self.arr = np.empty(n, self.dtype)
            return
        self.tmp = tmp_path(path)
        with open(self.tmp, "wb") as f:
            np.lib.format.write_array_header_1_0(f, {"descr": np.lib.format.dtype_to_descr(self.dtype),
                                                     "fortran_order": False, "shape": (n,)})
        self.fh = open(self.tmp, "ab")  # noqa: SIM115 - closed by done()

    def put(self, values: np.ndarray) -> None:
        v = np.ascontiguousarray(values, dtype=self.dtype)
        if self.path is None:
            self.arr[self.at:self.at + len(v)] = v
        else:
            self.fh.write(v.data)
        self.at += len(v)

    def done(self) -> np.ndarray:
        """The whole array (a read-only memory map of the file, renamed into place)."""
        if self.at != self.n:  # pragma: no cover
            raise BertpipeError(f"packing assignment: {self.at} of {self.n} values written (a bug)")
        if self.path is None:
            return self.arr
        self.fh.close()
        os.replace(self.tmp, self.path)
        return _load(self.path, mmap=True)

    def chunks(self, step: int) -> Iterator[np.ndarray]:
        """The values written, in pieces of ``step`` (read from the file, not mapped)."""
        if self.path is None:
            for a in range(0, self.n, step):
                yield self.arr[a:a + step]
            return
        with open(self.path, "rb") as f:
            np.lib.format.read_magic(f)
            np.lib.format.read_array_header_1_0(f)
            for a in range(0, self.n, step):
                yield np.fromfile(f, dtype=self.dtype, count=min(step, self.n - a))


def assign_packs(histogram: Sequence[int] | np.ndarray, recipe: Recipe, seed: int,
                 chunk_packs: int = 1 << 18, out: Path | None = None) -> Assignment:
    """The reference's assignment: per length 1..T its indices plus ``int(padding)`` None slots, shuffled; the
    strategy instances (strategy order, each ``mixture`` times) shuffled; each instance takes the next slot of
    each of its lengths; None slots are dropped. The shuffles are those of one ``random.Random(seed)``, in that
    order (:class:`preprocessing.pyrandom.Shuffles`: the permutations ``rng.shuffle`` applies, as arrays).

    ``out``: a folder where ``seq_len.npy``, ``seq_idx.npy``, ``pack_off.npy`` and ``dest.npy`` are written as they
    are made (the Assignment then maps them): ~10 bytes a sequence in memory at most (the full set's 157 M in
    ~1.1 GB: the shuffled slots and strategy instances while packs are made, then ``dest``), instead of ~24."""
    from preprocessing.pyrandom import Shuffles

    shuffle = Shuffles(seed).permutation
    hist = np.asarray(histogram, dtype=np.int64)
    t = len(hist)
    pads = [int(p) for p in recipe.padding]
    slot_off = np.concatenate([[0], np.cumsum(hist + np.asarray(pads, dtype=np.int64))])
    # 4-byte indices where they fit (~24 bytes a sequence in all, the full set's 157 M in ~4 GB)
    idt = np.int32 if max(int(slot_off[-1]), int(recipe.mixture.sum())) < (1 << 31) - 1 else np.int64
    slots = np.empty(int(slot_off[-1]), dtype=idt)  # each length's shuffled slots: index, or -1 (None)
    for i in range(t):
        n = int(hist[i])
        perm = shuffle(n + pads[i]).astype(idt)
        perm[perm >= n] = -1
        slots[slot_off[i]:slot_off[i + 1]] = perm
    # the instances (strategy s ``mixture[s]`` times, in strategy order) shuffled: instance i of the shuffled list
    # is the strategy holding position perm[i] of that list, found in place (no list of every instance first)
    instances = shuffle(int(recipe.mixture.sum()))
    ends = np.cumsum(recipe.mixture)
    for c0 in range(0, len(instances), chunk_packs):
        part = instances[c0:c0 + chunk_packs]
        part[:] = np.searchsorted(ends, part, side="right")

    depth = max(len(s) for s in recipe.strategies)
    table = np.zeros((len(recipe.strategies), depth), dtype=np.int16)  # strategy -> its lengths, 0-padded
    for i, s in enumerate(recipe.strategies):
        table[i, :len(s)] = s
    len_off = np.concatenate([[0, 0], np.cumsum(hist)])  # len_off[L]: first index of length L (L = 1..t)
    n_seq = int(hist.sum())
    pack_len = np.zeros(len(instances), dtype=np.int8)
    col_len = _Column(n_seq, np.int16, None if out is None else Path(out) / "seq_len.npy")
    col_idx = _Column(n_seq, idt, None if out is None else Path(out) / "seq_idx.npy")
    ptr = slot_off[:-1].copy()  # next slot of each length
    q = 0
    for c0 in range(0, len(instances), chunk_packs):
        lens = table[instances[c0:c0 + chunk_packs]].reshape(-1)
        pos = np.flatnonzero(lens)
        ls = lens[pos]
        order = stable_argsort(ls)  # each length's slots in pack order
        counts = np.bincount(ls, minlength=t + 1)[1:]
        taken = np.concatenate([slots[ptr[i]:ptr[i] + counts[i]] for i in np.flatnonzero(counts)])
        ptr += counts
        val = np.empty_like(taken)
        val[order] = taken
        real = val >= 0
        pos, ls, val = pos[real], ls[real], val[real]
        pack_len[c0:c0 + chunk_packs] += np.bincount(pos // depth, minlength=len(lens) // depth).astype(np.int8)
        q += len(val)
        col_len.put(ls)
        col_idx.put(val)
    if not np.array_equal(ptr, slot_off[1:]) or q != n_seq:  # pragma: no cover
        raise BertpipeError("packing assignment: slots and strategies do not match (a bug)")
    del slots, instances
    seq_len, seq_idx = col_len.done(), col_idx.done()
    off = _Column(len(pack_len) + 1, np.int64, None if out is None else Path(out) / "pack_off.npy")
    off.put(np.zeros(1, np.int64))
    total = 0
    for c0 in range(0, len(pack_len), chunk_packs):
        part = np.cumsum(pack_len[c0:c0 + chunk_packs], dtype=np.int64) + total
        off.put(part)
        total = int(part[-1])
    pack_off = off.done()
    empty = int(np.count_nonzero(pack_len == 0))
    del pack_len
    # each sequence's place: the q-th of the packs' sequences is dest[len_off[length] + index]
    dest = np.full(n_seq, -1, dtype=idt)
    q = 0
    for ls, val in zip(col_len.chunks(chunk_packs), col_idx.chunks(chunk_packs), strict=True):
        dest[len_off[ls.astype(np.int64)] + val] = np.arange(q, q + len(val), dtype=idt)
        q += len(val)
    if (dest < 0).any():  # pragma: no cover
        raise BertpipeError("packing assignment: a sequence without a place (a bug)")
    if out is not None:
        _save(Path(out) / "dest.npy", dest)
    return Assignment(pack_off=pack_off, seq_len=seq_len, seq_idx=seq_idx, dest=dest, len_off=len_off,
                      empty_packs=empty)


def shard_bounds(n_packs: int, shards_num: int) -> np.ndarray:
    """First pack of each shard (and the end): ``n // N`` packs each, the first ``n % N`` shards one more."""
    size, rem = divmod(n_packs, shards_num)
    k = np.arange(shards_num + 1, dtype=np.int64)
    return k * size + np.minimum(k, rem)


def shard_list_json(seq_len: np.ndarray, seq_idx: np.ndarray, pack_off: np.ndarray) -> str:
    """``json.dumps`` of the packs ``[[(length, index), ...], ...]`` (``pack_off`` relative to the slices)."""
    fast = pack_fast.format_packs(seq_len, seq_idx, pack_off)
    if fast is not None:
        return fast
    items = [f"[{a}, {b}]" for a, b in zip(seq_len.tolist(), seq_idx.tolist(), strict=True)]
    bounds = pack_off.tolist()
    return "[" + ", ".join("[" + ", ".join(items[bounds[p]:bounds[p + 1]]) + "]"
                           for p in range(len(bounds) - 1)) + "]"


def plan_packing(counts: Sequence[dict[str, Any]], scratch: str, cfg: PackNvidiaConfig) -> dict[str, Any]:
    """Step b: the recipe and the assignment from the inputs' histograms, kept in ``scratch`` for the writers;
    returns the recipe's figures and report (JSON types)."""
    check_config(cfg)
    sd = Path(scratch)
    counts = sorted(counts, key=lambda c: c["k"])
    hists = np.asarray([c["hist"] for c in counts], dtype=np.int64).reshape(len(counts), cfg.max_seq_length)
    hist = hists.sum(axis=0)
    if not hist.sum():
        raise InputError("pack-nvidia: the inputs hold no rows; nothing to pack")
    t0 = time.perf_counter()
    recipe = packing_recipe(hist, cfg.max_seq_length, cfg.max_seq_per_sample, say=log.info)
    log.info("pack-nvidia: %d packs of %d sequences; recipe: %d NNLS round(s) in %.1f s", recipe.stats["packs"],
             recipe.stats["sequences"], recipe.stats["nnls_rounds"], time.perf_counter() - t0)
    asg = assign_packs(hist, recipe, cfg.seed, out=sd)  # seq_len, seq_idx, pack_off and dest: written there
    check_shards(cfg.shards_num, len(asg.pack_off) - 1)
    empty = asg.empty_packs
    if empty:
        log.warning("%d pack(s) hold no sequence (every slot of their strategy was padding; NVIDIA's script writes "
                    "them too): a batch holding them has fewer sequences than samples", empty)
    base = np.vstack([np.zeros((1, cfg.max_seq_length), np.int64), np.cumsum(hists, axis=0)])[:-1]
    for name, arr in (("len_off", asg.len_off), ("base", base)):
        _save(sd / f"{name}.npy", arr)
    # the scatter's big arrays past the page cache where they would crowd the memory (the full set's: ~4 bytes a
    # token, read back once by the shard groups; preprocessing.scratch.use_direct)
    tokens = int((hist * np.arange(1, cfg.max_seq_length + 1)).sum())
    _save(sd / DIRECT_FLAG, np.array([use_direct(sd, 4 * tokens)], dtype=np.int8))
    return {"kind": "plan", "stats": {**recipe.stats, "empty_packs": empty}, "report": recipe.report,
            "inputs": len(counts)}


# -- step c: each input's rows, in pack order ---------------------------------------------------------------------------
_SCATTER = ("keys", "seq", "pred", "nsl", "ids", "pos", "mlm")
#: The scatter's arrays of a value a token or masked position (the rest are a value a row). The segment ids: one
#: number a row where each row's are 0s then 1s (``in_<k>_segb.npy``), else a value a token (``in_<k>_seg.npy``,
#: saved as these are): preprocessing.packing.save_segments.
_BIG = ("ids", "pos", "mlm")
#: The plan's choice for the scatter's big arrays: saved past the page cache (1) or through it (0).
DIRECT_FLAG = "scatter_direct.npy"


def scatter_input(k: int, path: str, scratch: str, cfg: PackNvidiaConfig) -> dict[str, Any]:
    """Step c for input ``k``: its rows, compact, sorted by their place in the packs, into scratch."""
    pack_fast.process_space(SPACE_OWNER).keep_only(SCATTER_BUFFERS)
    sd = Path(scratch)
    lengths = _load(sd / f"len_{k:05d}.npy")
    order = stable_argsort(lengths)  # int16 lengths: a radix sort
    lengths = lengths.astype(np.int64)
    base = _load(sd / "base.npy", mmap=True)[k].astype(np.int64)
    len_off = _load(sd / "len_off.npy")
    ls = lengths[order]
    first = np.searchsorted(ls, ls, side="left")  # first row of each row's length, in sorted order
    rank = np.arange(len(ls), dtype=np.int64) - first
    dest = _load(sd / "dest.npy", mmap=True)
    direct = (sd / DIRECT_FLAG).exists() and bool(_load(sd / DIRECT_FLAG)[0])
    keys = np.empty(len(ls), dtype=np.int64)
    keys[order] = dest[len_off[ls] + base[ls - 1] + rank] if len(ls) else np.zeros(0, np.int64)
    p = Path(path)
    ident = sd / f"stat_{k:05d}.npy"
    with InputFile(p) as f:
        if f.n != len(lengths) or (ident.exists() and not np.array_equal(_load(ident), file_identity(p))):
            raise InputError(f"{p} changed while pack-nvidia ran ({f.n} rows, {len(lengths)} counted, or a new "
                             "modification time); run again")
        maps = f.mapped() if pack_fast.available() else None
        if maps is not None:  # padded rows straight from the file into place order: one copy of each value
            pred_file = sd / f"pred_{k:05d}.npy"
            known = _load(pred_file).astype(np.int64) if pred_file.exists() else None
            arrays = _scatter_mapped(maps, lengths, keys, p, known if known is not None and len(known) == f.n
                                     else None)
            for name in _SCATTER:
                _save(sd / f"in_{k:05d}_{name}.npy", arrays[name], direct=direct and name in _BIG)
            save_segments(sd, f"in_{k:05d}", arrays["seg"], arrays["segb"], direct)
            return {"kind": "scatter", "k": k, "rows": len(keys)}
        parts = []
        for a, b in chunks(f.n, cfg.chunk_rows):
            r = f.rows(a, b)
            if not np.array_equal(r.seq, lengths[a:b]):
                raise InputError(f"{p} changed while pack-nvidia ran (rows {a}..{b - 1}); run again")
            parts.append(r)
    rows = Rows.concat(parts)
    perm = distinct_argsort(keys)
    rows = rows.take(perm)
    arrays = {"keys": keys[perm], "seq": rows.seq.astype(np.int16), "pred": rows.pred.astype(np.int16),
              "nsl": rows.nsl, "ids": rows.ids, "seg": rows.seg, "pos": rows.pos, "mlm": rows.mlm}
    for name in _SCATTER:
        _save(sd / f"in_{k:05d}_{name}.npy", arrays[name], direct=direct and name in _BIG)
    save_segments(sd, f"in_{k:05d}", arrays["seg"], None, direct)
    return {"kind": "scatter", "k": k, "rows": len(keys)}


def _scatter_mapped(maps: dict[str, np.ndarray], lengths: np.ndarray, keys: np.ndarray, p: Path,
                    known_pred: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Step c on a padded file's memory maps: the rows in key order, compact (the same arrays as the chunked
    path: ``row[:sum(input_mask)]``, ``positions[:count(positions != 0)]``), each value copied once by the C loop.
    ``lengths``: the count step's, from this file (its masks checked there; :func:`scatter_input` checked that the
    file is the same). ``known_pred``: the masked positions a row, from the count step, which found every row's
    positions non-zeros then zeros (then the compact positions need no check). The segment ids: ``segb``, each
    row's 0s, where every row's are 0s then 1s (``seg`` None), else ``seg``, the values."""
    n, width = maps["input_ids"].shape
    pwidth = maps["masked_lm_positions"].shape[1]
    if maps["input_mask"].shape[1] != width or maps["segment_ids"].shape[1] != width or \
            maps["masked_lm_ids"].shape[1] != pwidth:  # pragma: no cover - InputFile checked the widths
        raise InputError(f"{p}: the widths of its padded datasets differ; the file is not MLPerf padded HDF5")
    seq = np.asarray(lengths, dtype=np.int64)
    if known_pred is None:
        pred = np.empty(n, np.int64)
        step = 1 << 15
        for a in range(0, n, step):
            pred[a:a + step] = np.count_nonzero(maps["masked_lm_positions"][a:a + step], axis=1)
    else:
        pred = known_pred
    perm = distinct_argsort(keys)
    rows_at = perm.astype(np.int64)
    out: dict[str, np.ndarray] = {"keys": keys[perm], "seq": seq[perm].astype(np.int16),
                                  "pred": pred[perm].astype(np.int16)}
    # token ids >= 0 and segment ids 0 or 1 are checked as they are copied (check_compact's rules); a value that
    # breaks them: copied again unbounded and checked as before, for the same one-line refusal
    bounded = True
    space = pack_fast.process_space(SPACE_OWNER)  # the compact values: written to the scratch before the next call
    # the rows read in the file's order, each written to its place (pack_fast.place_runs; the gather in place
    # order below where a value is out of bounds, for its refusal)
    firsts = np.arange(n, dtype=np.int64)
    dests = {}
    for lens in (seq, pred):
        at = np.empty(n, np.int64)
        at[perm] = np.cumsum(lens[perm]) - lens[perm]
        dests[id(lens)] = at
    segb = pack_fast.segment_bounds(maps["segment_ids"].reshape(-1), firsts * width, seq)
    segb = segb[perm] if segb is not None else None
    out["segment_ids"] = None  # type: ignore[assignment]
    for name, dt, w, lens, lo, hi, buf in (("input_ids", "int16", width, seq, 0, None, "ids"),
                                           ("segment_ids", "int8", width, seq, 0, 1, "seg"),
                                           ("masked_lm_positions", "int16", pwidth, pred, None, None, "pos"),
                                           ("masked_lm_ids", "int16", pwidth, pred, 0, None, "mlm")):
        if name == "segment_ids" and segb is not None:  # 0s then 1s, so 0 or 1 (check_compact's rule) each
            continue
        flat = maps[name].reshape(-1)
        placed = pack_fast.place_runs(flat, None, firsts * w, lens, dests[id(lens)], dt, lo=lo, hi=hi, space=space,
                                      name=buf)
        if placed is not None:
            out[name] = placed
            continue
        try:
            out[name] = pack_fast.gather_runs([flat], None, rows_at * w, lens[perm], dt, lo=lo, hi=hi, space=space,
                                              name=buf)
            continue
        except pack_fast.OutOfRange:
            bounded = False
        try:
            out[name] = pack_fast.gather_runs([flat], None, rows_at * w, lens[perm], dt, space=space, name=buf)
        except pack_fast.OutOfRange:
            raise _out_of_range(p, name, dt, _first_bad_row(maps[name], lens, np.iinfo(dt))) from None
    nsl = np.asarray(maps["next_sentence_labels"])
    if not bounded:
        if out["segment_ids"] is None:
            out["segment_ids"] = pack_fast.gather_runs([maps["segment_ids"].reshape(-1)], None, rows_at * width,
                                                       seq[perm], "int8")
        check_compact(p, 0, out["seq"], out["pred"], ids=out["input_ids"], seg=out["segment_ids"],
                      pos=out["masked_lm_positions"], mlm=out["masked_lm_ids"], row_ids=perm)
        raise BertpipeError(f"{p}: a value out of its bounds that check_compact passes (a bug)")
    if known_pred is None:  # else the count step found every row's positions non-zeros then zeros, inside it
        check_compact(p, 0, out["seq"], out["pred"], pos=out["masked_lm_positions"], row_ids=perm)
    info = np.iinfo(np.int8)
    if nsl.size and (nsl.min() < info.min or nsl.max() > info.max):
        raise _out_of_range(p, "next_sentence_labels", "int8",
                            int(np.flatnonzero((nsl < info.min) | (nsl > info.max))[0]))
    return {"keys": out["keys"], "seq": out["seq"], "pred": out["pred"], "nsl": nsl[perm].astype(np.int8),
            "ids": out["input_ids"], "seg": out["segment_ids"], "segb": segb, "pos": out["masked_lm_positions"],
            "mlm": out["masked_lm_ids"]}


def _first_bad_row(values: np.ndarray, lens: np.ndarray, info: np.iinfo) -> int:
    """The first row (file order) whose first ``lens[row]`` values do not all fit ``info``'s type."""
    step = 1 << 14
    for a in range(0, len(values), step):
        v = np.asarray(values[a:a + step])
        keep = np.arange(v.shape[1]) < lens[a:a + step, None]
        bad = (((v < info.min) | (v > info.max)) & keep).any(axis=1)
        if bad.any():
            return a + int(np.flatnonzero(bad)[0])
    raise BertpipeError("pack-nvidia: a value out of range that no row holds (a bug)")  # pragma: no cover


def _out_of_range(p: Path, name: str, dt: str, row: int) -> InputError:
    return InputError(f"{p}: row {row}: {name} holds a value outside {dt}, which NVIDIA's packed format stores (a "
                      "vocabulary over 32,767 entries does not fit)")


# -- step d: groups of shards ----------------------------------------------------------------------------------------
def group_bounds(n_seq: int, shards_num: int, workers: int) -> list[tuple[int, int]]:
    """Contiguous groups of shard indices: about :data:`SEQS_PER_GROUP` sequences each, at least 4 per worker."""
    n = max(1, min(shards_num, max(math.ceil(n_seq / SEQS_PER_GROUP), 4 * max(1, workers))))
    cuts = [shards_num * g // n for g in range(n + 1)]
    return [(a, b) for a, b in zip(cuts, cuts[1:], strict=False) if b > a]


def _input_slices(sd: Path, n_inputs: int, q0: int, q1: int) -> Iterator[tuple[int, int, int, Any, Any, int, int]]:
    """For each input holding rows placed at ``q0..q1-1``: ``(k, a, b, seq, pred, t0, m0)``, its sorted scratch's
    rows a..b-1 (``seq``/``pred``: the scratch maps), and the token and masked-position offsets of row a (sums
    over the rows before it, read once per input and group)."""
    for k in range(n_inputs):
        key = _load(sd / f"in_{k:05d}_keys.npy", mmap=True)
        a, b = (int(x) for x in np.searchsorted(key, [q0, q1]))
        if b <= a:
            continue
        seq = _load(sd / f"in_{k:05d}_seq.npy", mmap=True)
        pred = _load(sd / f"in_{k:05d}_pred.npy", mmap=True)
        yield k, a, b, seq, pred, int(seq[:a].sum(dtype=np.int64)), int(pred[:a].sum(dtype=np.int64))


def _place_order(keys: list[np.ndarray], q0: int, q1: int) -> tuple[np.ndarray, np.ndarray]:
    """The concatenated keys and the order that puts them at places ``q0..q1-1``, each exactly once."""
    key = np.concatenate(keys) if keys else np.zeros(0, np.int64)
    order = distinct_argsort(key)  # checked below: each place once
    if not np.array_equal(key[order], np.arange(q0, q1)):  # pragma: no cover - every sequence exactly once
        raise BertpipeError(f"pack-nvidia: places {q0}..{q1 - 1} are not each held once by the scratch (a bug)")
    return key, order


def _gather(sd: Path, n_inputs: int, q0: int, q1: int) -> Rows:
    """The rows placed at ``q0..q1-1``, in place order, from every input's sorted scratch."""
    if pack_fast.available():
        return _gather_native(sd, n_inputs, q0, q1)
    parts, keys = [], []
    wanted: dict[str, list[tuple[Path, int, int]]] = {name: [] for name in _BIG}
    segs: list[Any] = []
    for k, a, b, seq, pred, t0, m0 in _input_slices(sd, n_inputs, q0, q1):
        t1, m1 = t0 + int(seq[a:b].sum(dtype=np.int64)), m0 + int(pred[a:b].sum(dtype=np.int64))
        keys.append(_load(sd / f"in_{k:05d}_keys.npy", mmap=True)[a:b])
        for name, lo, hi in (("ids", t0, t1), ("pos", m0, m1), ("mlm", m0, m1)):
            wanted[name].append((sd / f"in_{k:05d}_{name}.npy", lo, hi))
        segs.append(segment_item(sd, f"in_{k:05d}", a, b, t0, t1, seq[a:b]))
        parts.append(Rows(seq=seq[a:b], pred=pred[a:b], nsl=_load(sd / f"in_{k:05d}_nsl.npy", mmap=True)[a:b],
                          ids=None, seg=None, pos=None, mlm=None))
    # views of the scratch files (or their slices read past the page cache): Rows.concat reads each once
    space = pack_fast.process_space(SPACE_OWNER)
    for name, slices in wanted.items():
        for part, got in zip(parts, read_slices(slices, space, f"gather-{name}"), strict=True):
            setattr(part, name, got)
    for part, got in zip(parts, segment_slices(segs, space, "gather-seg"), strict=True):
        part.seg = got
    rows = Rows.concat(parts)
    rows.seq, rows.pred = rows.seq.astype(np.int64), rows.pred.astype(np.int64)
    return rows.take(_place_order(keys, q0, q1)[1])


def _gather_native(sd: Path, n_inputs: int, q0: int, q1: int) -> Rows:
    """:func:`_gather` with the C loop: each row's tokens copied once, from the scratch files' memory maps (or their
    slices read past the page cache) straight into place order, each input's slice read in its own order
    (pack_fast.place_runs); segment ids kept as one number a row are filled in place."""
    small: dict[str, list[np.ndarray]] = {"seq": [], "pred": [], "nsl": [], "which": [], "tok": [], "prd": []}
    keys: list[np.ndarray] = []
    srcs: dict[str, list[np.ndarray]] = {"ids": [], "seg": [], "pos": [], "mlm": []}
    wanted: dict[str, list[tuple[Path, int, int]]] = {name: [] for name in _BIG}
    segs: list[Any] = []
    for k, a, b, seq, pred, t0, m0 in _input_slices(sd, n_inputs, q0, q1):
        s_k, p_k = np.asarray(seq[a:b], dtype=np.int64), np.asarray(pred[a:b], dtype=np.int64)
        keys.append(np.asarray(_load(sd / f"in_{k:05d}_keys.npy", mmap=True)[a:b]))
        small["seq"].append(s_k)
        small["pred"].append(p_k)
        small["nsl"].append(np.asarray(_load(sd / f"in_{k:05d}_nsl.npy", mmap=True)[a:b]))
        small["which"].append(np.full(b - a, len(wanted["ids"]), dtype=np.int64))
        small["tok"].append(np.cumsum(s_k) - s_k)  # within the input's slice
        small["prd"].append(np.cumsum(p_k) - p_k)
        t1, m1 = t0 + int(s_k.sum()), m0 + int(p_k.sum())
        for name, lo, hi in (("ids", t0, t1), ("pos", m0, m1), ("mlm", m0, m1)):
            wanted[name].append((sd / f"in_{k:05d}_{name}.npy", lo, hi))
        segs.append(segment_item(sd, f"in_{k:05d}", a, b, t0, t1, s_k))
    order = _place_order(keys, q0, q1)[1]
    cat = {name: np.concatenate(v) if v else np.zeros(0, np.int64) for name, v in small.items()}  # input order
    seq, pred = cat["seq"][order], cat["pred"][order]
    # each input's slice read in its order, each row written to its place (rows of one input: ascending places)
    dests = {}
    for what, lens in (("tok", seq), ("prd", pred)):
        dests[what] = np.empty(len(order), np.int64)
        dests[what][order] = np.cumsum(lens) - lens

    space = pack_fast.process_space(SPACE_OWNER)  # the group's values: its shards written before the next call
    for name, slices in wanted.items():  # each input's slice: a view of its map, or read past the page cache
        srcs[name] = read_slices(slices, space, f"gather-{name}")

    def runs(name: str, at: str, dt: str) -> np.ndarray:
        if not srcs[name]:
            return np.zeros(0, dt)
        lens = cat["seq"] if at == "tok" else cat["pred"]
        got = pack_fast.place_runs(srcs[name], cat["which"], cat[at], lens, dests[at], dt, space=space, name=name)
        if got is None:  # pragma: no cover - the scratch holds values of dt, so the C loop always takes them
            got = pack_fast.gather_runs(srcs[name], cat["which"][order], cat[at][order], lens[order], dt,
                                        space=space, name=name)
        return got

    segb = None
    if segs and all(isinstance(it[0], np.ndarray) for it in segs):  # one number a row: kept so, in place order
        seg, segb = None, np.concatenate([it[0] for it in segs])[order]
    else:
        srcs["seg"] = segment_slices(segs, space, "gather-seg")
        seg = runs("seg", "tok", "int8")
    return Rows(seq=seq, pred=pred, nsl=cat["nsl"][order].astype(np.int8), ids=runs("ids", "tok", "int16"),
                seg=seg, pos=runs("pos", "prd", "int16"), mlm=runs("mlm", "prd", "int16"), segb=segb)


def _write_vlen(ds: Any, flat: np.ndarray, counts: np.ndarray) -> None:
    """``ds[i] = flat[row i]`` for rows of ``counts`` values, back to back, in one HDF5 write: the variable-length
    elements (HDF5's ``hvl_t``: length, pointer) point into ``flat``. The same bytes as h5py's object-array write,
    without a Python object per row."""
    from h5py import h5s, h5t

    n = len(counts)
    if not n:
        return
    flat = np.ascontiguousarray(flat)
    counts = np.asarray(counts, dtype=np.int64)
    hvl = np.empty(n, dtype=[("len", np.uintp), ("p", np.uintp)])
    hvl["len"] = counts
    hvl["p"] = flat.ctypes.data + (np.cumsum(counts) - counts) * flat.itemsize
    from preprocessing.hdf5_io import vlen_write

    vlen_write(ds.id, h5s.create_simple((n,)), ds.id.get_space(), hvl, h5t.vlen_create(h5t.py_create(flat.dtype)))


def write_packed_shard(path: Path, rows: Rows, pack_counts: np.ndarray, outputs: ImageOutputs | None = None) -> None:
    """One packed shard: the seven datasets of ``create_packed_trainset.py`` for packs of ``pack_counts``
    consecutive ``rows``. ``outputs``: built in memory and written in one go (packing.ImageOutputs), else by HDF5's
    file driver (packing.h5_reserved): the same bytes."""
    import h5py

    n = len(pack_counts)
    row_pack = np.repeat(np.arange(n), pack_counts)
    tok = np.concatenate([[0], np.cumsum(rows.seq)])  # first token of each row (and the end)
    pack_tok = tok[np.concatenate([[0], np.cumsum(pack_counts)])[:-1]]  # first token of each pack
    shift = tok[:-1] - pack_tok[row_pack]  # where each sequence starts in its pack
    # in int16 from the start: the same values as the sum in int64 cast to int16 (both modulo 2**16), without
    # the int64 arrays (8 bytes a masked position, twice)
    pos = np.add(rows.pos, np.repeat(shift.astype(np.int16), rows.pred), dtype=np.int16)
    tok_counts = np.bincount(row_pack, weights=rows.seq, minlength=n).astype(np.int64)
    pred_counts = np.bincount(row_pack, weights=rows.pred, minlength=n).astype(np.int64)
    values = {"input_ids": (rows.ids, tok_counts),
              "segment_ids": (rows.segment_ids(pack_fast.process_space(SPACE_OWNER)), tok_counts),
              "packed_input_len": (rows.seq.astype(np.int16), pack_counts),
              "masked_lm_positions": (pos, pred_counts), "masked_lm_ids": (rows.mlm, pred_counts),
              "packed_masked_lm_len": (rows.pred.astype(np.int16), pack_counts),
              "next_sentence_labels": (rows.nsl.astype(np.int8), pack_counts)}
    # its disk space reserved first (a full disk fails the reservation, never an HDF5 write): at most the values,
    # 16 bytes a row in the dataset and ~24 in the global heap, the heaps' collections' slack, the metadata
    data = sum(values[name][0].size * np.dtype(dt).itemsize for name, dt in PACKED_DATASETS)
    bound = 2 * data + 64 * n * len(PACKED_DATASETS) + (1 << 20)
    with (outputs.create(path, bound) if outputs is not None else h5_reserved(path, bound)) as f:
        for name, dt in PACKED_DATASETS:
            ds = f.create_dataset(name, (n,), dtype=h5py.vlen_dtype(np.dtype(dt)), compression=None)
            flat, counts = values[name]
            _write_vlen(ds, flat.astype(dt, copy=False), counts)
        del ds


def write_shard_group(s0: int, s1: int, scratch: str, out_dir: str, cfg: PackNvidiaConfig,
                      n_inputs: int) -> dict[str, Any]:
    """Step d: shards ``s0..s1-1`` (their shard lists and packed HDF5), each written to a temporary name, closed
    and renamed; returns their entries ``[name, bytes, md5]`` and how many hold no pack."""
    sd, od = Path(scratch), Path(out_dir)
    pack_off = _load(sd / "pack_off.npy", mmap=True)
    bounds = shard_bounds(len(pack_off) - 1, cfg.shards_num)
    p0, p1 = int(bounds[s0]), int(bounds[s1])
    q0, q1 = int(pack_off[p0]), int(pack_off[p1])
    rows = _gather(sd, n_inputs, q0, q1)
    seq_len = np.array(_load(sd / "seq_len.npy", mmap=True)[q0:q1])
    seq_idx = np.array(_load(sd / "seq_idx.npy", mmap=True)[q0:q1])
    if not np.array_equal(seq_len, rows.seq):  # pragma: no cover
        raise BertpipeError("pack-nvidia: the scratch rows' lengths differ from the plan's (a bug)")
    offs = np.array(pack_off[p0:p1 + 1], dtype=np.int64) - q0
    tok = np.concatenate([[0], np.cumsum(rows.seq)])
    prd = np.concatenate([[0], np.cumsum(rows.pred)])
    done: list[str] = []
    empty = 0
    # the shards built in memory, written past the page cache where the scratch is (the outputs are as large), and
    # hashed from memory; built in the group's read buffers of token ids, masked positions and their ids, dead now
    # that the rows are in place order (at full size's ~0.5 M sequences a group: 0.55 GB, which the images no
    # longer take again; on 8 parts the token ids' held 6 of the ~60 MB shards, the three 9 of a group's 14: md5
    # at 4.4 GB/s where it was 2.9)
    space = pack_fast.process_space(SPACE_OWNER)
    outputs = ImageOutputs(space, direct=(sd / DIRECT_FLAG).exists() and bool(_load(sd / DIRECT_FLAG)[0]),
                           spare=[space.spare(f"gather-{name}") for name in ("ids", "pos", "mlm")])
    try:
        # each file's writeback started as it closes, all fsynced after their md5s; the images written behind
        # (ImageOutputs.BEHIND), every write done when the block ends
        with outputs, late_fsyncs():
            for s in range(s0, s1):
                a, b = int(bounds[s]) - p0, int(bounds[s + 1]) - p0
                r0, r1 = int(offs[a]), int(offs[b])
                text = shard_list_json(seq_len[r0:r1], seq_idx[r0:r1], offs[a:b + 1] - r0)
                final = od / list_name(s)
                tmp = tmp_path(final)
                tmp.write_text(text, encoding="utf-8")
                os.replace(tmp, final)
                done.append(final.name)
                final = od / shard_name(s, cfg)
                tmp = tmp_path(final)
                write_packed_shard(tmp, rows.slice(r0, r1, tok, prd), np.diff(offs[a:b + 1]), outputs)
                outputs.rename(tmp, final)
                done.append(final.name)
                empty += b == a
            known = outputs.md5s()
    except BaseException as exc:
        for p in od.glob(f".*.tmp-{os.getpid()}"):
            p.unlink(missing_ok=True)
        raise_if_disk_full(exc, final)
        raise
    paths = [od / n for n in done]
    return {"kind": "shards", "s0": s0, "s1": s1, "empty": empty,
            "entries": [[n, p.stat().st_size, md5]
                        for n, p, md5 in zip(done, paths, md5_then_fsync(paths, known), strict=True)]}


# -- the manifest, and all steps in one call ------------------------------------------------------------------------
def begin(out_dir: Path | str, fresh_scratch: bool = True) -> Path:
    """Before outputs are written into ``out_dir``: no manifest (the stage is being redone), no debris, and
    (``fresh_scratch``) an empty scratch folder; returns the scratch folder."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    (d / MANIFEST_NAME).unlink(missing_ok=True)
    (d / DROPPED_NAME).unlink(missing_ok=True)
    remove_debris(d)
    sd = d / SCRATCH
    if fresh_scratch:
        shutil.rmtree(sd, ignore_errors=True)
    sd.mkdir(exist_ok=True)
    return sd


def finish_pack(out_dir: Path | str, plan: dict[str, Any], written: Sequence[dict[str, Any]],
                cfg: PackNvidiaConfig, upstream: Sequence[Manifest] = ()) -> Manifest:
    """The stage manifest (written last) from the groups' entries; the scratch folder removed."""
    got = {e[0] for w in written for e in w["entries"]}
    missing = [n for n in output_names(cfg) if n not in got]
    if missing:  # pragma: no cover - the groups cover every shard by construction
        raise BertpipeError(f"pack-nvidia: {len(missing)} file(s) were not written (e.g. {missing[0]}); run again")
    shutil.rmtree(Path(out_dir) / SCRATCH, ignore_errors=True)
    with StageOutput(out_dir, "pack_nvidia", params=stage_params(cfg), upstream=upstream,
                     code_version=STAGE_VERSION) as out:
        for w in sorted(written, key=lambda w: w["s0"]):
            for name, _size, md5 in w["entries"]:
                out.add_file(name, md5)
        for key, value in plan["stats"].items():
            out.count(key, value)
        out.count("shards", cfg.shards_num)
        out.count("empty_shards", sum(w["empty"] for w in written))
    return out.manifest


_OURS = re.compile(r"^(shard_list_\d{5,}\.lst|part_\d{5,}\.hdf5|output_\d{5,})$")


def check_out_dir(out_dir: Path | str, cfg: PackNvidiaConfig) -> list[Path]:
    """Refuse an output folder holding files this stage would not write (NVIDIA's trainer reads every file of
    the folder whose name holds ``part_``); returns the stale outputs of an earlier run (other shard counts or
    names), which go when the stage starts."""
    d = Path(out_dir)
    if not d.is_dir():
        return []
    expected = set(output_names(cfg)) | {MANIFEST_NAME}
    stale, foreign = [], []
    for p in sorted(d.iterdir()):
        if p.name.startswith(".") or p.name in expected or p.is_dir():
            continue
        (stale if _OURS.match(p.name) else foreign).append(p)
    if foreign:
        more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
        names = ", ".join(p.name for p in foreign[:3])
        raise InputError(f"output folder {d} holds files pack-nvidia would not write ({names}{more}); NVIDIA's "
                         "trainer would read those named part_*: choose an empty or new folder")
    return stale


def run_pack_nvidia(input_files: Sequence[Path | str], out_dir: Path | str,
                    cfg: PackNvidiaConfig = PackNvidiaConfig(), upstream: Sequence[Manifest] = (), *,
                    workers: int = 1) -> Manifest:
    """Stage function: NVIDIA's packed set from ``input_files`` (in this order) into ``out_dir``:
    ``shard_list_NNNNN.lst`` and ``part_NNNNN.hdf5`` for NNNNN < shards_num, then ``_manifest.json``.
    Counters: sequences, packs, speedup (the reference's "expected speed-up"), strategies_used, padding_tokens,
    shards, empty_shards, ... The bytes do not depend on ``workers``."""
    check_config(cfg)
    files = [str(p) for p in input_files]
    if not files:
        raise InputError("pack-nvidia got no input files")
    verify_inputs([Path(p) for p in files], upstream, workers=workers)
    out = Path(out_dir)
    stale = check_out_dir(out, cfg)
    sd = begin(out)
    for p in stale:  # an earlier run's shards that this one does not write: a trainer would read them
        p.unlink(missing_ok=True)
    try:
        with shared_pool(workers) as pool:  # one pool for the three parallel steps
            counts = run_all(count_lengths, [(k, p, str(sd), cfg) for k, p in enumerate(files)], workers, pool)
            plan = plan_packing(counts, str(sd), cfg)
            run_all(scatter_input, [(k, p, str(sd), cfg) for k, p in enumerate(files)], workers, pool)
            groups = group_bounds(plan["stats"]["sequences"], cfg.shards_num, workers)
            written = run_all(write_shard_group, [(a, b, str(sd), str(out), cfg, len(files)) for a, b in groups],
                              workers, pool)
        return finish_pack(out, plan, written, cfg, upstream)
    except BaseException:  # no manifest: the shards this run wrote are removed (the earlier run's went at begin)
        for name in output_names(cfg):
            p = out / name
            if os.path.isfile(p) and not os.path.islink(p):
                p.unlink(missing_ok=True)
        raise
    finally:
        forget_scratch_maps(sd)  # this process's maps of it: the space freed
        shutil.rmtree(sd, ignore_errors=True)


# -- the DAG's declaration (core/stage.py); the lead adds it to preprocessing/registry.py ---------------------------
def _count_piece(k: int, path: str, hdf5_dir: str, out_dir: Path, cfg: PackNvidiaConfig) -> dict[str, Any]:
    verify_manifest(hdf5_dir, trust_stat=True)
    sd = Path(out_dir) / SCRATCH
    sd.mkdir(parents=True, exist_ok=True)
    return count_lengths(k, path, str(sd), cfg)


def _plan_piece(counts: list[dict[str, Any]], out_dir: Path, cfg: PackNvidiaConfig) -> dict[str, Any]:
    return plan_packing(counts, str(Path(out_dir) / SCRATCH), cfg)


def _scatter_piece(k: int, path: str, out_dir: Path, cfg: PackNvidiaConfig) -> dict[str, Any]:
    return scatter_input(k, path, str(Path(out_dir) / SCRATCH), cfg)


def _group_piece(s0: int, s1: int, n_inputs: int, out_dir: Path, cfg: PackNvidiaConfig) -> dict[str, Any]:
    return write_shard_group(s0, s1, str(Path(out_dir) / SCRATCH), str(out_dir), cfg, n_inputs)


def _inputs(plan: Any) -> list[tuple[str, str]]:
    h5 = plan.result("hdf5")
    return [(str(h5.path(s + ".hdf5", s)), str(h5.unit_dir(s))) for s in h5.shards]


def _piece(plan: Any, fn: Callable[..., Any], shard: str, *args: Any) -> Any:
    return replace(plan.unit(*args, cfg=plan.cfg, shard=shard, upstream=[]), run=fn, piece=True,
                   pass_upstream=False, out_dir=str(plan.dir))


def _plan_dag(plan: Any) -> list[Any]:
    """Phase 1: count every part's HDF5 (part order: NVIDIA's gather concatenates the parts). Nothing is removed
    here: the DAG asks "done?" after planning."""
    return [_piece(plan, _count_piece, f"count/{k:05d}", k, path, d) for k, (path, d) in enumerate(_inputs(plan))]


def _finish_dag(plan: Any, values: list[dict[str, Any]]) -> Manifest | list[Any]:
    """Then the plan (one piece), the scatter (per part), the shard groups, the manifest."""
    kinds = {v["kind"] for v in values}
    inputs = _inputs(plan)
    if "plan" not in kinds:
        counts = [v for v in values if v["kind"] == "lengths"]
        begin(plan.dir, fresh_scratch=False)  # the stage is being redone: its manifest and debris go first
        return [_piece(plan, _plan_piece, "plan", counts)]
    pl = next(v for v in values if v["kind"] == "plan")
    if "scatter" not in kinds:
        return [_piece(plan, _scatter_piece, f"scatter/{k:05d}", k, path) for k, (path, _) in enumerate(inputs)]
    if "shards" not in kinds:
        workers = plan.params.workers or default_workers()
        return [_piece(plan, _group_piece, f"shards/{a:05d}", a, b, len(inputs))
                for a, b in group_bounds(pl["stats"]["sequences"], plan.cfg.shards_num, workers)]
    h5 = plan.result("hdf5")
    upstream = [m for m in (load_manifest(h5.unit_dir(s)) for s in h5.shards) if m is not None]
    return finish_pack(plan.dir, pl, [v for v in values if v["kind"] == "shards"], plan.cfg, upstream)


def configure(p: Any) -> PackNvidiaConfig:
    """The run's parameters (preprocessing.params.DataParams) -> the stage's config; 4,320 shards (on the built-in
    sample: its shards per bin)."""
    resolved = getattr(p, "resolved_nvidia_packed_shards", None)
    return PackNvidiaConfig(max_seq_length=getattr(p, "max_seq_length", 512),
                            max_seq_per_sample=getattr(p, "max_sequences_per_pack", 3),
                            shards_num=resolved() if resolved else getattr(p, "nvidia_packed_shards", None) or 4320,
                            seed=getattr(p, "pack_seed", DEFAULT_SEED))


DAG_STAGES = (Stage(name="nvidia_packed", title="pack_nvidia: NVIDIA's packed set (<= 3 sequences a sample), "
                    "what its trainer reads with --packed_samples",
                    reads=("hdf5",), run=run_pack_nvidia, version=STAGE_VERSION, config=PackNvidiaConfig,
                    configure=configure, key_params=stage_params, plan=_plan_dag, finish=_finish_dag,
                    when=lambda p: "nvidia-packed" in getattr(p, "targets", ()),
                    outputs={"nvidia_packed_dir": ""}, aliases=("pack_nvidia", "packed")),)
