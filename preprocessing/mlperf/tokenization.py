"""BERT tokenization exactly as the MLPerf reference's ``tokenization.py`` (spec §8.1).

``FullTokenizer`` = ``BasicTokenizer`` (clean, CJK spacing, whitespace split, Python ``lower()``,
NFD + drop category Mn, split on punctuation) followed by ``WordpieceTokenizer`` (greedy
longest-match-first, 200-character word limit, a word that cannot be covered becomes one [UNK]).
The reference's ``preserve_unused_tokens`` flag is False there, so it does not exist here.

The only departure from the reference's code is a per-word cache in ``FullTokenizer`` (WordPiece of a
word is a pure function of the word), which changes nothing but the speed.

Vocab files are read like the reference reads them (TF ``GFile.readline``): split on ``\\n`` only,
every ``\\r`` deleted, UTF-8, ``str.strip()``; the first occurrence of a token wins and ids are
insertion counts (identical to line numbers for a vocab without duplicates or blank lines).
"""

from __future__ import annotations

import os
import unicodedata
from collections.abc import Iterator

from core.errors import InputError

#: Tokens create_pretraining_data needs in every vocab.
REQUIRED_TOKENS = ("[CLS]", "[SEP]", "[MASK]", "[UNK]")

_CJK_RANGES = (
    (0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F),
)


def iter_gfile_lines(data: bytes) -> Iterator[tuple[int, int, bytes]]:
    """Lines as TF's ``GFile.readline`` returns them: (1-based line number, byte offset, line bytes).

    Splits on ``\\n`` only (the ``\\n`` is dropped: callers strip anyway) and deletes every ``\\r``.
    A final piece that is empty after deleting ``\\r`` is end of file, as for the reference.
    """
    pos, lineno, n = 0, 0, len(data)
    while pos < n:
        end = data.find(b"\n", pos)
        last = end < 0
        if last:
            end = n
        raw = data[pos:end]
        line = raw.replace(b"\r", b"") if b"\r" in raw else raw
        lineno += 1
        if last and not line:
            return
        yield lineno, pos, line
        pos = end + 1


_VOCABS: dict[tuple, dict[str, int]] = {}


def load_vocab(vocab_file: str | os.PathLike) -> dict[str, int]:
    """token -> id, read like the reference (first occurrence wins, ids are insertion counts).

    Cached per process by path, size, mtime and inode (a 30,522-entry vocab takes ~25 ms to read, as long as
    create_pretraining_data takes on a small part file); the dict is shared: do not modify it.
    """
    try:
        st = os.stat(vocab_file)
    except FileNotFoundError:
        raise InputError(f"vocab file {vocab_file} does not exist; pass --vocab_file with a BERT vocab.txt") from None
    key = (os.path.realpath(vocab_file), st.st_size, st.st_mtime_ns, st.st_ino)
    if key not in _VOCABS:
        if len(_VOCABS) > 8:
            _VOCABS.clear()
        _VOCABS[key] = _read_vocab(vocab_file)
    return _VOCABS[key]


