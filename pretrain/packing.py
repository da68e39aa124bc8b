"""Packed pre-training data: several sequences in one row, read for ``bertpipe train --packed``.

A packed row holds up to N whole sequences one after the other, padded at the end to the row width L. The
trainer reads two packed layouts, recognised by their datasets (:func:`packed_layout`):

* ``habana``: HabanaAI/Model-References ``PyTorch/nlp/bert/data/pack_pretraining_data_pytorch.py``
  (``mixed_strategies_part_<k>.hdf5``), fixed-width rows:
  ``input_ids (n,L) i4``; ``input_mask (n,L) i4``: each token's sequence number 1..k, 0 = padding;
  ``segment_ids (n,L) i1``; ``positions (n,L) i4``: 0, 1, ... restarting at each sequence;
  ``masked_lm_positions (n,P) i4``: positions in the row, 0-padded, P = max_predictions_per_sequence +
  max_sequences_per_pack (the script's defaults: 80 + 3); ``masked_lm_ids (n,P) i4``;
  ``next_sentence_positions (n,N) i4``: each sequence's [CLS] in the row; ``next_sentence_labels (n,N) i1``;
  ``next_sentence_weights (n,N) i4``: 1 for a sequence, 0 for an empty slot (N = max_sequences_per_pack, 3).
* ``nvidia``: MLPerf training_results_v3.x NVIDIA ``input_preprocessing/packed_data/create_packed_trainset.py``
  (files ``output_<k>``, no suffix), variable-length rows (h5py vlen): ``input_ids`` int16 and
  ``segment_ids`` int8 (the row's real tokens, sequence after sequence), ``packed_input_len`` int16 (each
  sequence's length), ``masked_lm_positions`` int16 (positions in the row), ``masked_lm_ids`` int16,
  ``packed_masked_lm_len`` int16 (masked tokens per sequence), ``next_sentence_labels`` int8 (per sequence).
  Rows are padded to :data:`NVIDIA_ROW_WIDTH` (512, NVIDIA's ``--max_seq_length``), the prediction slots to
  at least :data:`NVIDIA_PRED_WIDTH` and the sequence slots to at least :data:`NVIDIA_MAX_SEQUENCES`.

Both become the batch layout :data:`PACKED_FIELDS` (Habana's names, int64), which
``BertForPreTraining.forward`` takes as keyword arguments. A packed folder is one "bin" of width L for
:class:`pretrain.data.BinnedSampler`: its packs are split into equal slices per rank, shuffled per epoch,
and the sampler's position (epoch, micro-batch) and the RNG states resume exactly as for binned data.
``--micro-batch`` counts packs.

The rest of the module packs padded rows (the golden HDF5 layout) into those layouts: a best-fit-decreasing
packer (:func:`best_fit_packs`, at most N sequences a pack) and writers for both layouts, for the tests'
fixtures and ``bench/bench_train_packed.py``. It is not Habana's NNLS recipe nor NVIDIA's strategy
(``bertpipe pack-habana`` / ``pack-nvidia`` make those files).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from core import schema as _schema
from core.errors import InputError
from core.schema import H5_ERRORS

log = logging.getLogger(__name__)

#: The batch layout of packed rows (Habana's dataset names), in the order the model's forward takes them.
PACKED_FIELDS = _schema.PACKED_FIELDS
#: Habana's HDF5 dtypes (pack_pretraining_data_pytorch.py's create_dataset calls).
HABANA_DTYPES = {"input_ids": "i4", "input_mask": "i4", "segment_ids": "i1", "positions": "i4",
                 "masked_lm_positions": "i4", "masked_lm_ids": "i4", "next_sentence_positions": "i4",
                 "next_sentence_labels": "i1", "next_sentence_weights": "i4"}
_HABANA_KIND = {"input_ids": "seq", "input_mask": "seq", "segment_ids": "seq", "positions": "seq",
                "masked_lm_positions": "pred", "masked_lm_ids": "pred", "next_sentence_positions": "nsp",
                "next_sentence_labels": "nsp", "next_sentence_weights": "nsp"}
#: NVIDIA's vlen datasets and their element dtypes (create_packed_trainset.py).
NVIDIA_DTYPES = {"input_ids": "int16", "segment_ids": "int8", "packed_input_len": "int16",
                 "masked_lm_positions": "int16", "masked_lm_ids": "int16", "packed_masked_lm_len": "int16",
                 "next_sentence_labels": "int8"}
NVIDIA_ROW_WIDTH = 512  # NVIDIA's trainer pads every packed row to --max_seq_length 512
NVIDIA_PRED_WIDTH = 79  # 76 predictions + 3 sequences (the width Habana's README gives its packed rows)
NVIDIA_MAX_SEQUENCES = 3  # --max_pack_factor / --max_seq_per_sample
LAYOUTS = ("habana", "nvidia")


def layout_of(keys) -> str | None:  # noqa: ANN001 - any iterable of dataset names
    """'habana', 'nvidia' or None (not packed) from a file's dataset names."""
    keys = set(keys)
    if {"positions", "next_sentence_positions"} <= keys:
        return "habana"
    if {"packed_input_len", "packed_masked_lm_len"} <= keys:
        return "nvidia"
    return None


