"""One validation of the HDF5 rows every command reads (issue 33, item 4): chop, pack-varlength, the shuffle, the
eval pick, both packers; training checks the same rules on its batches (pretrain/data.py).

Rows come in two layouts: *padded* (MLPerf's / Samsung's: ``input_mask`` marks the ``L`` real tokens, a prefix of
the row; ``masked_lm_positions`` padded with 0) and *compact* (NVIDIA's variable-length rows, or the packers'
gathered rows: each row's first ``L`` tokens and its masked positions back to back). The rules, for a row of ``L``
real tokens:

* ``input_mask``: 0 or 1, the ones a prefix of the row (``1 <= L <= width``: each stage checks, naming its flag);
* ``input_ids``, ``masked_lm_ids``: ``>= 0`` (and below the vocabulary's size where it is known);
* ``segment_ids``: 0 or 1;
* ``masked_lm_positions``: a real slot is inside the row's tokens, ``1 <= p < L`` (0 pads the slots after them);
* ``next_sentence_labels``: 0 or 1.

A refusal is one line (:class:`core.errors.RecordError`) naming the file, the dataset, the row (counted from the
file's first row) and the value. Checks are vectorized over a chunk of rows: a few milliseconds a MB.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from core.errors import InputError, RecordError

HINT = "the file is corrupt or not made by tfrecord-to-hdf5; re-create it"


def _refuse(path: Path | str, name: str, row: int, what: str) -> RecordError:
    return RecordError(f"{path}: dataset {name!r} row {row}: {what}; {HINT}")


def _first_row(bad: np.ndarray) -> int:
    """The first row (axis 0) with a True in a 2-D or 1-D mask."""
    return int(np.flatnonzero(bad.any(axis=1) if bad.ndim == 2 else bad)[0])


def check_padded(path: Path | str, first: int, rows: dict[str, np.ndarray], *,
                 vocab_size: int | None = None, row_ids: np.ndarray | None = None) -> np.ndarray:
    """Check a chunk of padded rows (``first``: the file's row of the chunk's first row, or ``row_ids`` the file's
    row of each; any subset of the six datasets, ``input_mask`` needed for the positions). Returns the rows' lengths
    (int64) when ``input_mask`` is there, else an empty array."""
    if row_ids is not None:
        try:
            return check_padded(path, 0, rows, vocab_size=vocab_size)
        except RecordError as exc:  # renamed to the file's row
            m = re.search(r" row (\d+): ", str(exc))
            if m is None:
                raise
            raise RecordError(str(exc).replace(m.group(0), f" row {int(row_ids[int(m.group(1))])}: ", 1)) from None
    seq = np.zeros(0, np.int64)
    mask = rows.get("input_mask")
    if mask is not None and mask.size:
        m = np.asarray(mask)
        bad = (m != 0) & (m != 1)
        if bad.any():
            r = _first_row(bad)
            raise _refuse(path, "input_mask", first + r, f"value {int(m[r][bad[r]][0])} (expected 0 or 1)")
        gap = m[:, 1:] > m[:, :-1]  # a 1 after a 0: the real tokens are not a prefix
        if gap.any():
            r = _first_row(gap)
            raise _refuse(path, "input_mask", first + r, "a 1 after a 0 (the real tokens must come first)")
        seq = m.sum(axis=1, dtype=np.int64)  # a row's length against its stage's bounds: the stage says
    _check_ids(path, first, rows.get("input_ids"), "input_ids", vocab_size)
    _check_ids(path, first, rows.get("masked_lm_ids"), "masked_lm_ids", vocab_size)
    _check_01(path, first, rows.get("segment_ids"), "segment_ids")
    nsl = rows.get("next_sentence_labels")
    _check_01(path, first, None if nsl is None else np.asarray(nsl).reshape(len(nsl), -1), "next_sentence_labels")
    pos = rows.get("masked_lm_positions")
    if pos is not None and pos.size and seq.size:
        p = np.asarray(pos)
        bad = (p < 0) | ((p != 0) & (p >= seq[:, None]))
        if bad.any():
            r = _first_row(bad)
            raise _refuse(path, "masked_lm_positions", first + r,
                          f"position {int(p[r][bad[r]][0])} outside the row's {int(seq[r])} tokens")
    return seq


def check_compact(path: Path | str, first: int, seq: np.ndarray, pred: np.ndarray, *,
                  ids: np.ndarray | None = None, seg: np.ndarray | None = None, pos: np.ndarray | None = None,
                  mlm: np.ndarray | None = None, nsl: np.ndarray | None = None,
                  vocab_size: int | None = None, row_ids: np.ndarray | None = None) -> None:
    """Check a chunk of compact rows: ``seq[i]`` tokens and ``pred[i]`` masked positions for row ``first + i``
    (or the file's row ``row_ids[i]``, rows gathered in another order), the values back to back."""
    seq = np.asarray(seq, np.int64)
    pred = np.asarray(pred, np.int64)

    def file_row(i: int) -> int:
        return int(row_ids[i]) if row_ids is not None else first + i

    if seq.size and (seq < 1).any():
        raise _refuse(path, "input_ids", file_row(_first_row(seq < 1)), "no token")

    def row_of(k: int, lens: np.ndarray) -> int:
        return file_row(int(np.searchsorted(np.cumsum(lens), k, side="right")))

    for name, v, lens in (("input_ids", ids, seq), ("masked_lm_ids", mlm, pred)):
        if v is not None and v.size:
            bad = (v < 0) if vocab_size is None else ((v < 0) | (v >= vocab_size))
            if bad.any():
                k = int(np.flatnonzero(bad)[0])
                raise _refuse(path, name, row_of(k, lens), f"token id {int(v[k])} outside 0..{_top(vocab_size)}")
    if seg is not None and seg.size:
        bad = (seg != 0) & (seg != 1)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise _refuse(path, "segment_ids", row_of(k, seq), f"value {int(seg[k])} (expected 0 or 1)")
    if nsl is not None and np.size(nsl):
        n = np.asarray(nsl).reshape(-1)
        bad = (n != 0) & (n != 1)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise _refuse(path, "next_sentence_labels", file_row(k), f"value {int(n[k])} (expected 0 or 1)")
    if pos is not None and pos.size:
        limit = np.repeat(seq, pred)
        bad = (pos < 1) | (pos >= limit)
        if bad.any():
            k = int(np.flatnonzero(bad)[0])
            raise _refuse(path, "masked_lm_positions", row_of(k, pred),
                          f"position {int(pos[k])} outside the row's {int(limit[k])} tokens (1..{int(limit[k]) - 1})")


def _top(vocab_size: int | None) -> str:
    return f"{vocab_size - 1} (the vocabulary's {vocab_size} entries)" if vocab_size else "2**31-1"


def _check_ids(path: Path | str, first: int, v: np.ndarray | None, name: str, vocab_size: int | None) -> None:
    if v is None or not v.size:
        return
    a = np.asarray(v)
    bad = (a < 0) if vocab_size is None else ((a < 0) | (a >= vocab_size))
    if bad.any():
        r = _first_row(bad)
        raise _refuse(path, name, first + r, f"token id {int(a[r][bad[r]][0])} outside 0..{_top(vocab_size)}")


def _check_01(path: Path | str, first: int, v: np.ndarray | None, name: str) -> None:
    if v is None or not v.size:
        return
    a = np.asarray(v)
    bad = (a != 0) & (a != 1)
    if bad.any():
        r = _first_row(bad)
        raise _refuse(path, name, first + r, f"value {int(a[r][bad[r]][0])} (expected 0 or 1)")


# -- file kinds ---------------------------------------------------------------------------------------------------
def kind_problem(path: Path | str) -> str:
    """Why ``path`` cannot be an input file ("" when it is a plain file, or a link to one): a dangling or looping
    symbolic link, a folder, a FIFO, a socket, a device. Looked at without opening it (a FIFO would block)."""
    p = os.fspath(path)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        return "does not exist"
    except OSError as exc:
        return f"cannot be looked at ({exc.strerror})"
    if stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(p)
        except FileNotFoundError:
            return f"is a dangling symbolic link (to {os.readlink(p)})"
        except OSError as exc:
            return f"is a symbolic link that cannot be followed ({exc.strerror}: a loop?)"
    if stat.S_ISREG(st.st_mode):
        return ""
    if stat.S_ISDIR(st.st_mode):
        return "is a folder"
    if stat.S_ISFIFO(st.st_mode):
        return "is a FIFO (named pipe)"
    if stat.S_ISSOCK(st.st_mode):
        return "is a socket"
    return "is not a plain file (a device?)"


def check_kinds(paths: Sequence[Path | str], what: str = "input") -> None:
    """Refuse, in one line, the first of ``paths`` that is no plain file (:func:`kind_problem`)."""
    for p in paths:
        why = kind_problem(p)
        if why:
            raise InputError(f"{what} {p} {why}; an input must be a readable HDF5 file: remove or replace it")


def folder_entries(folder: Path | str, keep) -> list[Path]:
    """The entries of ``folder`` whose name ``keep(name)`` accepts, sorted, each checked to be a plain file (or
    a link to one): an input-looking name that is a folder, a FIFO or a broken link is refused, not skipped."""
    d = Path(folder)
    out = sorted(d / n for n in os.listdir(d) if keep(n))
    check_kinds(out)
    return out
