"""The tokenizer against the reference's rules (spec §8.1), with a hand-written vocab and the MLPerf vocab."""

from __future__ import annotations

import random
import unicodedata

import pytest

from core.errors import InputError
from preprocessing.mlperf.tokenization import (
    _CJK_RANGES,
    BasicTokenizer,
    FullTokenizer,
    check_vocab,
    iter_gfile_lines,
    load_vocab,
)

VOCAB = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "want", "##want", "##ed", "wa", "un", "runn", "##ing", ",",
         "[", "]", "mask", "a", "##a", "low", "##er", "hello", "world", ".", "中", "αλεξανδρος", "σ", "ς", "x", "y"]


@pytest.fixture()
def tok(tmp_path) -> FullTokenizer:
    p = tmp_path / "vocab.txt"
    p.write_text("".join(t + "\n" for t in VOCAB), encoding="utf-8")
    return FullTokenizer(p)


@pytest.fixture(scope="module")
def real(shared_data) -> FullTokenizer:
    return FullTokenizer(shared_data / "vocab.txt")


def test_wordpiece_greedy_longest_match_and_whole_word_unk(tok):
    assert tok.tokenize("UNwant\u00e9d,running") == ["un", "##want", "##ed", ",", "runn", "##ing"]
    assert tok.tokenize("unwantedX lower") == ["[UNK]", "low", "##er"]  # one piece missing -> whole word [UNK]


def test_200_character_limit(tok, real):
    assert tok.tokenize("a" * 200) == ["a"] + ["##a"] * 199
    assert tok.tokenize("a" * 201) == ["[UNK]"]
    # 101..200 characters are tokenized (HF tokenizers stops at 100)
    assert real.tokenize("a" * 150)[0] == "aaa" and "[UNK]" not in real.tokenize("a" * 150)
    assert real.tokenize("a" * 201) == ["[UNK]"]


def test_literal_special_tokens_are_text(tok, real):
    assert tok.tokenize("[MASK]") == ["[", "mask", "]"]
    assert real.convert_tokens_to_ids(real.tokenize("[MASK] and [CLS]")) == [1031, 7308, 1033, 1998, 1031, 18856,
                                                                              2015, 1033]


def test_private_use_characters_are_kept_as_unk(tok, real):
    assert tok.tokenize("x \ue000 y") == ["x", "[UNK]", "y"]
    assert real.tokenize("\ue000 x") == ["[UNK]", "x"]
    assert real.tokenize("x\U000f0000") == ["[UNK]"]  # plane-15 private use, glued to a word


def test_final_sigma_uses_python_lower(tok, real):
    assert BasicTokenizer().tokenize("ΑΛΕΞΑΝΔΡΟΣ ΣΑ") == ["αλεξανδρος", "σα"]
    assert tok.tokenize("ΑΛΕΞΑΝΔΡΟΣ") == ["αλεξανδρος"]
    assert real.tokenize("ΑΛΕΞΑΝΔΡΟΣ.")[-2:] == ["##ος", "."]  # HF lower-cases to σ and gets other pieces