def _open(path: Path):
    import h5py

    try:
        return h5py.File(path, "r")
    except H5_ERRORS as exc:
        raise InputError(f"cannot read packed HDF5 file {path}: {exc}. The file is corrupt or truncated: "
                         "re-create it (pack-habana / pack-nvidia)") from exc


def packed_layout(path: Path | str) -> str | None:
    """The packed layout of one HDF5 file, or None when it holds unpacked rows (or no datasets)."""
    with _open(Path(path)) as h:
        try:
            return layout_of(h.keys())
        except H5_ERRORS as exc:
            raise InputError(f"cannot list the datasets of {path} ({type(exc).__name__}: {exc}); the file is "
                             "corrupt: re-create it") from exc


def _is_hdf5(path: Path) -> bool:
    try:
        with open(path, "rb") as f:  # the HDF5 signature at offset 0 (a user block would move it: not ours)
            return f.read(8) == b"\x89HDF\r\n\x1a\n"
    except OSError:
        return False


def packed_files(train: Path | str) -> tuple[str, list[Path]] | None:
    """(layout, files) when ``train`` is a packed HDF5 file or a folder of them, else None.

    A folder's HDF5 files are its regular files whose first bytes are HDF5's signature (NVIDIA's have no
    suffix), in name order; the first one decides whether the folder is packed. A stage directory
    (``_manifest.json`` beside ``data/``) stands for its ``data/``.
    """
    train = Path(train)
    if train.is_file():
        layout = packed_layout(train) if _is_hdf5(train) else None
        return (layout, [train]) if layout else None
    if not train.is_dir():
        return None
    if (train / "_manifest.json").is_file() and (train / "data").is_dir():
        train = train / "data"
    files = sorted(p for p in train.iterdir() if not p.name.startswith(".") and p.is_file() and _is_hdf5(p))
    if not files:
        return None
    layout = packed_layout(files[0])
    return (layout, files) if layout else None


def inspect_packed(path: Path, layout: str):
    """Check one packed file's datasets; its :class:`pretrain.data.Shard` (rows = packs, bound = row width)."""
    from pretrain.data import Shard

    with _open(path) as h:
        try:
            keys = set(h.keys())
            if layout_of(keys) != layout:
                raise InputError(f"packed file {path} is not in the {layout} layout of the folder's first file "
                                 f"(its datasets: {', '.join(sorted(keys)) or 'none'}); keep one layout per folder")
            if layout == "habana":
                return _inspect_habana(h, path, Shard)
            missing = [k for k in NVIDIA_DTYPES if k not in keys]
            if missing:
                raise InputError(f"NVIDIA packed file {path} lacks dataset(s) {', '.join(missing)}; expected "
                                 f"{', '.join(NVIDIA_DTYPES)} (create_packed_trainset.py). Re-create it")
            shapes = {k: h[k].shape for k in NVIDIA_DTYPES}
            if any(len(s) != 1 or s[0] != shapes["input_ids"][0] for s in shapes.values()):
                raise InputError(f"NVIDIA packed file {path}: datasets of different row counts or ranks "
                                 f"({', '.join(f'{k} {s}' for k, s in shapes.items())}); re-create it")
            return Shard(path, int(shapes["input_ids"][0]), NVIDIA_ROW_WIDTH)
        except InputError:
            raise
        except H5_ERRORS as exc:
            raise InputError(f"cannot read the datasets of packed file {path} ({type(exc).__name__}: {exc}); "
                             "the file is corrupt: re-create it") from exc


