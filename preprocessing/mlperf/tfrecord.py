"""TFRecord files and ``tf.train.Example`` records, without TensorFlow.

Framing (per record): ``uint64 LE length``, ``uint32 masked CRC32C(length bytes)``, payload,
``uint32 masked CRC32C(payload)``; mask = ``((crc >> 15) | (crc << 17)) + 0xa282ead8 (mod 2**32)``.

Canonical Example encoding: features in *insertion order* (the order protobuf's pure-Python backend
writes, the only deterministic reference behaviour; see spec §8.4), int64 values as packed varints,
floats as packed little-endian fixed32. The MLPerf order is :data:`FEATURES`.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import BinaryIO

from core.errors import RecordError
from core.schema import FEATURES, FLOAT_FEATURES

# ---------------------------------------------------------------------------------------------
# CRC32C (Castagnoli). The `crc32c` package uses SSE4.2/ARMv8 instructions; the table fallback
# keeps bertpipe working (slowly) where it is missing.
try:
    from crc32c import crc32c as _crc32c_hw
except ImportError:  # pragma: no cover - exercised only without the dependency
    _crc32c_hw = None

_TABLE: list[int] = []


def _crc32c_py(data: bytes, crc: int = 0) -> int:
    if not _TABLE:
        for i in range(256):
            c = i
            for _ in range(8):
                c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
            _TABLE.append(c)
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = _TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def crc32c(data: bytes) -> int:
    return _crc32c_hw(data) if _crc32c_hw is not None else _crc32c_py(data)


def masked_crc(data: bytes) -> int:
    c = crc32c(data)
    return (((c >> 15) | (c << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# ---------------------------------------------------------------------------------------------
# Framing
def frame(payload: bytes) -> bytes:
    """One TFRecord: header, payload and footer."""
    header = struct.pack("<Q", len(payload))
    return b"".join((header, struct.pack("<I", masked_crc(header)), payload, struct.pack("<I", masked_crc(payload))))


def write_records(path: str | os.PathLike, payloads: Sequence[bytes]) -> None:
    with open(path, "wb") as f:
        for p in payloads:
            f.write(frame(p))


def iter_records(path: str | os.PathLike, *, check_crc: bool = True, f: BinaryIO | None = None) -> Iterator[bytes]:
    """Yield the payload of every record, checking both CRCs of each.

    Raises RecordError naming the file, the record index and the byte offset on a bad CRC or a
    truncated record.
    """
    path = Path(path)
    own = f is None
    if own:
        try:
            f = open(path, "rb")  # noqa: SIM115
        except FileNotFoundError:
            raise RecordError(f"TFRecord file {path} does not exist") from None
    assert f is not None
    try:
        index, offset = 0, 0
        while True:
            head = f.read(12)
            if not head:
                return
            if len(head) < 12:
                raise RecordError(f"{path}: record {index} at byte {offset} is truncated (header has {len(head)} "
                                  "of 12 bytes); the file was cut off - re-create it")
            (length,) = struct.unpack_from("<Q", head, 0)
            (len_crc,) = struct.unpack_from("<I", head, 8)
            if check_crc and masked_crc(head[:8]) != len_crc:
                raise RecordError(f"{path}: record {index} at byte {offset}: length CRC mismatch (corrupt header); "
                                  "the file is damaged - re-create it")
            if length > 1 << 31:
                raise RecordError(f"{path}: record {index} at byte {offset} claims {length} bytes; not a TFRecord file?")
            body = f.read(length + 4)
            if len(body) < length + 4:
                raise RecordError(f"{path}: record {index} at byte {offset} is truncated ({len(body)} of "
                                  f"{length + 4} bytes); the file was cut off - re-create it")
            payload = body[:length]
            if check_crc and masked_crc(payload) != struct.unpack_from("<I", body, length)[0]:
                raise RecordError(f"{path}: record {index} at byte {offset}: data CRC mismatch (corrupt payload); "
                                  "the file is damaged - re-create it")
            yield payload
            index += 1
            offset += 12 + length + 4
    finally:
        if own:
            f.close()


def count_records(path: str | os.PathLike) -> int:
    """Number of records, reading only the headers (no CRC check)."""
    n = 0
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        pos = 0
        while pos < size:
            head = f.read(8)
            if len(head) < 8:
                raise RecordError(f"{path}: record {n} at byte {pos} is truncated")
            (length,) = struct.unpack("<Q", head)
            if length > size - pos - 16:  # also a nonsense header (0x7fff...: seek would overflow)
                raise RecordError(f"{path}: record {n} at byte {pos} claims {length} bytes, past the end of the "
                                  f"file ({size} bytes); the file is cut off or not a TFRecord - re-create it")
            pos += 16 + length
            f.seek(pos)
            n += 1
    return n


# ---------------------------------------------------------------------------------------------
# Example encoding
def _varint(v: int, out: bytearray) -> None:
    if v < 0:
        v += 1 << 64
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)


def _len_delimited(tag: int, body: bytes | bytearray, out: bytearray) -> None:
    out.append(tag)
    _varint(len(body), out)
    out += body


def encode_example(features: Sequence[tuple[str, Sequence[int] | Sequence[float], bool]]) -> bytes:
    """Serialize a tf.train.Example; ``features`` = [(name, values, is_float)] in the order to write."""
    feats = bytearray()
    for name, values, is_float in features:
        packed = bytearray()
        if is_float:
            packed += struct.pack(f"<{len(values)}f", *values)
        else:
            for v in values:
                _varint(int(v), packed)
        lst = bytearray()
        if values:
            _len_delimited(0x0A, packed, lst)  # repeated value = 1 [packed]
        feature = bytearray()
        _len_delimited(0x12 if is_float else 0x1A, lst, feature)  # float_list = 2, int64_list = 3
        entry = bytearray()
        _len_delimited(0x0A, name.encode(), entry)  # map key = 1
        _len_delimited(0x12, feature, entry)  # map value = 2
        _len_delimited(0x0A, entry, feats)  # Features.feature = 1 (map entry)
    example = bytearray()
    _len_delimited(0x0A, feats, example)  # Example.features = 1
    return bytes(example)


def encode_mlperf_example(values: dict[str, Sequence[int] | Sequence[float]]) -> bytes:
    """The canonical MLPerf record: the seven FEATURES in order."""
    return encode_example([(n, values[n], n in FLOAT_FEATURES) for n in FEATURES])


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(buf):
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise ValueError("varint too long")


def _fields(buf: bytes) -> Iterator[tuple[int, int, bytes | int]]:
    """Yield (field number, wire type, value) of a protobuf message."""
    pos, n = 0, len(buf)
    while pos < n:
        key, pos = _read_varint(buf, pos)
        field, wt = key >> 3, key & 7
        if wt == 0:
            v, pos = _read_varint(buf, pos)
            yield field, wt, v
        elif wt == 2:
            ln, pos = _read_varint(buf, pos)
            if pos + ln > n:
                raise ValueError("length-delimited field runs past the end")
            yield field, wt, buf[pos:pos + ln]
            pos += ln
        elif wt == 5:
            if pos + 4 > n:
                raise ValueError("truncated fixed32")
            yield field, wt, buf[pos:pos + 4]
            pos += 4
        elif wt == 1:
            if pos + 8 > n:
                raise ValueError("truncated fixed64")
            yield field, wt, buf[pos:pos + 8]
            pos += 8
        else:
            raise ValueError(f"unsupported wire type {wt}")


def _sub(v: bytes | int) -> bytes:
    """A length-delimited field's bytes; a corrupt record can put a varint where a message belongs."""
    if not isinstance(v, bytes):
        raise ValueError("expected a length-delimited field")
    return v


