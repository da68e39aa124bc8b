"""create_pretraining_data: tokenize, build next-sentence pairs, mask, write TFRecords (spec §8).

This module is the plain implementation: it follows the MLPerf reference step by step and is the
oracle that the fast path (:mod:`preprocessing.mlperf.cpd_fast`, same bytes) is tested against, and the
fallback where the C extension cannot be built. One ``random.Random(cfg.random_seed)`` is created per
invocation (per part file) and passed explicitly to every function that draws from it; the order of
draws is the spec (§8.3).

Stage entry point (one TFRecord per call, for the DAG)::

    run_create_pretraining_data([Path("part-00000-of-00500")], out_dir, cfg, output_name="part-00000.tfrecord")

Arbitrary output paths, several files in parallel: :mod:`preprocessing.mlperf.cpd_run`.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO, NamedTuple

from core.errors import InputError, ManifestError
from core.schema import FEATURES
from core.stage import Stage
from preprocessing.mlperf.tokenization import FullTokenizer, check_vocab, iter_gfile_lines

if TYPE_CHECKING:
    from core.manifest import Manifest

# Imported where used (manifest, tfrecord): the fast CLI path starts without them.

log = logging.getLogger(__name__)
#: The reference's "*** Example ***" dumps of the first instances: 512-token arrays, so only shown when asked
#: (``bertpipe ... -v`` sets BERTPIPE_LOG_EXAMPLES=1, which worker processes inherit).
examples_log = logging.getLogger(__name__ + ".examples")
examples_log.setLevel(logging.INFO if os.environ.get("BERTPIPE_LOG_EXAMPLES") == "1" else logging.WARNING)

STAGE = "create_pretraining_data"
STAGE_VERSION = "1"
#: Number of leading instances logged in full, as the reference does.
LOG_EXAMPLES = 20


@dataclass(frozen=True, kw_only=True)
class CreatePretrainingDataConfig:
    """Flags of the reference's create_pretraining_data.py (same defaults) plus bertpipe's own."""

    vocab_file: str = ""  # BERT vocab.txt (required); the MLPerf one has 30,522 entries
    do_lower_case: bool = True  # lower-case and strip accents (uncased vocab)
    max_seq_length: int = 128  # reference default; MLPerf runs 512
    max_predictions_per_seq: int = 20  # reference default; MLPerf runs 76
    random_seed: int = 12345  # one fresh random.Random(seed) per invocation (per part file)
    dupe_factor: int = 10  # passes over the documents, each with different masks
    masked_lm_prob: float = 0.15  # fraction of tokens masked, in (0, 1)
    short_seq_prob: float = 0.1  # probability of a shorter target length
    skip_invalid_utf8: bool = False  # skip (and count) lines that are not UTF-8 instead of failing
    impl: str = "auto"  # "auto" (fast when built), "fast" (required) or "plain"; same bytes

    def validate(self) -> None:
        """Raise InputError for values the reference would crash on or that make no sense."""
        if not self.vocab_file:
            raise InputError("no vocab file given; pass --vocab_file=<BERT vocab.txt>")
        if self.max_seq_length < 5:
            raise InputError(f"max_seq_length={self.max_seq_length} is too small: [CLS] A [SEP] B [SEP] needs at "
                             "least 5 positions (3 special tokens and one token on each side)")
        if not 0.0 < self.masked_lm_prob < 1.0:
            raise InputError(f"masked_lm_prob={self.masked_lm_prob} must lie strictly between 0 and 1 (MLPerf: 0.15)")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise InputError(f"short_seq_prob={self.short_seq_prob} must lie between 0 and 1 (reference: 0.1)")
        if self.max_predictions_per_seq < 1:
            raise InputError(f"max_predictions_per_seq={self.max_predictions_per_seq} must be at least 1")
        if self.dupe_factor < 1:
            raise InputError(f"dupe_factor={self.dupe_factor} must be at least 1")
        if self.impl not in ("auto", "fast", "plain"):
            raise InputError(f"impl={self.impl!r}: choose auto, fast or plain")

    def output_params(self) -> dict:
        """The fields that decide the output bytes (for manifests and cache keys)."""
        d = asdict(self)
        d.pop("impl")
        return d


class Stats(NamedTuple):
    """What one invocation did."""

    documents: int
    instances: int
    input_bytes: int
    skipped_lines: int  # lines skipped as invalid UTF-8 (only with skip_invalid_utf8)
    impl: str  # "plain" or "fast": the implementation that actually ran


class Instance(NamedTuple):
    tokens: list[int]  # token ids, masked, with [CLS] A [SEP] B [SEP]
    segment_ids: list[int]
    masked_lm_positions: list[int]
    masked_lm_labels: list[int]  # ids of the original tokens
    is_random_next: bool


# ---------------------------------------------------------------------------------------------
# Reading (spec §8.2)
def decode_line(raw: bytes, path: Path, data: bytes, offset: int) -> str:
    """UTF-8-decode one line; InputError naming file, line and byte offset when it is not UTF-8."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        lineno = data.count(b"\n", 0, offset) + 1
        # exc.start counts bytes of the line without its \r; map it back onto the file.
        kept, pos = 0, offset
        while kept < exc.start or data[pos] == 0x0D:
            kept += data[pos] != 0x0D
            pos += 1
        raise InputError(f"{path}: line {lineno} is not valid UTF-8 (byte 0x{data[pos]:02x} at byte offset {pos} "
                         f"of the file: {exc.reason}); fix the text or pass --skip-invalid-utf8 to skip such lines"
                         ) from None


