"""Fuzzing the TFRecord reader and Example decoder: random corruption raises only RecordError, never
hangs or crashes the interpreter (issue: faults and hostile input). Seeded, so failures reproduce."""

from __future__ import annotations

import random
import time

import pytest

from core.errors import RecordError
from core.schema import FEATURES
from preprocessing.mlperf.tfrecord import encode_mlperf_example, frame, read_examples


def _valid_file(tmp_path, n: int = 6):
    rng = random.Random(7)
    recs = []
    for _ in range(n):
        vals = {name: [rng.randrange(0, 30522) for _ in range(16)] for name in FEATURES}
        vals["masked_lm_weights"] = [1.0] * 4 + [0.0] * 2
        vals["next_sentence_labels"] = [rng.randrange(2)]
        recs.append(frame(encode_mlperf_example(vals)))
    path = tmp_path / "ok.tfrecord"
    data = b"".join(recs)
    path.write_bytes(data)
    return path, data


def _consume(path) -> int:
    return sum(1 for _ in read_examples(path))


@pytest.mark.parametrize("mode", ["flip", "truncate", "splice"])
def test_corrupted_tfrecord_raises_only_record_error(tmp_path, mode):
    path, data = _valid_file(tmp_path)
    assert _consume(path) == 6
    rng = random.Random(12345 + len(mode))
    bad = tmp_path / "bad.tfrecord"
    outcomes = {"error": 0, "ok": 0}
    t0 = time.perf_counter()
    for _ in range(1000):
        b = bytearray(data)
        if mode == "flip":
            for _ in range(rng.randint(1, 3)):
                b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        elif mode == "truncate":
            del b[rng.randrange(1, len(b)):]
        else:
            i = rng.randrange(len(b))
            b[i:i] = rng.randbytes(rng.randint(1, 40))
        bad.write_bytes(bytes(b))
        try:
            _consume(bad)
            outcomes["ok"] += 1
        except RecordError as e:
            assert str(bad) in str(e) and "record" in str(e)
            outcomes["error"] += 1
    assert time.perf_counter() - t0 < 60
    if mode == "flip":
        assert outcomes["ok"] == 0  # CRC32C catches every 1-3 bit flip
    assert outcomes["error"] > 900


def test_random_payloads_decode_or_raise_record_error(tmp_path):
    rng = random.Random(99)
    path = tmp_path / "junk.tfrecord"
    for _ in range(1000):  # valid framing, garbage protobuf inside: the decoder is the target
        payload = rng.randbytes(rng.randint(0, 200))
        path.write_bytes(frame(payload))
        try:
            _consume(path)
        except RecordError as e:
            assert "record 0" in str(e)
