"""vocab: learn an uncased WordPiece vocab.txt from training part files (corpora that ship without one).

The MLPerf data set comes with Google's uncased BERT vocab (30,522 entries). A corpus without one (the
built-in sample, another language's dump) gets its own, learned over the *training* part files only
(never eval.txt). Words are split by the Hugging Face ``tokenizers`` BERT normalizer and pre-tokenizer,
i.e. as ``FullTokenizer(do_lower_case=True)`` splits them (clean, CJK split, lower-case, strip accents,
punctuation), then WordPiece merges are learned as ``tokenizers``' WordPieceTrainer learns them (BPE
over ``##``-continued characters, most frequent pair first).

Why not call ``tokenizers.trainers.WordPieceTrainer`` itself: its ids for equally frequent symbols
follow Rust hash-map order, so two runs on the same files give different vocabs (measured: 2 of 3,000
tokens differ run to run). Here every tie is broken by the pair's text, so the bytes are reproducible.

Layout, as in the MLPerf vocab: ``[PAD]`` 0, ``[unused0]`` … ``[unused98]`` 1–99, ``[UNK]`` 100,
``[CLS]`` 101, ``[SEP]`` 102, ``[MASK]`` 103, then the learned tokens (single characters first, then
``##`` continuations, sorted, then the merges in the order they were learned).

    bertpipe vocab --input 'results/part-*' --out work/vocab --vocab-size 30522
"""

from __future__ import annotations

import heapq
import logging
from collections import Counter, defaultdict
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from itertools import pairwise
from pathlib import Path
from typing import Any

from core.errors import InputError
from core.manifest import Manifest, StageOutput, md5_file, verify_file
from core.stage import Stage

log = logging.getLogger(__name__)

STAGE_VERSION = "1"
VOCAB_NAME = "vocab.txt"
#: BERT's reserved ids: [PAD] 0, [unused0..98] 1..99, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103.
SPECIAL = ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]


@dataclass(frozen=True, kw_only=True)
class VocabConfig:
    """Parameters of the WordPiece vocab learner."""

    vocab_size: int = 30522  # entries in vocab.txt incl. the 104 reserved ones (MLPerf: 30,522)
    min_frequency: int = 2  # a merge must be seen at least this often
    limit_alphabet: int = 1000  # most frequent initial characters kept (BERT's own setting)
    lowercase: bool = True  # uncased, as the MLPerf vocab (FullTokenizer do_lower_case=True)

    def validate(self) -> None:
        if self.vocab_size <= len(SPECIAL):
            raise InputError(f"vocab_size={self.vocab_size} must exceed the {len(SPECIAL)} reserved tokens "
                             "([PAD], [unused0-98], [UNK], [CLS], [SEP], [MASK])")
        if self.min_frequency < 1 or self.limit_alphabet < 1:
            raise InputError("min_frequency and limit_alphabet must be at least 1")


def _lines(files: Sequence[Path]) -> Iterator[str]:
    """Non-blank lines of the part files (one sentence per line), read as the reference reads them."""
    for path in files:
        try:
            with open(path, encoding="utf-8", newline="\n") as f:
                for line in f:
                    line = line.replace("\r", "").strip()
                    if line:
                        yield line
        except UnicodeDecodeError as exc:
            raise InputError(f"{path} is not UTF-8 text ({exc}); expected part files of the text stages") from None


def _word_counts(files: Sequence[Path], cfg: VocabConfig) -> Counter[str]:
    """Words of the corpus as FullTokenizer splits them (tokenizers' BERT normalizer + pre-tokenizer)."""
    from tokenizers import normalizers, pre_tokenizers

    norm = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                      strip_accents=cfg.lowercase, lowercase=cfg.lowercase)
    pre = pre_tokenizers.BertPreTokenizer()
    counts: Counter[str] = Counter()
    for line in _lines(files):
        counts.update(w for w, _ in pre.pre_tokenize_str(norm.normalize_str(line)))
    return counts


def _alphabet(counts: Counter[str], limit: int) -> set[str]:
    """The ``limit`` most frequent characters (ties: by character), as BERT's vocab builder keeps them."""
    chars: Counter[str] = Counter()
    for w, c in counts.items():
        for ch in w:
            chars[ch] += c
    return {ch for ch, _ in sorted(chars.items(), key=lambda kv: (-kv[1], kv[0]))[:limit]}


def _merges(words: list[list[str]], freq: list[int], n_merges: int, min_frequency: int) -> list[str]:
    """WordPiece (BPE-style) merges: the most frequent adjacent pair first, ties by the pair's text.

    Incremental pair counts with a lazy max-heap, so each merge touches only the words holding it.
    """
    pairs: Counter[tuple[str, str]] = Counter()
    where: dict[tuple[str, str], set[int]] = defaultdict(set)
    for i, w in enumerate(words):
        for p in pairwise(w):
            pairs[p] += freq[i]
            where[p].add(i)
    heap = [(-c, a, b) for (a, b), c in pairs.items()]
    heapq.heapify(heap)
    learned: list[str] = []
    while heap and len(learned) < n_merges:
        neg, a, b = heapq.heappop(heap)
        if pairs.get((a, b), 0) != -neg:
            continue  # stale entry: the pair's count changed since it was pushed
        if -neg < min_frequency:
            break
        new = a + b.removeprefix("##")
        learned.append(new)
        changed: set[tuple[str, str]] = set()
        for i in sorted(where.pop((a, b))):
            w, c = words[i], freq[i]
            for p in pairwise(w):
                pairs[p] -= c
                changed.add(p)
            out, j = [], 0
            while j < len(w):
                if j + 1 < len(w) and w[j] == a and w[j + 1] == b:
                    out.append(new)
                    j += 2
                else:
                    out.append(w[j])
                    j += 1
            words[i] = out
            for p in pairwise(out):
                pairs[p] += c
                where[p].add(i)
                changed.add(p)
        pairs.pop((a, b), None)
        for p in sorted(changed):
            if pairs.get(p, 0) > 0:
                heapq.heappush(heap, (-pairs[p], *p))
    return learned