def read_documents(input_files: Sequence[Path], tokenizer: FullTokenizer,
                   skip_invalid_utf8: bool = False) -> tuple[list[list[list[int]]], int, int]:
    """Documents (lists of non-empty token-id segments) of all files, in order.

    Returns (documents, input bytes, skipped lines). Blank lines (after ``str.strip()``) separate
    documents, also across file boundaries exactly as in the reference; empty documents are dropped.
    """
    vocab = tokenizer.vocab
    all_documents: list[list[list[int]]] = [[]]
    nbytes = skipped = 0
    for path in input_files:
        data = Path(path).read_bytes()
        nbytes += len(data)
        for _, offset, raw in iter_gfile_lines(data):
            try:
                line = decode_line(raw, Path(path), data, offset).strip()
            except InputError:
                if not skip_invalid_utf8:
                    raise
                skipped += 1
                continue
            if not line:
                all_documents.append([])
            tokens = tokenizer.tokenize(line)
            if tokens:
                all_documents[-1].append([vocab[t] for t in tokens])
    return [d for d in all_documents if d], nbytes, skipped


# ---------------------------------------------------------------------------------------------
# Instances (spec §8.3)
def create_training_instances(all_documents: list[list[list[int]]], vocab_size: int, special: dict[str, int],
                              cfg: CreatePretrainingDataConfig, rng: random.Random) -> list[Instance]:
    """Shuffle documents, make ``dupe_factor`` passes of instances, shuffle the instances."""
    rng.shuffle(all_documents)
    instances: list[Instance] = []
    for _ in range(cfg.dupe_factor):
        for document_index in range(len(all_documents)):
            instances.extend(create_instances_from_document(all_documents, document_index, vocab_size, special,
                                                            cfg, rng))
    rng.shuffle(instances)
    return instances


def create_instances_from_document(all_documents: list[list[list[int]]], document_index: int, vocab_size: int,
                                   special: dict[str, int], cfg: CreatePretrainingDataConfig,
                                   rng: random.Random) -> list[Instance]:
    """The instances of one document: segment pairs A/B, real or random next, truncated and masked."""
    document = all_documents[document_index]
    max_num_tokens = cfg.max_seq_length - 3
    target_seq_length = max_num_tokens
    if rng.random() < cfg.short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    instances: list[Instance] = []
    current_chunk: list[list[int]] = []
    current_length = 0
    i = 0
    while i < len(document):
        current_chunk.append(document[i])
        current_length += len(document[i])
        if i == len(document) - 1 or current_length >= target_seq_length:
            a_end = 1
            if len(current_chunk) >= 2:
                a_end = rng.randint(1, len(current_chunk) - 1)
            tokens_a = [t for segment in current_chunk[:a_end] for t in segment]
            tokens_b: list[int] = []
            if len(current_chunk) == 1 or rng.random() < 0.5:  # short-circuit: no draw for one segment
                is_random_next = True
                target_b_length = target_seq_length - len(tokens_a)
                for _ in range(10):
                    random_document_index = rng.randint(0, len(all_documents) - 1)
                    if random_document_index != document_index:
                        break
                random_document = all_documents[random_document_index]
                random_start = rng.randint(0, len(random_document) - 1)
                for j in range(random_start, len(random_document)):
                    tokens_b.extend(random_document[j])
                    if len(tokens_b) >= target_b_length:
                        break
                i -= len(current_chunk) - a_end  # unused segments are revisited
            else:
                is_random_next = False
                tokens_b = [t for segment in current_chunk[a_end:] for t in segment]
            truncate_seq_pair(tokens_a, tokens_b, max_num_tokens, rng)
            tokens = [special["[CLS]"], *tokens_a, special["[SEP]"], *tokens_b, special["[SEP]"]]
            segment_ids = [0] * (len(tokens_a) + 2) + [1] * (len(tokens_b) + 1)
            tokens, positions, labels = create_masked_lm_predictions(tokens, vocab_size, special, cfg, rng)
            instances.append(Instance(tokens, segment_ids, positions, labels, is_random_next))
            current_chunk = []
            current_length = 0
        i += 1
    return instances