def _inspect_habana(h, path: Path, shard_type):  # noqa: ANN001 - an open h5py.File, the Shard class
    missing = [k for k in PACKED_FIELDS if k not in h]
    if missing:
        raise InputError(f"Habana packed file {path} lacks dataset(s) {', '.join(missing)}; expected "
                         f"{', '.join(PACKED_FIELDS)} (pack_pretraining_data_pytorch.py). Re-create it")
    shapes = {k: h[k].shape for k in PACKED_FIELDS}
    n = shapes["input_ids"][0] if len(shapes["input_ids"]) == 2 else -1
    widths = {kind: {shapes[k][1:] for k in PACKED_FIELDS if _HABANA_KIND[k] == kind} for kind in ("seq", "pred", "nsp")}
    if (any(len(s) != 2 or s[0] != n for s in shapes.values()) or any(len(w) != 1 for w in widths.values())):
        raise InputError(f"Habana packed file {path}: datasets of the wrong shapes "
                         f"({', '.join(f'{k} {s}' for k, s in shapes.items())}); expected (packs, width) each, "
                         "one width for the token, prediction and sequence datasets each; re-create it")
    return shard_type(path, int(n), int(shapes["input_ids"][1]))


def _rows_by_file(file_idx: np.ndarray, rows: np.ndarray):
    """(file, positions in the batch, sorted unique rows, inverse): h5py reads increasing indices only."""
    for f in np.unique(file_idx):
        sel = np.nonzero(file_idx == f)[0]
        uniq, inv = np.unique(rows[sel], return_inverse=True)
        yield int(f), sel, uniq, inv


def read_habana(shards: list, file_idx: np.ndarray, rows: np.ndarray, bound: int,
                handles: dict[int, object]) -> dict[str, np.ndarray]:
    """The given (file, pack) rows of Habana packed files, in order, as the batch layout (int64)."""
    out: dict[str, np.ndarray] = {}
    for f, sel, uniq, inv in _rows_by_file(file_idx, rows):
        if f not in handles:
            handles[f] = _open(shards[f].path)
        h = handles[f]
        for k in PACKED_FIELDS:
            try:
                data = h[k][uniq]
            except H5_ERRORS as exc:
                raise InputError(f"cannot read {k} rows of packed file {shards[f].path}: {exc}; the file is "
                                 "corrupt: re-create it") from exc
            if k not in out:
                out[k] = np.empty((len(rows), *data.shape[1:]), dtype=np.int64)
            out[k][sel] = data[inv]
    return out