def _read_vocab(vocab_file: str | os.PathLike) -> dict[str, int]:
    try:
        with open(vocab_file, "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise InputError(f"vocab file {vocab_file} does not exist; pass --vocab_file with a BERT vocab.txt") from None
    try:  # the whole file at once (fast); the line loop below only runs to name a bad line
        lines = data.replace(b"\r", b"").decode("utf-8").split("\n")
    except UnicodeDecodeError:
        for lineno, _, raw in iter_gfile_lines(data):
            try:
                raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise InputError(f"vocab file {vocab_file} line {lineno} is not valid UTF-8 ({exc.reason})") from None
        raise
    if lines and not lines[-1]:
        lines.pop()  # what follows the last \n is end of file when empty
    vocab: dict[str, int] = {}
    for line in lines:
        token = line.strip()
        if token not in vocab:
            vocab[token] = len(vocab)
    return vocab


def check_vocab(vocab: dict[str, int], vocab_file: str | os.PathLike) -> None:
    """Raise InputError when the vocab lacks a special token create_pretraining_data writes."""
    missing = [t for t in REQUIRED_TOKENS if t not in vocab]
    if missing:
        raise InputError(f"vocab file {vocab_file} has no {', '.join(missing)} entry (it has {len(vocab)} tokens); "
                         f"a BERT vocab needs all of {', '.join(REQUIRED_TOKENS)}")


def whitespace_tokenize(text: str) -> list[str]:
    """Python's ``str.split()``: every Unicode whitespace character separates."""
    return text.split()


def _is_whitespace(char: str) -> bool:
    return char in " \t\n\r" or unicodedata.category(char) == "Zs"


def _is_control(char: str) -> bool:
    if char in "\t\n\r":
        return False
    return unicodedata.category(char) in ("Cc", "Cf")


def _is_punctuation(char: str) -> bool:
    cp = ord(char)
    if 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126:
        return True
    return unicodedata.category(char).startswith("P")


def _is_chinese_char(cp: int) -> bool:
    if cp < 0x3400:  # fast exit for most text; the ranges are _CJK_RANGES
        return False
    return (0x4E00 <= cp <= 0x9FFF or 0x3400 <= cp <= 0x4DBF or 0x20000 <= cp <= 0x2A6DF or 0x2A700 <= cp <= 0x2B73F
            or 0x2B740 <= cp <= 0x2B81F or 0x2B820 <= cp <= 0x2CEAF or 0xF900 <= cp <= 0xFAFF
            or 0x2F800 <= cp <= 0x2FA1F)


class BasicTokenizer:
    """Cleaning, CJK spacing, lower-casing, accent stripping and punctuation splitting."""

    def __init__(self, do_lower_case: bool = True) -> None:
        self.do_lower_case = do_lower_case

    def tokenize(self, text: str) -> list[str]:
        text = self._clean_text(text)
        text = self._tokenize_chinese_chars(text)
        split_tokens: list[str] = []
        for token in whitespace_tokenize(text):
            if self.do_lower_case:
                token = self._run_strip_accents(token.lower())
            split_tokens.extend(self._run_split_on_punc(token))
        return whitespace_tokenize(" ".join(split_tokens))

    @staticmethod
    def _run_strip_accents(text: str) -> str:
        return "".join(c for c in unicodedata.normalize("NFD", text) if unicodedata.category(c) != "Mn")

    @staticmethod
    def _run_split_on_punc(text: str) -> list[str]:
        output: list[list[str]] = []
        start_new_word = True
        for char in text:
            if _is_punctuation(char):
                output.append([char])
                start_new_word = True
            else:
                if start_new_word:
                    output.append([])
                start_new_word = False
                output[-1].append(char)
        return ["".join(x) for x in output]

    @staticmethod
    def _tokenize_chinese_chars(text: str) -> str:
        return "".join(f" {c} " if _is_chinese_char(ord(c)) else c for c in text)

    @staticmethod
    def _clean_text(text: str) -> str:
        output = []
        for char in text:
            cp = ord(char)
            if cp == 0 or cp == 0xFFFD or _is_control(char):
                continue
            output.append(" " if _is_whitespace(char) else char)
        return "".join(output)


class WordpieceTokenizer:
    """Greedy longest-match-first WordPiece; ``##`` marks continuation pieces."""

    def __init__(self, vocab: dict[str, int], unk_token: str = "[UNK]", max_input_chars_per_word: int = 200) -> None:
        self.vocab = vocab
        self.unk_token = unk_token
        self.max_input_chars_per_word = max_input_chars_per_word

    def tokenize(self, text: str) -> list[str]:
        output: list[str] = []
        for token in whitespace_tokenize(text):
            output.extend(self.tokenize_word(token))
        return output

    def tokenize_word(self, word: str) -> list[str]:
        """The pieces of one whitespace-free word (a single [UNK] when it cannot be covered)."""
        if len(word) > self.max_input_chars_per_word:
            return [self.unk_token]
        pieces: list[str] = []
        start = 0
        while start < len(word):
            end = len(word)
            piece = None
            while start < end:
                sub = word[start:end] if start == 0 else "##" + word[start:end]
                if sub in self.vocab:
                    piece = sub
                    break
                end -= 1
            if piece is None:
                return [self.unk_token]
            pieces.append(piece)
            start = end
        return pieces


class FullTokenizer:
    """BasicTokenizer then WordPiece, with the reference's vocab loading."""

    def __init__(self, vocab_file: str | os.PathLike | None = None, do_lower_case: bool = True, *,
                 vocab: dict[str, int] | None = None) -> None:
        if vocab is None:
            if vocab_file is None:
                raise ValueError("FullTokenizer needs vocab_file or vocab")
            vocab = load_vocab(vocab_file)
        self.vocab = vocab
        self.inv_vocab = {v: k for k, v in self.vocab.items()}
        self.basic_tokenizer = BasicTokenizer(do_lower_case=do_lower_case)
        self.wordpiece_tokenizer = WordpieceTokenizer(vocab=self.vocab)
        self._cache: dict[str, list[str]] = {}

    def tokenize(self, text: str) -> list[str]:
        split_tokens: list[str] = []
        cache = self._cache
        for token in self.basic_tokenizer.tokenize(text):
            pieces = cache.get(token)
            if pieces is None:
                pieces = self.wordpiece_tokenizer.tokenize(token)
                if len(cache) < 1_000_000:
                    cache[token] = pieces
            split_tokens.extend(pieces)
        return split_tokens

    def convert_tokens_to_ids(self, tokens: list[str]) -> list[int]:
        return [self.vocab[t] for t in tokens]

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        return [self.inv_vocab[i] for i in ids]
