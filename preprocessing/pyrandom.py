"""``random.Random(seed).shuffle`` of ``range(n)``, as a NumPy permutation, fast and with the same result.

NVIDIA's MLPerf BERT ``shuffle_samples.py`` (training_results_v3.x; spec §10) shuffles a Python list of
``(file, row)`` pairs with ``random.Random(24).shuffle``. For the full data set that list has ~156 M tuples
(~15 GB of Python objects, minutes of interpreter time). The permutation depends only on the list's length and
the seed, so this module computes it as an int32/int64 array:

* the random numbers: CPython's Mersenne Twister; ``Random(seed)``'s state is handed to NumPy's ``MT19937``
  bit generator, whose raw 32-bit outputs are the same stream (``random_raw``);
* the draws: ``shuffle`` visits ``i = n-1 .. 1`` and takes ``j = _randbelow(i + 1)``: ``k = (i+1).bit_length()``,
  ``r = getrandbits(k)`` (one 32-bit output shifted right by ``32 - k``), redrawn while ``r >= i + 1``. The draws
  of a block are taken at once; only the few raw values whose accept/reject depends on the draws before them in
  the block are settled one by one;
* the swaps ``x[i], x[j] = x[j], x[i]``: a block of consecutive steps whose swaps touch disjoint positions is
  applied at once with fancy indexing (independent swaps commute); a block with a collision, and the last
  :data:`PY_TAIL` steps, are applied one by one.

:func:`shuffle_permutation` equals ``x = list(range(n)); random.Random(seed).shuffle(x)`` for every ``n`` and
integer ``seed`` on CPython 3.8-3.13 (``shuffle`` and ``_randbelow_with_getrandbits`` are unchanged there; the
tests compare against the installed interpreter's own ``random``). Memory: two arrays of ``n`` indices.

:class:`Shuffles` runs CPython's loop itself in C when ``preprocessing._pack_native`` is available
(:mod:`preprocessing.pack_fast`: ~70 ns a step, memory-bound), and these NumPy blocks otherwise.
"""

from __future__ import annotations

import random

import numpy as np

#: Below this bound the draws and swaps run one by one (plain Python is faster than NumPy on tiny blocks).
PY_TAIL = 1 << 16
#: Raw 32-bit values generated at once.
_RAW_CHUNK = 1 << 20


class _Stream:
    """The raw 32-bit outputs of ``random.Random(seed)``, consumed in order (with push-back)."""

    def __init__(self, seed: int) -> None:
        self._start(random.Random(seed).getstate()[1])

    @classmethod
    def from_state(cls, state: np.ndarray) -> _Stream:
        """The stream from a Mersenne Twister state (624 words and the position, as ``getstate()[1]``)."""
        self = cls.__new__(cls)
        self._start([int(v) for v in state])
        return self

    def _start(self, state: list[int] | tuple[int, ...]) -> None:
        self.bg = np.random.MT19937()
        self.bg.state = {"bit_generator": "MT19937",
                         "state": {"key": np.array(state[:624], dtype=np.uint32), "pos": int(state[624])}}
        self.buf = np.empty(0, dtype=np.uint64)
        self.pos = 0

    def take(self, count: int) -> np.ndarray:
        """The next ``count`` raw values (uint64 holding 32 bits), consumed."""
        if self.pos + count > len(self.buf):
            more = max(count, _RAW_CHUNK)
            self.buf = np.concatenate([self.buf[self.pos:], self.bg.random_raw(more)])
            self.pos = 0
        out = self.buf[self.pos:self.pos + count]
        self.pos += count
        return out

    def unread(self, count: int) -> None:
        """Give back the last ``count`` values taken (they were not used)."""
        self.pos -= count


def _draws(n: int, stream: _Stream) -> np.ndarray:
    """``j`` of every step ``i = n-1 .. 1`` (index ``n-1-i``): ``_randbelow(i + 1)`` in CPython's order."""
    dtype = np.int32 if n < (1 << 31) else np.int64
    out = np.empty(max(n - 1, 0), dtype=dtype)
    filled = 0
    bound = n  # the bound of the next step: i + 1
    while bound >= 2:
        k = bound.bit_length()
        low = max(2, 1 << (k - 1))  # this bit length covers bounds low .. bound
        if bound < PY_TAIL:
            filled = _draws_python(bound, stream, out, filled)
            break
        block = max(256, min(1 << 16, bound >> 10))
        while bound >= low:
            raw = stream.take(block)
            r = (raw >> np.uint64(32 - k)).astype(np.int64)
            t = np.arange(block, dtype=np.int64)
            sure_yes = r < bound - t  # below the lowest bound draw t can see: accepted whatever came before
            unsure = ~sure_yes & (r < bound)  # between: depends on how many were accepted before it
            acc = sure_yes.copy()
            if unsure.any():
                before = np.concatenate([[0], np.cumsum(sure_yes)])  # sure accepts before each draw
                extra = 0  # unsure draws accepted so far
                for pos in np.flatnonzero(unsure).tolist():
                    if r[pos] < bound - (before[pos] + extra):
                        acc[pos] = True
                        extra += 1
            need = bound - low + 1  # accepts left in this bit length
            hits = np.flatnonzero(acc)
            if len(hits) > need:  # the block runs past this bit length: keep draws up to the last needed accept
                used = int(hits[need - 1]) + 1
                stream.unread(block - used)
                hits = hits[:need]
            out[filled:filled + len(hits)] = r[hits]
            filled += len(hits)
            bound -= len(hits)
    return out


