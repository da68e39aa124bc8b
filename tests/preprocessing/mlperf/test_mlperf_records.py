"""The fast record decoder and TFRecord -> HDF5 on bad input: every error names file and record."""

from __future__ import annotations

import random
import struct
from pathlib import Path

import h5py
import numpy as np
import pytest

from core.errors import RecordError
from core.schema import FEATURES, FLOAT_FEATURES
from preprocessing.mlperf.records import RecordShape, decode_batch, iter_batches
from preprocessing.mlperf.tfrecord import encode_example, read_examples, write_records
from preprocessing.mlperf.tfrecord_to_hdf5 import HDF5Config, convert_tfrecord_to_hdf5

SHAPE = RecordShape(max_seq_length=16, max_predictions_per_seq=4)
CFG = HDF5Config(max_seq_length=16, max_predictions_per_seq=4, batch_size=3)


def example(rng: random.Random, shape: RecordShape = SHAPE) -> dict[str, list]:
    n = rng.randint(3, shape.max_seq_length)
    k = rng.randint(1, min(shape.max_predictions_per_seq, n - 2))
    pad = shape.max_seq_length - n
    positions = sorted(rng.sample(range(1, n), k))
    return {
        "input_ids": [rng.choice([101, 102, 7, 1996, 30521, 2 ** 40]) for _ in range(n)] + [0] * pad,
        "input_mask": [1] * n + [0] * pad,
        "segment_ids": [rng.randint(0, 1) for _ in range(n)] + [0] * pad,
        "masked_lm_positions": positions + [0] * (shape.max_predictions_per_seq - k),
        "masked_lm_ids": [rng.randint(0, 30521) for _ in range(k)] + [0] * (shape.max_predictions_per_seq - k),
        "masked_lm_weights": [1.0] * k + [0.0] * (shape.max_predictions_per_seq - k),
        "next_sentence_labels": [rng.randint(0, 1)],
    }


def encode(ex: dict[str, list], order: list[str] | None = None) -> bytes:
    return encode_example([(n, ex[n], n in FLOAT_FEATURES) for n in (order or FEATURES) if n in ex])


@pytest.mark.parametrize(("name", "shape"), [("eval_100.tfrecord", RecordShape()), ("edge.tfrecord", RecordShape()),
                                           ("edge_128.tfrecord", RecordShape(128, 20))])
def test_decoder_agrees_with_the_general_decoder(golden: Path, name: str, shape: RecordShape) -> None:
    ref = list(read_examples(golden / name))
    for first, batch in iter_batches(golden / name, shape, batch_size=33):
        for feature in FEATURES:
            want = np.array([r[feature] for r in ref[first:first + len(batch[feature])]])
            np.testing.assert_array_equal(batch[feature], want.astype(batch[feature].dtype), err_msg=feature)


@pytest.mark.parametrize("seed", range(5))
def test_any_key_order_and_unpacked_fields(seed: int) -> None:
    """TF's C++ protobuf writes a random key order per record; proto2 writers may not pack values."""
    rng = random.Random(seed)
    exs = [example(rng) for _ in range(40)]
    payloads = []
    for ex in exs:
        order = list(FEATURES)
        rng.shuffle(order)
        payloads.append(encode(ex, order))
    # one record with input_mask as unpacked repeated varints (field 1, wire type 0)
    ex = exs[7]
    unpacked = b"".join(b"\x08" + bytes([v]) for v in ex["input_mask"])
    lst = b"\x1a" + bytes([len(unpacked)]) + unpacked
    entry = b"\x0a\x0ainput_mask\x12" + bytes([len(lst)]) + lst
    feats = b"".join(b"\x0a" + bytes([len(e)]) + e for e in [entry]) + encode(
        {k: v for k, v in ex.items() if k != "input_mask"})[3:]
    payloads[7] = b"\x0a" + _varint(len(feats)) + feats
    got = decode_batch(payloads, SHAPE)
    for name in FEATURES:
        want = np.array([e[name] for e in exs])
        np.testing.assert_array_equal(got[name], want.astype(got[name].dtype), err_msg=name)


def _varint(v: int) -> bytes:
    out = bytearray()
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def test_roundtrip_to_hdf5_field_for_field(tmp_path: Path) -> None:
    rng = random.Random(1)
    exs = [example(rng) for _ in range(10)]
    for ex in exs:
        ex["input_ids"] = [min(v, 2 ** 31 - 1) for v in ex["input_ids"]]
    write_records(tmp_path / "a.tfrecord", [encode(e) for e in exs])
    assert convert_tfrecord_to_hdf5(tmp_path / "a.tfrecord", tmp_path / "a.hdf5", CFG) == 10
    with h5py.File(tmp_path / "a.hdf5") as f:
        assert list(f) == sorted(n for n in FEATURES if n != "masked_lm_weights")
        for name in f:
            want = np.array([e[name] for e in exs]).reshape(f[name].shape)
            np.testing.assert_array_equal(f[name][:], want, err_msg=name)


def _write(tmp_path: Path, payloads: list[bytes]) -> Path:
    p = tmp_path / "bad.tfrecord"
    write_records(p, payloads)
    return p


def _good(n: int = 6) -> list[bytes]:
    rng = random.Random(0)
    out = []
    for _ in range(n):
        ex = example(rng)
        ex["input_ids"] = [min(v, 30521) for v in ex["input_ids"]]
        out.append(encode(ex))
    return out


