"""TensorFlow reads our TFRecords with the reference's feature spec (run_pretraining.py's input_fn)."""

from __future__ import annotations

import pytest

from preprocessing.mlperf.cpd_run import write_pretraining_data
from preprocessing.mlperf.create_pretraining_data import CreatePretrainingDataConfig
from preprocessing.mlperf.tfrecord import read_examples


@pytest.mark.parametrize(("seq", "pred", "impl"), [(128, 20, "auto"), (512, 76, "plain")])
def test_tensorflow_parses_with_reference_feature_spec(golden, shared_data, tmp_path, seq, pred, impl):
    tf = pytest.importorskip("tensorflow")
    out = tmp_path / "edge.tfrecord"
    cfg = CreatePretrainingDataConfig(vocab_file=str(shared_data / "vocab.txt"), max_seq_length=seq,
                                      max_predictions_per_seq=pred, dupe_factor=1, impl=impl)
    write_pretraining_data([golden / "edge_input.txt"], [out], cfg, log_examples=0)
    spec = {
        "input_ids": tf.io.FixedLenFeature([seq], tf.int64),
        "input_mask": tf.io.FixedLenFeature([seq], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([seq], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([pred], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([pred], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([pred], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }
    ours = list(read_examples(out))
    n = 0
    for raw, mine in zip(tf.data.TFRecordDataset(str(out)), ours, strict=True):
        parsed = tf.io.parse_single_example(raw, spec)
        for name, value in parsed.items():
            assert value.numpy().tolist() == mine[name], name
        ex = tf.train.Example.FromString(raw.numpy())
        assert list(ex.features.feature["input_ids"].int64_list.value) == mine["input_ids"]
        n += 1
    assert n == len(ours) > 50