def read_nvidia(shards: list, file_idx: np.ndarray, rows: np.ndarray, bound: int,
                handles: dict[int, object]) -> dict[str, np.ndarray]:
    """The given (file, pack) rows of NVIDIA packed files, in order, as the batch layout (int64, rows padded
    to ``bound``)."""
    got: dict[str, list] = {k: [None] * len(rows) for k in NVIDIA_DTYPES}
    for f, sel, uniq, inv in _rows_by_file(file_idx, rows):
        if f not in handles:
            handles[f] = _open(shards[f].path)
        h = handles[f]
        for k in NVIDIA_DTYPES:
            try:
                data = h[k][uniq]
            except H5_ERRORS as exc:
                raise InputError(f"cannot read {k} rows of packed file {shards[f].path}: {exc}; the file is "
                                 "corrupt: re-create it") from exc
            for i, j in zip(sel, inv, strict=True):
                got[k][i] = np.asarray(data[j], dtype=np.int64)
    n = len(rows)
    where = lambda i: f"pack {rows[i]} of {shards[file_idx[i]].path}"  # noqa: E731
    n_pred = max([NVIDIA_PRED_WIDTH] + [len(p) for p in got["masked_lm_positions"]])
    n_seq = max([NVIDIA_MAX_SEQUENCES] + [len(p) for p in got["packed_input_len"]])
    out = {k: np.zeros((n, bound), np.int64) for k in _schema.PACKED_TOKEN_FIELDS}
    out.update({k: np.zeros((n, n_pred), np.int64) for k in _schema.PACKED_PRED_FIELDS})
    out.update({k: np.zeros((n, n_seq), np.int64) for k in _schema.PACKED_SEQUENCE_FIELDS})
    for i in range(n):
        ids, lens = got["input_ids"][i], got["packed_input_len"][i]
        total, k = int(lens.sum()), len(lens)
        if total != len(ids) or total > bound or (lens <= 0).any() or len(got["segment_ids"][i]) != total \
                or len(got["next_sentence_labels"][i]) != k \
                or len(got["masked_lm_ids"][i]) != len(got["masked_lm_positions"][i]):
            raise InputError(f"{where(i)}: inconsistent packed row (packed_input_len {lens.tolist()}, "
                             f"{len(ids)} input_ids, {len(got['next_sentence_labels'][i])} labels; rows may "
                             f"hold at most {bound} tokens); re-create the file")
        starts = np.concatenate([[0], np.cumsum(lens)[:-1]])
        out["input_ids"][i, :total] = ids
        out["segment_ids"][i, :total] = got["segment_ids"][i]
        out["input_mask"][i, :total] = np.repeat(np.arange(1, k + 1), lens)
        out["positions"][i, :total] = np.arange(total) - np.repeat(starts, lens)
        m = len(got["masked_lm_positions"][i])
        out["masked_lm_positions"][i, :m] = got["masked_lm_positions"][i]
        out["masked_lm_ids"][i, :m] = got["masked_lm_ids"][i]
        out["next_sentence_positions"][i, :k] = starts
        out["next_sentence_labels"][i, :k] = got["next_sentence_labels"][i]
        out["next_sentence_weights"][i, :k] = 1
    return out


READERS = {"habana": read_habana, "nvidia": read_nvidia}


def discover_packed(train: Path | str) -> tuple[str, dict[int, list]] | None:
    """(layout, {row width: shards}) for packed training data, None for unpacked data."""
    found = packed_files(train)
    if found is None:
        return None
    layout, files = found
    shards = [inspect_packed(p, layout) for p in files]
    widths = sorted({s.bound for s in shards})
    if len(widths) > 1:
        raise InputError(f"packed files of {train} have different row widths {widths}; pack them to one "
                         "max length (--max_sequence_length)")
    if sum(s.rows for s in shards) == 0:
        raise InputError(f"packed training data {train} has no rows")
    return layout, {widths[0]: shards}


#: The packing rate when neither the flag nor the data gives one: NVIDIA's --average_packing_rate default, and
#: Habana's avg_seq_per_sample at 512 without its metadata file.
DEFAULT_PACKING_RATE = 2.0


def recorded_packing_rate(train: Path | str) -> tuple[float, str] | None:
    """The mean sequences per pack that packed data ``train`` records about itself, and where: Habana's
    ``<train>_metadata.json`` beside the folder (``avg_seq_per_sample``: the file Habana's trainer reads), or
    the manifest pack-nvidia writes into its folder (``counters.sequences_per_pack``). None when neither is there;
    one that is there but unusable is skipped with a warning naming it."""
    import json

    t = Path(train)
    folder = t if t.is_dir() else t.parent
    for path, keys in ((folder.parent / f"{folder.name}_metadata.json", ("avg_seq_per_sample",)),
                       (folder / "_manifest.json", ("counters", "sequences_per_pack"))):
        if not path.is_file():
            continue
        try:
            value = json.loads(path.read_text(encoding="utf-8"))
            for key in keys:
                value = value[key]
            rate = float(value)
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, IndexError) as exc:
            log.warning("%s holds no usable %s (%s: %s): ignored", path, ".".join(keys), type(exc).__name__, exc)
            continue
        if not 0.0 < rate <= 64.0:
            log.warning("%s: %s = %r is not a mean number of sequences per pack (0 < x <= 64): ignored", path,
                        ".".join(keys), value)
            continue
        return rate, f"{path} {'.'.join(keys)}"
    return None