def test_flipped_byte_names_file_and_record(tmp_path: Path) -> None:
    p = _write(tmp_path, _good())
    data = bytearray(p.read_bytes())
    sizes = [16 + len(x) for x in _good()]
    data[sum(sizes[:4]) + 40] ^= 0x01  # inside record 4's payload
    p.write_bytes(bytes(data))
    with pytest.raises(RecordError, match=r"bad\.tfrecord: record 4 .*CRC"):
        convert_tfrecord_to_hdf5(p, tmp_path / "o.hdf5", CFG)


def test_truncated_tfrecord(tmp_path: Path) -> None:
    p = _write(tmp_path, _good())
    p.write_bytes(p.read_bytes()[:-10])
    with pytest.raises(RecordError, match=r"bad\.tfrecord: record 5 .*truncated"):
        convert_tfrecord_to_hdf5(p, tmp_path / "o.hdf5", CFG)


@pytest.mark.parametrize("missing", ["input_mask", "masked_lm_weights", "next_sentence_labels"])
def test_record_missing_a_feature(tmp_path: Path, missing: str) -> None:
    payloads = _good()
    ex = example(random.Random(9))
    del ex[missing]
    payloads[2] = encode(ex)
    with pytest.raises(RecordError, match=rf"bad\.tfrecord: record 2 has no feature '{missing}'"):
        convert_tfrecord_to_hdf5(_write(tmp_path, payloads), tmp_path / "o.hdf5", CFG)


@pytest.mark.parametrize(("name", "delta"), [("input_ids", -1), ("segment_ids", 1), ("masked_lm_ids", 1),
                                             ("masked_lm_weights", -1), ("next_sentence_labels", 1)])
def test_record_with_a_wrong_length(tmp_path: Path, name: str, delta: int) -> None:
    payloads = _good(8)
    ex = example(random.Random(3))
    ex[name] = ex[name] + [ex[name][0]] if delta > 0 else ex[name][:-1]
    payloads[6] = encode(ex)
    want = SHAPE.length(name)
    with pytest.raises(RecordError, match=rf"bad\.tfrecord: record 6: feature '{name}' has {want + delta} values, "
                                          rf"expected {want}"):
        convert_tfrecord_to_hdf5(_write(tmp_path, payloads), tmp_path / "o.hdf5", CFG)


def test_wrong_max_seq_length_is_explained(golden: Path, tmp_path: Path) -> None:
    with pytest.raises(RecordError, match=r"record 0: feature 'input_ids' has 512 values, expected 128 .*--max_seq"):
        convert_tfrecord_to_hdf5(golden / "eval_100.tfrecord", tmp_path / "o.hdf5",
                                 HDF5Config(max_seq_length=128, max_predictions_per_seq=20))


def test_value_out_of_range_is_refused(tmp_path: Path) -> None:
    payloads = _good()
    ex = example(random.Random(4))
    ex["input_ids"][1] = 2 ** 40
    payloads[3] = encode(ex)
    with pytest.raises(RecordError, match=r"record 3: feature 'input_ids' value 1099511627776 does not fit"):
        convert_tfrecord_to_hdf5(_write(tmp_path, payloads), tmp_path / "o.hdf5", CFG)


def test_garbage_payload(tmp_path: Path) -> None:
    payloads = _good()
    payloads[1] = struct.pack("<4I", 7, 8, 9, 10)
    with pytest.raises(RecordError, match=r"bad\.tfrecord: record 1 "):
        convert_tfrecord_to_hdf5(_write(tmp_path, payloads), tmp_path / "o.hdf5", CFG)


def test_multibyte_value_in_a_one_byte_feature(tmp_path: Path) -> None:
    """As many bytes as values expected, but one value takes 2 bytes: one value too few."""
    payloads = _good()
    ex = example(random.Random(8))
    ex["input_mask"] = [200] + ex["input_mask"][:-2]
    payloads[4] = encode(ex)
    with pytest.raises(RecordError, match=r"record 4: feature 'input_mask' has 15 values, expected 16"):
        convert_tfrecord_to_hdf5(_write(tmp_path, payloads), tmp_path / "o.hdf5", CFG)


def test_unusual_record_with_a_wrong_kind(tmp_path: Path) -> None:
    """masked_lm_weights written as an int64 list (and in another key order): refused, not converted."""
    payloads = _good()
    ex = example(random.Random(2))
    order = list(reversed(FEATURES))
    payloads[3] = encode_example([(n, [int(v) for v in ex[n]] if n == "masked_lm_weights" else ex[n], False)
                                  for n in order])
    with pytest.raises(RecordError, match=r"record 3: feature 'masked_lm_weights' is not a float list"):
        convert_tfrecord_to_hdf5(_write(tmp_path, payloads), tmp_path / "o.hdf5", CFG)


def test_flipped_byte_in_a_length_header(tmp_path: Path) -> None:
    p = _write(tmp_path, _good())
    data = bytearray(p.read_bytes())
    sizes = [16 + len(x) for x in _good()]
    data[sum(sizes[:3]) + 1] ^= 0x40  # the length of record 3: claims 16 KB more
    p.write_bytes(bytes(data))
    with pytest.raises(RecordError, match=r"bad\.tfrecord: record 3 at byte \d+: length CRC mismatch"):
        convert_tfrecord_to_hdf5(p, tmp_path / "o.hdf5", CFG)