def _decode_list(feature: bytes) -> list[int] | list[float] | list[bytes]:
    for kind, _, lst in _fields(feature):
        values: list = []
        for _, wt, v in _fields(_sub(lst)):
            if kind == 3:  # int64_list
                if wt == 2:
                    pos = 0
                    while pos < len(v):  # type: ignore[arg-type]
                        x, pos = _read_varint(v, pos)  # type: ignore[arg-type]
                        values.append(x - (1 << 64) if x >= 1 << 63 else x)
                else:
                    values.append(v - (1 << 64) if v >= 1 << 63 else v)  # type: ignore[operator]
            elif kind == 2:  # float_list
                if wt == 2 and len(v) % 4 == 0:  # type: ignore[arg-type]
                    values.extend(struct.unpack(f"<{len(v) // 4}f", v))  # type: ignore[arg-type]
                elif wt == 5:
                    values.extend(struct.unpack("<f", v))  # type: ignore[arg-type]
                else:
                    raise ValueError("malformed float_list")
            elif kind == 1:  # bytes_list
                values.append(bytes(v))  # type: ignore[arg-type]
        return values
    return []


def decode_example(payload: bytes) -> dict[str, list]:
    """Parse a serialized tf.train.Example into {feature name: list of values} (in file order)."""
    out: dict[str, list] = {}
    for field, _, features in _fields(payload):
        if field != 1:
            continue
        for _, _, entry in _fields(_sub(features)):
            name, feature = "", b""
            for f2, _, v in _fields(_sub(entry)):
                if f2 == 1:
                    name = _sub(v).decode()
                elif f2 == 2:
                    feature = _sub(v)
            out[name] = _decode_list(feature)
    return out


def read_examples(path: str | os.PathLike) -> Iterator[dict[str, list]]:
    """Decode every record of a TFRecord file of tf.train.Example (CRC-checked)."""
    for index, payload in enumerate(iter_records(path)):
        try:
            yield decode_example(payload)
        except (ValueError, UnicodeDecodeError) as exc:
            raise RecordError(f"{path}: record {index} is not a valid tf.train.Example ({exc})") from None