def packing_rate(flag: float, train: Path | str) -> tuple[float, str]:
    """The packing rate of a packed run and where it comes from: ``flag`` (``--average-packing-rate``) when
    positive, else the data's recorded figure (:func:`recorded_packing_rate`), else :data:`DEFAULT_PACKING_RATE`."""
    if flag > 0:
        return float(flag), "--average-packing-rate"
    found = recorded_packing_rate(train)
    if found is not None:
        return found
    return DEFAULT_PACKING_RATE, (f"the default {DEFAULT_PACKING_RATE:g} (no figure recorded with the data: "
                                  "--average-packing-rate sets it)")


def mlperf_global_batch(packs: int, rate: float) -> int:
    """MLPerf's global batch size, in sequences, of a step of ``packs`` packs at ``rate`` sequences a pack (as
    NVIDIA logs packed runs: packs x average packing rate)."""
    return max(1, round(packs * rate))


def mean_sequences_per_pack(train: Path | str, chunk: int = 1 << 20) -> float:
    """The mean number of sequences a pack of the packed data ``train`` holds, counted over every pack of every
    file (Habana's ``avg_seq_per_sample``, measured instead of read from its metadata file: NVIDIA's packs have
    none). Habana's layout: the nonzero ``next_sentence_weights``; NVIDIA's: the entries of ``packed_input_len``."""
    found = packed_files(train)
    if found is None:
        raise InputError(packed_refusal(train))
    layout, files = found
    sequences = packs = 0
    for path in files:
        with _open(path) as h:
            try:
                ds = h["next_sentence_weights" if layout == "habana" else "packed_input_len"]
                for start in range(0, ds.shape[0], chunk):
                    part = ds[start:start + chunk]
                    sequences += (int(np.count_nonzero(part)) if layout == "habana"
                                  else sum(len(lens) for lens in part))
                packs += ds.shape[0]
            except H5_ERRORS as exc:
                raise InputError(f"cannot count the sequences of packed file {path} ({type(exc).__name__}: "
                                 f"{exc}); the file is corrupt: re-create it") from exc
    if not packs:
        raise InputError(f"packed training data {train} has no rows")
    return sequences / packs


def training_sampler(train_dir: str, packed: bool, micro_batch: int, rank: int = 0, world: int = 1,
                     seed: int = 12345, vocab_size: int | None = None, mix: str = "one-bin",
                     counts: tuple[int, ...] | None = None):
    """The :class:`pretrain.data.BinnedSampler` of a run: packed when the data is (detected from its files);
    ``packed=True`` (``--packed``) on unpacked data is refused. ``mix``/``counts``: the padded rows' batch mix
    (pretrain/batch_mix.py); packed rows are of one width, so their batches are one-bin (``split`` is refused).
    Returns (sampler, layout or None)."""
    from pretrain.data import BinnedSampler, discover_shards

    found = discover_packed(train_dir)
    if found is None:
        if packed:
            raise InputError(packed_refusal(train_dir))
        return BinnedSampler(discover_shards(train_dir), micro_batch, rank, world, seed, vocab_size, mix=mix,
                             counts=counts), None
    if mix == "split":
        raise InputError(f"--split-batch-cnt: {train_dir} holds packed rows, all of one width; split batches need the "
                         "padded 4-bin folder")
    layout, bins = found
    if rank == 0:
        log.info("data: %s packed rows of %d tokens (%d files)", layout, next(iter(bins)), len(bins[next(iter(bins))]))
    return BinnedSampler(bins, micro_batch, rank, world, seed, vocab_size, read=READERS[layout],
                         layout=f"packed-{layout}"), layout