def _draws_python(bound: int, stream: _Stream, out: np.ndarray, filled: int) -> int:
    raw = None
    used = 0
    vals: list[int] = []
    while bound >= 2:
        k = bound.bit_length()
        shift = 32 - k
        while True:
            if raw is None or used == len(raw):
                raw = stream.take(4096).tolist()
                used = 0
            r = raw[used] >> shift
            used += 1
            if r < bound:
                break
        vals.append(r)
        bound -= 1
    if raw is not None:
        stream.unread(len(raw) - used)
    out[filled:filled + len(vals)] = vals
    return filled + len(vals)


def shuffle_permutation(n: int, seed: int) -> np.ndarray:
    """``p`` with ``p.tolist() == x`` after ``x = list(range(n)); random.Random(seed).shuffle(x)``.

    So a list ``L`` of length ``n`` shuffled by ``random.Random(seed).shuffle`` becomes ``[L[i] for i in p]``.
    """
    return Shuffles(seed).permutation(n)


class Shuffles:
    """Successive shuffles by one ``random.Random(seed)``: ``permutation(n)`` is the next ``rng.shuffle`` of a
    list of ``n`` items, drawing what it draws (NVIDIA's generate_packing_strategy.py shuffles 512 index lists,
    then the list of packs, with one generator)."""

    def __init__(self, seed: int) -> None:
        from preprocessing import pack_fast

        self.seed = seed
        # the C loop (preprocessing/_pack_native: one draw and one swap a step) when it is available; else the
        # NumPy blocks below. Once a shuffle has gone to NumPy, the rest follow it (the stream reads ahead).
        self.state = pack_fast.shuffle_state(seed) if pack_fast.available() else None
        self.stream: _Stream | None = None

    def permutation(self, n: int) -> np.ndarray:
        if n < 0:
            raise ValueError(f"n must be >= 0, got {n}")
        if self.state is not None:
            from preprocessing import pack_fast

            out = pack_fast.native_shuffle(self.state, n)
            if out is not None:
                return out if n > 1 else out.astype(np.int64)
            self.stream = _Stream.from_state(self.state)
            self.state = None
        if self.stream is None:
            self.stream = _Stream(self.seed)
        return _permutation(n, self.stream)


    def shuffle(self, x: np.ndarray) -> None:
        """The next ``rng.shuffle`` applied to ``x``'s values in place: ``x`` becomes ``x[self.permutation(len(x))]``
        (the same draws), without that permutation or a copy of ``x`` where the C loop runs."""
        if self.state is not None and len(x) > 1:
            from preprocessing import pack_fast

            if pack_fast.native_shuffle_inplace(self.state, x):
                return
        if len(x) > 1:
            x[:] = x[self.permutation(len(x))]
        else:
            self.permutation(len(x))  # draws nothing


def _permutation(n: int, stream: _Stream) -> np.ndarray:
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    js = _draws(n, stream)
    dtype = js.dtype if n > 1 else np.int64
    x = np.arange(n, dtype=dtype)
    step = 0  # index into js: step i = n - 1 - step
    i = n - 1
    while i >= PY_TAIL:
        block = min(16384, int(0.5 * i ** 0.5), i - PY_TAIL + 1)
        ii = np.arange(i, i - block, -1, dtype=np.int64)
        jj = js[step:step + block].astype(np.int64)
        # The steps before the first one that collides with an earlier step of the block touch disjoint
        # positions (j <= i, so a step can only collide with an earlier one: its i was an earlier j, or its
        # j was an earlier j): they are applied at once.
        first = block
        hit = (jj > i - block) & (jj != ii)  # step t's j is the i of the later step i - j
        if hit.any():
            first = int((i - jj[hit]).min())
        order = np.argsort(jj, kind="stable")
        twice = jj[order[1:]] == jj[order[:-1]]  # the later of two equal j's (stable sort: index order)
        if twice.any():
            first = min(first, int(order[1:][twice].min()))
        ii, jj = ii[:first], jj[:first]
        xi, xj = x[ii], x[jj]
        x[ii] = xj
        x[jj] = xi
        step += first
        i -= first
    if i >= 1:  # the tail: positions 0..i only
        head = x[:i + 1].tolist()
        for a, b in zip(range(i, 0, -1), js[step:].tolist(), strict=True):
            head[a], head[b] = head[b], head[a]
        x[:i + 1] = head
    return x