def truncate_seq_pair(tokens_a: list[int], tokens_b: list[int], max_num_tokens: int, rng: random.Random) -> None:
    """Trim the longer side (ties: B) one token at a time, from the front or the back at random."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        trunc_tokens = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del trunc_tokens[0]
        else:
            trunc_tokens.pop()


def create_masked_lm_predictions(tokens: list[int], vocab_size: int, special: dict[str, int],
                                 cfg: CreatePretrainingDataConfig,
                                 rng: random.Random) -> tuple[list[int], list[int], list[int]]:
    """80 % [MASK], 10 % kept, 10 % a random vocab entry; returns (tokens, positions, labels)."""
    cls_id, sep_id = special["[CLS]"], special["[SEP]"]
    cand_indexes = [i for i, t in enumerate(tokens) if t != cls_id and t != sep_id]
    rng.shuffle(cand_indexes)
    output_tokens = list(tokens)
    # Python 3 round(): banker's rounding of the double product (4.5 -> 4), as in the reference.
    num_to_predict = min(cfg.max_predictions_per_seq, max(1, int(round(len(tokens) * cfg.masked_lm_prob))))
    masked: list[tuple[int, int]] = []
    for index in cand_indexes:
        if len(masked) >= num_to_predict:
            break
        if rng.random() < 0.8:
            masked_token = special["[MASK]"]
        elif rng.random() < 0.5:
            masked_token = tokens[index]
        else:
            masked_token = rng.randint(0, vocab_size - 1)  # any vocab entry, specials included
        output_tokens[index] = masked_token
        masked.append((index, tokens[index]))
    masked.sort()
    return output_tokens, [p for p, _ in masked], [label for _, label in masked]


# ---------------------------------------------------------------------------------------------
# Writing (spec §8.4)
def instance_features(inst: Instance, max_seq_length: int, max_predictions: int) -> dict[str, list]:
    """The seven padded features of one record."""
    pad = max_seq_length - len(inst.tokens)
    n_pred = len(inst.masked_lm_positions)
    mpad = max_predictions - n_pred
    return {
        "input_ids": inst.tokens + [0] * pad,
        "input_mask": [1] * len(inst.tokens) + [0] * pad,
        "segment_ids": inst.segment_ids + [0] * pad,
        "masked_lm_positions": inst.masked_lm_positions + [0] * mpad,
        "masked_lm_ids": inst.masked_lm_labels + [0] * mpad,
        "masked_lm_weights": [1.0] * n_pred + [0.0] * mpad,
        "next_sentence_labels": [1 if inst.is_random_next else 0],
    }


def log_example(features: dict[str, list], vocab_words: Sequence[str]) -> None:
    """One "*** Example ***" block, as the reference logs it."""
    n = sum(features["input_mask"])
    if not examples_log.isEnabledFor(logging.INFO):
        return
    examples_log.info("*** Example ***")
    examples_log.info("tokens: %s", " ".join(vocab_words[i] for i in features["input_ids"][:n]))
    for name in FEATURES:
        examples_log.info("%s: %s", name, " ".join(str(x) for x in features[name]))


def write_instances(instances: Sequence[Instance], outputs: Sequence[BinaryIO], cfg: CreatePretrainingDataConfig,
                    vocab_words: Sequence[str], log_examples: int = LOG_EXAMPLES) -> None:
    """Canonical records in order, round-robin over ``outputs``; the first ones logged in full."""
    from preprocessing.mlperf.tfrecord import encode_mlperf_example, frame

    for inst_index, inst in enumerate(instances):
        features = instance_features(inst, cfg.max_seq_length, cfg.max_predictions_per_seq)
        outputs[inst_index % len(outputs)].write(frame(encode_mlperf_example(features)))
        if inst_index < log_examples:
            log_example(features, vocab_words)


# ---------------------------------------------------------------------------------------------
def create_pretraining_data_plain(input_files: Sequence[Path], outputs: Sequence[BinaryIO],
                                  cfg: CreatePretrainingDataConfig, log_examples: int = LOG_EXAMPLES) -> Stats:
    """The whole reference algorithm in Python: read, create instances, write."""
    tokenizer = FullTokenizer(cfg.vocab_file, do_lower_case=cfg.do_lower_case)
    check_vocab(tokenizer.vocab, cfg.vocab_file)
    documents, nbytes, skipped = read_documents(input_files, tokenizer, cfg.skip_invalid_utf8)
    check_documents(documents, input_files, skipped)
    special = {t: tokenizer.vocab[t] for t in ("[CLS]", "[SEP]", "[MASK]")}
    rng = random.Random(cfg.random_seed)
    n_docs = len(documents)
    instances = create_training_instances(documents, len(tokenizer.vocab), special, cfg, rng)
    write_instances(instances, outputs, cfg, list(tokenizer.vocab), log_examples)
    return Stats(n_docs, len(instances), nbytes, skipped, "plain")


def check_documents(documents: Sequence, input_files: Sequence[Path], skipped: int) -> None:
    """InputError when the inputs hold no document (the reference would write an empty file)."""
    if not documents:
        extra = f" ({skipped} invalid UTF-8 lines skipped)" if skipped else ""
        raise InputError(f"no text in {', '.join(map(str, input_files))}{extra}: the input is empty or blank; "
                         "expected one sentence per line, documents separated by blank lines")


def create_pretraining_data(input_files: Sequence[Path], outputs: Sequence[BinaryIO],
                            cfg: CreatePretrainingDataConfig, log_examples: int = LOG_EXAMPLES) -> Stats:
    """One reference invocation: every input file, one RNG, records round-robin over ``outputs``.

    ``cfg.impl`` picks the implementation: "plain" (this module), "fast" (C extension; InputError
    when it is not available) or "auto" (fast when available). The bytes are the same.
    """
    cfg.validate()
    if not input_files:
        raise InputError("no input files given")
    for p in input_files:
        if not os.path.isfile(p):
            raise InputError(f"input file {p} does not exist")
    impl: Callable[..., Stats] = create_pretraining_data_plain
    if cfg.impl != "plain":
        from preprocessing.mlperf import cpd_fast

        if cpd_fast.available():
            impl = cpd_fast.create_pretraining_data_fast
        elif cfg.impl == "fast":
            raise InputError(f"impl=fast: the C extension is not available ({cpd_fast.unavailable_reason()})")
        else:
            log.warning("create_pretraining_data: using the plain Python implementation (same bytes, ~30x slower): "
                        "%s", cpd_fast.unavailable_reason())
    return impl(list(map(Path, input_files)), outputs, cfg, log_examples)


# ---------------------------------------------------------------------------------------------
# Stage entry point (DAG): one invocation, one TFRecord, written through StageOutput.
def _verify_inputs(paths: Sequence[Path], upstream: Sequence[Manifest]) -> None:
    """Check every input (and nothing else) against the upstream manifests that list its name."""
    from core.manifest import verify_file

    entries = {}
    for m in upstream:
        for f in m.files:
            entries.setdefault(Path(f.name).name, (m, f))
    for p in paths:
        hit = entries.get(Path(p).name)
        if hit is None:
            raise ManifestError(f"input {p} is not listed in the upstream manifest(s) "
                                f"({', '.join(m.stage for m in upstream)}); re-run the upstream stage")
        m, f = hit
        verify_file(p, f.md5, f.bytes, what=f"listed in the {m.stage} manifest")


def run_create_pretraining_data(input_files: Sequence[Path], out_dir: Path,
                                cfg: CreatePretrainingDataConfig = CreatePretrainingDataConfig(), *,
                                output_name: str, upstream: Sequence[Manifest] = ()) -> Manifest:
    """The stage: ``out_dir/output_name`` from ``input_files`` (one RNG), plus ``_manifest.json``.

    Counters: documents, instances, input_bytes, skipped_invalid_utf8_lines; "impl" says which
    implementation ran. Returns the Manifest.
    """
    from core.manifest import StageOutput, md5_file

    cfg.validate()
    inputs = [Path(p) for p in input_files]
    if upstream:
        _verify_inputs(inputs, upstream)
    if not os.path.isfile(cfg.vocab_file):
        raise InputError(f"vocab file {cfg.vocab_file} does not exist")
    params = cfg.output_params()
    params.update(vocab_file=Path(cfg.vocab_file).name, vocab_md5=md5_file(cfg.vocab_file),
                  inputs=[p.name for p in inputs])
    t0 = time.perf_counter()
    with StageOutput(out_dir, STAGE, params=params, upstream=upstream, code_version=STAGE_VERSION) as out:
        with out.open(output_name) as f:
            stats = create_pretraining_data(inputs, [f], cfg)
        out.count("documents", stats.documents)
        out.count("instances", stats.instances)
        out.count("input_bytes", stats.input_bytes)
        out.count("skipped_invalid_utf8_lines", stats.skipped_lines)
        out.manifest.counters["impl"] = stats.impl
    secs = time.perf_counter() - t0
    log.info("%s: %d documents, %d instances in %.2f s (%.2f MB/s of text, %s)", output_name, stats.documents,
             stats.instances, secs, stats.input_bytes / 1e6 / max(secs, 1e-9), stats.impl)
    return out.manifest


# -- the DAG's declarations of this stage (core/stage.py) ----------------------------------------------
def _cpd_config(p: Any) -> CreatePretrainingDataConfig:
    """MLPerf's flags from the run's parameters (the vocab file is the vocab stage's output)."""
    return CreatePretrainingDataConfig(do_lower_case=p.do_lower_case, max_seq_length=p.max_seq_length,
                                       max_predictions_per_seq=p.max_predictions_per_seq, random_seed=p.random_seed,
                                       dupe_factor=p.dupe_factor, masked_lm_prob=p.masked_lm_prob,
                                       short_seq_prob=p.short_seq_prob)


def _with_vocab(plan: Any) -> CreatePretrainingDataConfig:
    from dataclasses import replace

    return replace(plan.cfg, vocab_file=str(plan.result("vocab").path("vocab.txt")))


def _plan_parts(plan: Any) -> list[Any]:
    """One call per part file, each with its own random.Random(seed) as MLPerf runs them."""
    text, cfg = plan.result("text"), _with_vocab(plan)
    return [plan.unit([str(text.path(n))], cfg=cfg, output_name=n, shard=n) for n in text.names()]


def _plan_eval(plan: Any) -> list[Any]:
    return [plan.unit([str(plan.result("text").path("eval.txt"))], cfg=_with_vocab(plan),
                      output_name="eval_intermediate")]


def _cpd_key(cfg: CreatePretrainingDataConfig) -> dict[str, Any]:
    d = cfg.output_params()
    d.pop("vocab_file")  # the vocab's content is in the key (the vocab stage), its path is not
    return d


DAG_STAGES = (
    Stage(name="tfrecord", title="create_pretraining_data: one TFRecord per part file (seed 12345 each)",
          reads=("text", "vocab"), run=run_create_pretraining_data, version=STAGE_VERSION,
          config=CreatePretrainingDataConfig, configure=_cpd_config, key_params=_cpd_key, plan=_plan_parts,
          per_shard=True, droppable=True, aliases=("create_pretraining_data",)),
    Stage(name="eval_tfrecord", title="create_pretraining_data over eval.txt", reads=("text", "vocab"),
          run=run_create_pretraining_data, version=STAGE_VERSION, config=CreatePretrainingDataConfig,
          configure=_cpd_config, key_params=_cpd_key, plan=_plan_eval, droppable=True),
)
