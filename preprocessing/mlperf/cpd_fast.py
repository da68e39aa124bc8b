"""The fast create_pretraining_data: same bytes as the plain implementation, ~40x faster.

What it uses, and why:

* a small C extension, ``preprocessing._cpd_native`` (sources in ``preprocessing/_native/``), built
  by ``pip install`` (setup.py) or, when the installed copy is missing or stale, compiled on first use
  with the system C compiler into ``$XDG_CACHE_HOME/bertpipe/native/`` (``BERTPIPE_NATIVE_CACHE``
  overrides the folder). It reads and tokenizes every pure-ASCII line (92 % of MLPerf lines) with the
  reference's exact algorithm, replays CPython's MT19937 from ``random.Random(seed).getstate()`` so
  it draws exactly the reference's stream, creates and masks the instances, and writes canonical
  TFRecords with CRC32C (the SSE4.2 instruction when the CPU has it);
* lines with other characters are split by the C reader into ``str.split()`` chunks: the tokens of a
  chunk do not depend on its neighbours (unless the line holds one of the few characters that
  ``str.split`` treats as whitespace but the reference deletes, \\v \\f \\x1c-\\x1f U+0085: such lines,
  and lines that are not UTF-8, go whole to Python). ASCII chunks are tokenized in C, the others by
  the plain Python tokenizer with a cache (Python's ``lower()``/NFD/``unicodedata`` rules stay exact,
  e.g. the final sigma that HF ``tokenizers`` gets wrong).

* for the data DAG's fused tfrecord+hdf5 call, the engine also fills the padded HDF5 rows of the instances
  it wrote (``Engine.fill_padded``; :func:`keeping_engine` hands the engine over), so the TFRecord is
  not parsed again.

No TensorFlow, numpy or numba is imported: start-up is the Python interpreter plus this module.
Set ``BERTPIPE_NATIVE=0`` to disable the extension (everything then runs the plain implementation).
"""

from __future__ import annotations

import contextvars
import gc
import logging
import random
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType
from typing import Any, BinaryIO

from core.native import NativeModule
from preprocessing.mlperf.create_pretraining_data import (
    CreatePretrainingDataConfig,
    Instance,
    Stats,
    check_documents,
    decode_line,
    instance_features,
    log_example,
)
from preprocessing.mlperf.tokenization import FullTokenizer, check_vocab, load_vocab

log = logging.getLogger(__name__)

ABI = 2  # must equal the extension's ABI constant; bump both when the C interface changes
NATIVE_DIR = Path(__file__).resolve().parent.parent / "_native"  # the C core stays at the top of preprocessing/ (its extension module: preprocessing._cpd_native)
_NATIVE = NativeModule("preprocessing._cpd_native", NATIVE_DIR, "cpd.c", ABI, "create_pretraining_data C core")
# Characters that str.split() splits on but the reference's _clean_text deletes (they join words).
_JOINERS = re.compile("[\x0b\x0c\x1c-\x1f\x85]")
# Where create_pretraining_data_fast leaves its engine after writing (see keeping_engine).
_ENGINE_SINK: contextvars.ContextVar[list[Any] | None] = contextvars.ContextVar("cpd_engine_sink", default=None)


@contextmanager
def keeping_engine() -> Iterator[list[Any]]:
    """Collect the engine of every fast invocation run inside the block, once it has written its records.

    The fused tfrecord+hdf5 path (:func:`preprocessing.mlperf.tfrecord_to_hdf5.run_fused`) fills the padded HDF5 from
    the instances the engine holds (``Engine.fill_padded``) instead of parsing the TFRecord it just wrote. The
    list stays empty when the plain implementation ran (``BERTPIPE_NATIVE=0``, no C compiler).
    """
    sink: list[Any] = []
    token = _ENGINE_SINK.set(sink)
    try:
        yield sink
    finally:
        _ENGINE_SINK.reset(token)


def _is_current(mod: ModuleType) -> bool:
    """An installed extension is used when its ABI matches and it was built from the sources beside it."""
    return _NATIVE.is_current(mod)


def load() -> ModuleType | None:
    """The extension module, building it into the cache on first use if needed; None if impossible."""
    return _NATIVE.load(is_current=lambda mod: _is_current(mod))  # late-bound: a test may replace _is_current


def available() -> bool:
    """True when the fast path can run (the extension is importable or was just compiled)."""
    return load() is not None


def unavailable_reason() -> str:
    load()
    return _NATIVE.reason or "available"


