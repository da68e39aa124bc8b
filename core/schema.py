"""The MLPerf BERT pre-training record, declared once (spec §8.4 and §10).

A record has seven features. The TFRecord writes all seven, in :data:`FEATURES` order (the order the
golden files use); the padded HDF5 files (Samsung's converter) keep six of them as datasets, created in
:data:`HDF5_DATASETS` order. ``preprocessing/_native/cpd_write.h`` spells the same names for the C writer;
``tests/test_schema.py`` checks it against this module.

Widths: ``seq`` datasets hold ``max_seq_length`` values per row (MLPerf: 512), ``pred`` datasets
``max_predictions_per_seq`` (MLPerf: 76), and ``""`` one value per row.
"""

from __future__ import annotations

#: The seven features of a record, in the order the TFRecord writes them.
FEATURES = (
    "input_ids",
    "input_mask",
    "segment_ids",
    "masked_lm_positions",
    "masked_lm_ids",
    "masked_lm_weights",
    "next_sentence_labels",
)
#: Features written as FloatList (the rest are Int64List).
FLOAT_FEATURES = frozenset({"masked_lm_weights"})
#: Width kind of each feature: "seq" (max_seq_length values), "pred" (max_predictions_per_seq), "" (one).
FEATURE_WIDTHS = {"input_ids": "seq", "input_mask": "seq", "segment_ids": "seq", "masked_lm_positions": "pred",
                  "masked_lm_ids": "pred", "masked_lm_weights": "pred", "next_sentence_labels": ""}
#: The features with one value per token (cut to a bin's length by trainers).
SEQ_FEATURES = tuple(f for f in FEATURES if FEATURE_WIDTHS[f] == "seq")

#: The padded HDF5 datasets: (name, HDF5 dtype, width kind), in creation order.
_HDF5_DTYPES = {"input_ids": "i4", "input_mask": "i1", "segment_ids": "i1", "masked_lm_positions": "i4",
                "masked_lm_ids": "i4", "next_sentence_labels": "i1"}
HDF5_DATASETS: tuple[tuple[str, str, str], ...] = tuple(
    (name, dtype, FEATURE_WIDTHS[name]) for name, dtype in _HDF5_DTYPES.items())
#: Their names (what a trainer reads).
HDF5_FIELDS = tuple(name for name, _, _ in HDF5_DATASETS)

#: Packed rows (several sequences per row; Habana's packed-mode dataset names, the batch layout of
#: pretrain/packing.py): per token, per masked position, per packed sequence, in the model's forward order.
PACKED_TOKEN_FIELDS = ("input_ids", "input_mask", "segment_ids", "positions")
PACKED_PRED_FIELDS = ("masked_lm_positions", "masked_lm_ids")
PACKED_SEQUENCE_FIELDS = ("next_sentence_positions", "next_sentence_labels", "next_sentence_weights")
PACKED_FIELDS = PACKED_TOKEN_FIELDS + PACKED_PRED_FIELDS + PACKED_SEQUENCE_FIELDS

#: MLPerf's widths (the data set's flags: create_pretraining_data --max_seq_length / --max_predictions_per_seq).
MLPERF_MAX_SEQ_LENGTH = 512
MLPERF_MAX_PREDICTIONS = 76

#: The 4 length bins: inclusive upper bounds of sum(input_mask); the first bin starts at 1.
BIN_BOUNDS = (128, 256, 384, 512)

#: What h5py raises on a damaged or foreign file (its metadata readers are not consistent about it).
H5_ERRORS = (OSError, KeyError, ValueError, RuntimeError, TypeError, IndexError)


def row_shape(kind: str, max_seq_length: int, max_predictions_per_seq: int) -> tuple[int, ...]:
    """The shape of one row of a dataset of the given width kind."""
    return {"seq": (max_seq_length,), "pred": (max_predictions_per_seq,), "": ()}[kind]