def preflight_bins(train_dir: str, packed: bool, vocab_size: int) -> dict[int, list]:
    """``launch.preflight``'s data check. Packed data: discovered and the first packs of each file's layout
    checked against the vocab here; returns {}. Padded data: its bins (the caller checks a sample of rows).
    ``packed`` on padded data raises InputError."""
    from pretrain.data import check_vocab, discover_shards

    found = discover_packed(train_dir)
    if found is None:
        if packed:
            raise InputError(packed_refusal(train_dir))
        return discover_shards(train_dir)
    layout, bins = found
    width, shards = next(iter(bins.items()))
    first = next(s for s in shards if s.rows)
    n = min(first.rows, 256)
    handles: dict[int, object] = {}
    try:
        arrays = READERS[layout]([first], np.zeros(n, np.int64), np.arange(n), width, handles)
    finally:
        for h in handles.values():
            h.close()
    check_vocab(arrays, vocab_size, str(first.path))
    return {}


def packed_refusal(train_dir: str | Path) -> str:
    return (f"--packed: {train_dir} holds no packed rows (expected Habana's mixed_strategies_part_*.hdf5 with "
            "positions/next_sentence_positions, or NVIDIA's packed_data files with packed_input_len); make packs "
            "with `bertpipe pack-habana` or `bertpipe pack-nvidia`, or drop --packed to train on padded rows")


# --- packing padded rows (fixtures, bench) -------------------------------------------------------------------


def real_counts(arrays: dict[str, np.ndarray]) -> tuple[int, int]:
    """(sequences, real tokens) of a batch: packed rows count each of their sequences; padding is not counted."""
    tokens = int(np.count_nonzero(arrays["input_mask"]))
    if "next_sentence_weights" in arrays:
        return int(np.count_nonzero(arrays["next_sentence_weights"])), tokens
    return len(arrays["input_ids"]), tokens


def valid_slots(masked_lm_positions: np.ndarray) -> np.ndarray:
    """[B, P] bool: the prediction slots before each row's first 0 (as ``pretrain.model.valid_mask``)."""
    return np.cumprod(np.asarray(masked_lm_positions) != 0, axis=1).astype(bool)


def sequence_lengths(arrays: dict[str, np.ndarray]) -> np.ndarray:
    """Real tokens of each padded row (sum of input_mask)."""
    return (np.asarray(arrays["input_mask"]) != 0).sum(axis=1)


def best_fit_packs(lengths: np.ndarray, max_len: int = 512, max_per_pack: int = 3) -> list[list[int]]:
    """Greedy packing: longest sequence first, each into the fullest pack it fits (at most ``max_per_pack``
    sequences and ``max_len`` tokens a pack). Returns the row indices of each pack, packs in creation order,
    each pack's rows in the order they were placed."""
    import bisect

    lengths = np.asarray(lengths, dtype=np.int64)
    if len(lengths) and (lengths.min() < 1 or lengths.max() > max_len):
        raise InputError(f"sequence lengths {lengths.min()}..{lengths.max()} do not fit packs of {max_len}")
    packs: list[list[int]] = []
    open_rooms: list[tuple[int, int]] = []  # (room left, pack index), sorted
    for i in np.argsort(-lengths, kind="stable"):
        n = int(lengths[i])
        j = bisect.bisect_left(open_rooms, (n, -1))
        if j < len(open_rooms):
            room, p = open_rooms.pop(j)
        else:
            room, p = max_len, len(packs)
            packs.append([])
        packs[p].append(int(i))
        if len(packs[p]) < max_per_pack and room - n > 0:
            bisect.insort(open_rooms, (room - n, p))
    return packs