class _LineTokenizer:
    """Callback of the C reader for lines that are not pure ASCII: exact Python tokenization."""

    def __init__(self, tokenizer: FullTokenizer, skip_invalid_utf8: bool,
                 ascii_line: Callable[[bytes], list[int] | None] | None = None) -> None:
        self.tokenizer = tokenizer
        self.ascii_line = ascii_line  # the engine's C tokenizer for pure-ASCII text
        self.vocab = tokenizer.vocab
        self.skip = skip_invalid_utf8
        self.cache: dict[str, list[int]] = {}
        self.byte_cache: dict[bytes, list[int]] = {}
        self.skipped = 0
        self.path = Path()
        self.data = b""

    def ids(self, text: str) -> list[int]:
        vocab = self.vocab
        return [vocab[t] for t in self.tokenizer.tokenize(text)]

    def __call__(self, raw: bytes, offset: int) -> list[int] | None:
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError:
            if self.skip:
                self.skipped += 1
                return []
            decode_line(raw, self.path, self.data, offset)  # raises InputError with file, line, offset
            raise
        line = line.strip()
        if not line:
            return None
        if _JOINERS.search(line):
            return self.ids(line)
        out: list[int] = []
        cache = self.cache
        for chunk in line.split():
            ids = cache.get(chunk)
            if ids is None:
                if self.ascii_line is not None and chunk.isascii():
                    ids = self.ascii_line(chunk.encode())
                else:
                    ids = self.ids(chunk)
                cache[chunk] = ids
            out += ids
        return out

    def chunk(self, raw: bytes) -> list[int]:
        """Ids of one whitespace-free, non-ASCII, valid UTF-8 chunk of a line (cached)."""
        ids = self.byte_cache.get(raw)
        if ids is None:
            ids = self.byte_cache[raw] = self.ids(raw.decode("utf-8"))
        return ids


def create_pretraining_data_fast(input_files: Sequence[Path], outputs: Sequence[BinaryIO],
                                 cfg: CreatePretrainingDataConfig, log_examples: int = 20) -> Stats:
    """One reference invocation on the C engine; same bytes as create_pretraining_data_plain."""
    native = load()
    if native is None:
        raise RuntimeError(f"the C extension is not available: {_NATIVE.reason}")
    vocab = load_vocab(cfg.vocab_file)
    check_vocab(vocab, cfg.vocab_file)
    tokenizer = FullTokenizer(vocab=vocab, do_lower_case=cfg.do_lower_case)
    engine = native.Engine(list(vocab), cfg.do_lower_case, vocab["[UNK]"], vocab["[CLS]"], vocab["[SEP]"],
                           vocab["[MASK]"])
    fallback = _LineTokenizer(tokenizer, cfg.skip_invalid_utf8, engine.tokenize_line)
    gc_was_enabled = gc.isenabled()
    gc.disable()  # the Python side creates few, acyclic objects: collections would be pure overhead
    try:
        return _run(engine, fallback, vocab, input_files, outputs, cfg, log_examples)
    finally:
        if gc_was_enabled:
            gc.enable()


def _run(engine: Any, fallback: _LineTokenizer, vocab: dict[str, int], input_files: Sequence[Path],
         outputs: Sequence[BinaryIO], cfg: CreatePretrainingDataConfig, log_examples: int) -> Stats:
    """Read every input into the engine, create the instances, write them, log the first ones."""
    nbytes = 0
    for path in input_files:
        data = Path(path).read_bytes()
        nbytes += len(data)
        fallback.path, fallback.data = Path(path), data
        engine.add_file(data, fallback, fallback.chunk)
        fallback.data = b""
        del data
    n_docs = engine.num_documents()
    check_documents([None] * n_docs, input_files, fallback.skipped)
    state = random.Random(cfg.random_seed).getstate()[1]
    n = engine.create(state, cfg.max_seq_length, cfg.max_predictions_per_seq, cfg.dupe_factor,
                      cfg.masked_lm_prob, cfg.short_seq_prob)
    engine.write(list(outputs))
    sink = _ENGINE_SINK.get()
    if sink is not None:
        sink.append(engine)
    words = list(vocab)
    for k in range(min(n, log_examples)):
        tokens, len_a, positions, labels, is_random = engine.instance(k)
        segment_ids = [0] * (len_a + 2) + [1] * (len(tokens) - len_a - 2)
        inst = Instance(tokens, segment_ids, positions, labels, is_random)
        log_example(instance_features(inst, cfg.max_seq_length, cfg.max_predictions_per_seq), words)
    return Stats(n_docs, n, nbytes, fallback.skipped, "fast")