def _learn(files: Sequence[Path], cfg: VocabConfig) -> list[str]:
    """Reserved tokens, the alphabet (sorted), its ``##`` continuations (sorted), then merges in order."""
    counts = _word_counts(files, cfg)
    alphabet = _alphabet(counts, cfg.limit_alphabet)
    words, freq, cont = [], [], set()
    for w, c in sorted(counts.items()):
        symbols = [ch if k == 0 else "##" + ch for k, ch in enumerate(w) if ch in alphabet]
        cont.update(s for s in symbols[1:] if s.startswith("##"))
        words.append(symbols)
        freq.append(c)
    base = SPECIAL + sorted(alphabet) + sorted(cont)
    merges = _merges(words, freq, max(0, cfg.vocab_size - len(base)), cfg.min_frequency)
    seen = set(base)
    return (base + [t for t in merges if not (t in seen or seen.add(t))])[:cfg.vocab_size]


def learn_vocab(files: Sequence[Path], cfg: VocabConfig = VocabConfig()) -> list[str]:
    """The vocab's lines (index = token id) learned from ``files``."""
    cfg.validate()
    if not files:
        raise InputError("the vocab stage got no training part files (expected part-XXXXX-of-00500 files)")
    for p in files:
        if not Path(p).is_file():
            raise InputError(f"part file {p} does not exist")
    tokens = _learn([Path(p) for p in files], cfg)
    if len(tokens) == len(SPECIAL):
        raise InputError(f"no words found in {', '.join(map(str, files))}: the part files are empty")
    return tokens


def run_vocab(part_files: Sequence[Path], out_dir: Path, cfg: VocabConfig = VocabConfig(),
              upstream: Sequence[Manifest] = ()) -> Manifest:
    """Stage function: ``out_dir/vocab.txt`` learned from ``part_files``; counters tokens, files."""
    files = [Path(p) for p in part_files]
    entries = {Path(f.name).name: f for m in upstream for f in m.files}
    for p in files if upstream else ():
        f = entries.get(p.name)
        if f is None:
            raise InputError(f"{p} is not listed in the upstream manifest(s); re-run the text stage")
        verify_file(p, f.md5, f.bytes, what="per the upstream manifest")
    tokens = learn_vocab(files, cfg)
    with StageOutput(out_dir, "vocab", params=asdict(cfg), upstream=upstream, code_version=STAGE_VERSION) as out:
        with out.open_text(VOCAB_NAME) as f:
            f.write("".join(t + "\n" for t in tokens))
        out.count("tokens", len(tokens))
        out.count("files", len(files))
    if len(tokens) < cfg.vocab_size:
        log.info("vocab: the corpus supports only %d of the %d requested entries", len(tokens), cfg.vocab_size)
    log.info("vocab: %d tokens from %d part files -> %s", len(tokens), len(files), out.path(VOCAB_NAME))
    return out.manifest


def run_import_vocab(vocab_file: Path, out_dir: Path) -> Manifest:
    """Stage function: a given vocab.txt copied into ``out_dir`` (the data set carries the vocab it was made
    with); refused when it is not a BERT vocab (a special token missing)."""
    from preprocessing.mlperf.tokenization import check_vocab, load_vocab

    vocab_file = Path(vocab_file)
    tokens = load_vocab(vocab_file)
    check_vocab(tokens, vocab_file)
    data = vocab_file.read_bytes()
    with StageOutput(out_dir, "vocab", params={"source": str(vocab_file)}, code_version=STAGE_VERSION) as out:
        with out.open(VOCAB_NAME) as f:
            f.write(data)
        out.count("tokens", len(tokens))
    log.info("vocab: %s -> %s", vocab_file, out.path(VOCAB_NAME))
    return out.manifest


# -- the DAG's declarations of this stage (core/stage.py) ----------------------------------------------
def _plan_learn(plan: Any) -> list[Any]:
    text = plan.result("text")
    return [plan.unit([str(text.path(n)) for n in text.names()], cfg=plan.cfg)]


def _given(p: Any) -> Path:
    path = Path(p.vocab).resolve()
    if not path.is_file():
        from preprocessing.params import spell

        raise InputError(f"{spell('vocab')} {p.vocab}: no such file; pass a BERT vocab.txt or leave it out to "
                         "learn one (the vocab stage)")
    return path


DAG_STAGES = (
    Stage(name="vocab", title="an uncased WordPiece vocab.txt learned from the training part files",
          reads=("text",), run=run_vocab, version=STAGE_VERSION, config=VocabConfig,
          configure=lambda p: VocabConfig(vocab_size=p.resolved_vocab_size(), lowercase=p.do_lower_case),
          key_params=asdict, plan=_plan_learn, when=lambda p: p.vocab is None and p.source_kind != "mlcommons",
          outputs={"vocab": VOCAB_NAME}),
    Stage(name="vocab", title="the given vocab.txt, copied into the data set", reads=(), run=run_import_vocab,
          version=STAGE_VERSION, configure=lambda p: None, key_extra=lambda p: {"md5": md5_file(_given(p))},
          check=_given,
          plan=lambda plan: [plan.unit(str(_given(plan.params)))], when=lambda p: p.vocab is not None,
          pass_upstream=False, outputs={"vocab": VOCAB_NAME}),
)