def pack_rows(arrays: dict[str, np.ndarray], packs: list[list[int]], max_len: int = 512,
              pred_width: int | None = None, max_per_pack: int = 3) -> dict[str, np.ndarray]:
    """Padded rows (the HDF5 fields) -> packed rows in the batch layout :data:`PACKED_FIELDS` (int64):
    pack p holds rows ``packs[p]`` in that order. ``pred_width``: prediction slots of a pack (default: the
    rows' width + max_per_pack, Habana's rule)."""
    lengths = sequence_lengths(arrays)
    pred_width = pred_width or arrays["masked_lm_positions"].shape[1] + max_per_pack
    valid = valid_slots(arrays["masked_lm_positions"])
    n = len(packs)
    out = {k: np.zeros((n, max_len), np.int64) for k in _schema.PACKED_TOKEN_FIELDS}
    out.update({k: np.zeros((n, pred_width), np.int64) for k in _schema.PACKED_PRED_FIELDS})
    out.update({k: np.zeros((n, max_per_pack), np.int64) for k in _schema.PACKED_SEQUENCE_FIELDS})
    for p, members in enumerate(packs):
        if len(members) > max_per_pack:
            raise InputError(f"pack {p} has {len(members)} sequences, more than {max_per_pack}")
        offset = mlm = 0
        for s, r in enumerate(members):
            n_tok, n_pred = int(lengths[r]), int(valid[r].sum())
            if offset + n_tok > max_len or mlm + n_pred > pred_width:
                raise InputError(f"pack {p} overflows ({offset + n_tok} tokens of {max_len}, "
                                 f"{mlm + n_pred} predictions of {pred_width})")
            out["input_ids"][p, offset:offset + n_tok] = arrays["input_ids"][r, :n_tok]
            out["segment_ids"][p, offset:offset + n_tok] = arrays["segment_ids"][r, :n_tok]
            out["input_mask"][p, offset:offset + n_tok] = s + 1
            out["positions"][p, offset:offset + n_tok] = np.arange(n_tok)
            out["masked_lm_positions"][p, mlm:mlm + n_pred] = offset + arrays["masked_lm_positions"][r, :n_pred]
            out["masked_lm_ids"][p, mlm:mlm + n_pred] = arrays["masked_lm_ids"][r, :n_pred]
            out["next_sentence_positions"][p, s] = offset
            out["next_sentence_labels"][p, s] = arrays["next_sentence_labels"][r]
            out["next_sentence_weights"][p, s] = 1
            offset, mlm = offset + n_tok, mlm + n_pred
    return out


def write_habana(path: Path | str, packed: dict[str, np.ndarray]) -> None:
    """Write packed rows as a Habana packed HDF5 file (its dataset names and dtypes; temp name, then rename)."""
    import h5py

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with h5py.File(tmp, "w") as f:
            for k in PACKED_FIELDS:
                f.create_dataset(k, data=np.asarray(packed[k]), dtype=HABANA_DTYPES[k])
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_nvidia(path: Path | str, packed: dict[str, np.ndarray]) -> None:
    """Write packed rows (batch layout) as an NVIDIA packed HDF5 file (vlen datasets, create_packed_trainset's
    names and dtypes; temp name, then rename)."""
    import h5py

    path = Path(path)
    n = len(packed["input_ids"])
    valid = valid_slots(packed["masked_lm_positions"])
    rows: dict[str, list[np.ndarray]] = {k: [] for k in NVIDIA_DTYPES}
    for i in range(n):
        seq = packed["input_mask"][i]
        k = int(packed["next_sentence_weights"][i].sum())
        lens = np.array([(seq == s + 1).sum() for s in range(k)])
        total = int(lens.sum())
        per_seq_pred = [(valid[i] & (seq[packed["masked_lm_positions"][i]] == s + 1)).sum() for s in range(k)]
        for key, v in (("input_ids", packed["input_ids"][i, :total]), ("segment_ids", packed["segment_ids"][i, :total]),
                       ("packed_input_len", lens), ("masked_lm_positions", packed["masked_lm_positions"][i][valid[i]]),
                       ("masked_lm_ids", packed["masked_lm_ids"][i][valid[i]]),
                       ("packed_masked_lm_len", np.array(per_seq_pred)),
                       ("next_sentence_labels", packed["next_sentence_labels"][i, :k])):
            rows[key].append(np.asarray(v, dtype=NVIDIA_DTYPES[key]))
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    try:
        with h5py.File(tmp, "w") as f:
            for key, dtype in NVIDIA_DTYPES.items():
                ds = f.create_dataset(key, (n,), dtype=h5py.vlen_dtype(np.dtype(dtype)))
                for i, v in enumerate(rows[key]):
                    ds[i] = v
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