@pytest.mark.parametrize(("lo", "hi"), [(0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
                                        (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F)])
def test_cjk_ranges_are_split_inclusive(lo, hi):
    bt = BasicTokenizer()
    for cp in (lo, hi):
        out = bt.tokenize(f"x{chr(cp)}y")  # compatibility ideographs (F900..) change under NFD
        assert out == ["x", unicodedata.normalize("NFD", chr(cp)), "y"], hex(cp)
    ranges = _CJK_RANGES
    for cp in (lo - 1, hi + 1):
        c = chr(cp)
        if any(a <= cp <= b for a, b in ranges) or unicodedata.category(c).startswith(("P", "Z", "C", "M")):
            continue  # the neighbour is itself CJK (adjacent ranges) or not a word character
        assert len(bt.tokenize(f"x{c}y")) == 1, hex(cp)  # just outside: part of the word


def test_control_and_whitespace_characters():
    bt = BasicTokenizer()
    assert bt.tokenize("a\x00b\ufffdc\u200bd") == ["abcd"]  # NUL, U+FFFD and Cf are deleted, joining
    assert bt.tokenize("c\x0bd e\x1cf g\x85h") == ["cd", "ef", "gh"]  # Cc deleted even where str.split would split
    assert bt.tokenize("a\u00a0b\u3000c\td") == ["a", "b", "c", "d"]  # Zs and tab are spaces
    assert bt.tokenize("a\u2028b\u2029c") == ["a", "b", "c"]  # kept by _clean_text, split by str.split
    assert bt.tokenize("\x7f") == []


def test_punctuation_rule():
    bt = BasicTokenizer()
    assert bt.tokenize("a$b^c`d~e") == ["a", "$", "b", "^", "c", "`", "d", "~", "e"]  # ASCII symbols count
    assert bt.tokenize("x\u00bfy\u2014z") == ["x", "\u00bf", "y", "\u2014", "z"]  # category P*
    assert bt.tokenize("x\u00a9y") == ["x\u00a9y"]  # So is not punctuation


def test_accents_lowercase_and_cased_mode():
    assert BasicTokenizer().tokenize("Héllo İstanbul") == ["hello", "istanbul"]  # İ -> i + U+0307 (Mn) dropped
    assert BasicTokenizer(do_lower_case=False).tokenize("Héllo, World") == ["Héllo", ",", "World"]


def test_carriage_returns_inside_lines_are_deleted():
    data = b"a\rb\nc\r\n\r\nlast\r"
    assert [(n, o, raw) for n, o, raw in iter_gfile_lines(data)] == [(1, 0, b"ab"), (2, 4, b"c"), (3, 7, b""),
                                                                     (4, 9, b"last")]
    assert list(iter_gfile_lines(b"x\n\r")) == [(1, 0, b"x")]  # a final lone \r is end of file


def test_vocab_loading_first_wins_and_insertion_ids(tmp_path):
    p = tmp_path / "v.txt"
    p.write_bytes(b"[PAD]\r\n[UNK]\n  a  \na\n\nb\n\n[CLS]\n[SEP]\n[MASK]")
    vocab = load_vocab(p)
    assert vocab == {"[PAD]": 0, "[UNK]": 1, "a": 2, "": 3, "b": 4, "[CLS]": 5, "[SEP]": 6, "[MASK]": 7}
    check_vocab(vocab, p)


def test_vocab_missing_specials_is_a_clear_error(tmp_path):
    p = tmp_path / "v.txt"
    p.write_text("[PAD]\n[UNK]\n[CLS]\nhello\n")
    with pytest.raises(InputError, match=r"no \[SEP\], \[MASK\] entry"):
        check_vocab(load_vocab(p), p)
    with pytest.raises(InputError, match="does not exist"):
        load_vocab(tmp_path / "missing.txt")


def test_native_ascii_tokenizer_matches_python(tmp_path, shared_data):
    """The C tokenizer of pure-ASCII lines agrees with the Python one on random lines."""
    from preprocessing.mlperf import cpd_fast

    native = cpd_fast.load()
    if native is None:
        pytest.skip(cpd_fast.unavailable_reason())
    vocab = load_vocab(shared_data / "vocab.txt")
    py = FullTokenizer(vocab=vocab)
    for lower in (True, False):
        py = FullTokenizer(vocab=vocab, do_lower_case=lower)
        eng = native.Engine(list(vocab), lower, vocab["[UNK]"], vocab["[CLS]"], vocab["[SEP]"], vocab["[MASK]"])
        rng = random.Random(7)
        alphabet = "abcdeXYZ019 ,.'-$^`~[]\t\x00\x01\x0b\x0c\x1c\x1f\x7f\r" + "aeiou" * 6 + " " * 8
        lines = ["a" * 200, "b" * 201, "[MASK] [CLS]", " \x0b\x0c\x1c\x1f\t ", "\x00", "x\ry"]
        lines += ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 80))) for _ in range(2000)]
        for line in lines:
            text = line.replace("\r", "").strip()
            expected = None if not text else py.convert_tokens_to_ids(py.tokenize(text))
            assert eng.tokenize_line(line.encode()) == expected, repr(line)
