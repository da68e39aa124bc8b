"""Worker of tests/test_fuzz_hdf5.py: seeded corruptions of a small padded MLPerf HDF5, read by every reader.

  python tests/fuzz_hdf5_cases.py SOURCE.hdf5 SCRATCH_DIR --seed S --first I --count N

Run as a subprocess (h5py on a corrupt file could crash the interpreter: the parent sees the signal and
the last case started). Per case it writes the corrupted bytes to SCRATCH_DIR/case.hdf5 and runs:

* ``bins``: run_split_4bins (open_padded, the counting pass and the routing pass), 2 shards per bin;
  (bins and pack read 1, 3 or 4096 rows at a time, drawn per case)
* ``pack``: pack_varlength (padded -> NVIDIA's packed layout);
* ``train``: pretrain.data's discover_shards + read_rows of every row (the trainer's reader).

Prints ``start <i> <mutation>`` before each case and one JSON line per (case, reader) after it:
{"case", "reader", "outcome": ok|project|other|hang, "type", "message"}. A reader taking more than
--case-timeout seconds is interrupted (SIGALRM) and reported as ``hang``.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import signal
import sys
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

from core.errors import BertpipeError  # noqa: E402

#: Where the HDF5 metadata lives in a small file (superblock, object headers, B-tree, heap): half the
#: flips and insertions aim there, the rest anywhere (mostly raw data).
METADATA_BYTES = 4096


def mutate(data: bytes, rng: random.Random) -> tuple[bytes, str]:
    """One seeded corruption: bit flips, a truncation, an insertion, a deletion or an overwrite."""
    b = bytearray(data)

    def pos() -> int:
        return rng.randrange(min(METADATA_BYTES, len(b))) if rng.random() < 0.5 else rng.randrange(len(b))

    kind = rng.choice(("flip", "flip", "truncate", "insert", "delete", "overwrite"))
    if kind == "flip":
        at = sorted(pos() for _ in range(rng.randint(1, 4)))
        for i in at:
            b[i] ^= 1 << rng.randrange(8)
        return bytes(b), f"flip@{at}"
    if kind == "truncate":
        n = rng.randrange(len(b))
        return bytes(b[:n]), f"truncate@{n}"
    if kind == "insert":
        i, junk = pos(), rng.randbytes(rng.randint(1, 64))
        b[i:i] = junk
        return bytes(b), f"insert@{i}+{len(junk)}"
    if kind == "delete":
        i = pos()
        n = rng.randint(1, 64)
        del b[i:i + n]
        return bytes(b), f"delete@{i}-{n}"
    i = pos()
    n = rng.randint(1, 16)
    b[i:i + n] = rng.choice((b"\xff" * n, b"\x00" * n, rng.randbytes(n)))
    return bytes(b[:len(data)]), f"overwrite@{i}-{n}"


def read_bins(path: Path, scratch: Path, chunk_rows: int) -> None:
    from preprocessing.mlperf.split_4bins import Split4BinsConfig, run_split_4bins

    out = scratch / "bins"
    shutil.rmtree(out, ignore_errors=True)
    run_split_4bins([path], out, Split4BinsConfig(n_output_shards=2, chunk_rows=chunk_rows))


def read_pack(path: Path, scratch: Path, chunk_rows: int) -> None:
    from preprocessing.nvidia.varlength import PackConfig, pack_varlength

    pack_varlength(path, scratch / "packed.hdf5", PackConfig(chunk_rows=chunk_rows))


def read_train(path: Path, scratch: Path, chunk_rows: int) -> None:
    from pretrain.data import discover_shards, read_rows

    for bound, shards in discover_shards(path).items():
        for i, s in enumerate(shards):
            handles: dict[int, object] = {}
            try:
                rows = np.arange(s.rows, dtype=np.int64)
                read_rows(shards, np.full(len(rows), i, dtype=np.int32), rows, bound, handles)
            finally:
                for h in handles.values():
                    h.close()


READERS = {"bins": read_bins, "pack": read_pack, "train": read_train}


class Hang(Exception):
    pass


def _alarm(signum, frame):  # noqa: ANN001
    raise Hang("interrupted by the per-case timeout")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("source", type=Path)
    ap.add_argument("scratch", type=Path)
    ap.add_argument("--seed", type=int, required=True)
    ap.add_argument("--first", type=int, default=0)
    ap.add_argument("--count", type=int, default=100)
    ap.add_argument("--case-timeout", type=float, default=10.0)
    args = ap.parse_args()
    import logging

    logging.disable(logging.WARNING)  # split-4bins warns about empty bins on every case
    data = args.source.read_bytes()
    args.scratch.mkdir(parents=True, exist_ok=True)
    path = args.scratch / "case.hdf5"
    signal.signal(signal.SIGALRM, _alarm)
    for i in range(args.first, args.first + args.count):
        rng = random.Random(f"{args.seed}-{i}")
        bad, what = mutate(data, rng)
        chunk_rows = rng.choice((1, 3, 4096))  # rows read (and packed) at once: 1 = every chunk one row
        what += f" chunk_rows={chunk_rows}"
        print(f"start {i} {what}", flush=True)
        path.write_bytes(bad)
        for name, reader in READERS.items():
            rec = {"case": i, "reader": name, "mutation": what, "outcome": "ok", "type": "", "message": ""}
            signal.setitimer(signal.ITIMER_REAL, args.case_timeout)
            try:
                reader(path, args.scratch, chunk_rows)
            except Hang as exc:
                rec.update(outcome="hang", type="Hang", message=str(exc))
            except BertpipeError as exc:
                rec.update(outcome="project", type=type(exc).__name__, message=str(exc))
            except Exception as exc:  # noqa: BLE001 - what the test reports as a failure
                rec.update(outcome="other", type=type(exc).__name__,
                           message=f"{exc} | {traceback.format_exc(limit=-3)}"[-1500:])
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            print(json.dumps(rec), flush=True)
    print("finished", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
