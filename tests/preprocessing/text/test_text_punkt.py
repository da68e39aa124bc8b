"""nltk 3.4.5 Punkt, re-implemented: model, edge cases where nltk 3.9+ differs, and the segment stage."""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from preprocessing.text import punkt_345
from preprocessing.text.punkt_345 import Punkt345, english_model
from preprocessing.text.segment import segment_text
from preprocessing.text.textio import iter_lines, universal_newlines


@pytest.fixture(scope="module")
def tok() -> Punkt345:
    return Punkt345()


def test_english_model_is_the_official_one() -> None:
    m = english_model()  # spec §5: the counts of nltk's english.pickle
    assert (len(m.abbrev_types), len(m.collocations), len(m.sent_starters), len(m.ortho_context)) == (156, 37, 39, 20366)
    assert {"dr", "mr", "u.s", "inc", "p.m"} <= m.abbrev_types and "etc" not in m.abbrev_types
    assert ("##number##", "financing") in m.collocations and "however" in m.sent_starters


CASES = [
    # 3.4.5: a period followed by a closing curly quote is no candidate (3.9+ splits after the quote)
    ("They wish to seek “acceptance, not cures.” There have also been many events.\n",
     ["They wish to seek “acceptance, not cures.” There have also been many events."]),
    # `. . .".`: every lone period breaks; `.".` stays one token-run (3.9+ splits it into `.` / `".`)
    ('keys like those of a piano etc . . .". With this machine he could analyze a syllogism.\n',
     ["keys like those of a piano etc .", ".", '.".', "With this machine he could analyze a syllogism."]),
    ('He said "stop.". Then he left.\n', ['He said "stop.".', "Then he left."]),
    ("Dr. Smith went home. He was tired.", ["Dr. Smith went home.", "He was tired."]),  # known abbreviation
    ("The U.S. Army arrived. Then it left.", ["The U.S. Army arrived.", "Then it left."]),
    ("J. S. Bach was born in 1685. He died in 1750.", ["J. S. Bach was born in 1685.", "He died in 1750."]),
    ("(Sent1.) Sent2.", ["(Sent1.)", "Sent2."]),  # closing bracket realigned onto the sentence before
    ("See Section 3.)  Or Section 2.)  ", ["See Section 3.)", "Or Section 2.)"]),
    ("Wait... what? Yes!! OK.", ["Wait... what?", "Yes!!", "OK."]),
    ("a!b. c", ["a!b.", "c"]),  # a break inside the context token breaks at the candidate's end
    ("No punctuation here \n", ["No punctuation here"]),
    ("", []),
    (" \n", []),
]


@pytest.mark.parametrize(("text", "expected"), CASES)
def test_tokenize_edge_cases(tok: Punkt345, text: str, expected: list[str]) -> None:
    assert tok.tokenize(text) == expected


def test_nltk_310_differs_exactly_where_the_spec_says(tok: Punkt345) -> None:
    """Documents why nltk cannot simply be used: same parameters, different splits."""
    pytest.importorskip("nltk")
    ref = punkt_345.nltk_tokenizer()
    curly, dotted = CASES[0][0], CASES[1][0]
    assert ref.tokenize(curly) != tok.tokenize(curly)
    assert ref.tokenize(dotted) != tok.tokenize(dotted)
    for text, _ in CASES[2:]:
        assert ref.tokenize(text) == tok.tokenize(text), text


def test_agrees_with_nltk_on_real_text_but_the_known_quirks(tok: Punkt345, golden: Path) -> None:
    """On the golden .2 text the only differing lines hold a closing curly quote or `.".`."""
    pytest.importorskip("nltk")
    ref = punkt_345.nltk_tokenizer()
    differing = []
    for n in ("wiki_00.2", "wiki_01.2", "wiki_02.2"):
        text = universal_newlines((golden / "text_chain" / "text" / "AA" / n).read_text(encoding="utf-8"))
        for line in iter_lines(text):
            if tok.tokenize(line) != ref.tokenize(line):
                differing.append(line)
    assert 1 <= len(differing) <= 3
    assert all("”" in line or '."' in line for line in differing)


def test_linear_candidate_search_equals_nltk_345_regex() -> None:
    """candidates() yields exactly the matches of nltk 3.4.5's (quadratic) period-context regex."""
    nw = r"""(?:[?!)";}\]*:@'({\[])"""
    original = re.compile(rf"\S*[.?!](?=(?P<after_tok>{nw}|\s+(?P<next_tok>\S+)))")
    rng = random.Random(7)
    alphabet = "ab A.?!.)\"'”( ,;-\t\n\xa0:[]{}*@\x1c\x85\u2028\u3000\u200b"
    for _ in range(20000):
        s = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 30)))
        want = [(m.start(), m.end(), m.group("after_tok"), m.start("next_tok") if m.group("next_tok") else None)
                for m in original.finditer(s)]
        assert list(punkt_345.candidates(s)) == want, s


def test_segment_text_reference_line_rules(tok: Punkt345) -> None:
    # blank line -> article separator; `\r` (clean.sh's </doc>) is a line break; final "\n" added
    assert segment_text("\nFirst one. Second one.\n", tok) == "\nFirst one.\nSecond one.\n\n"
    assert segment_text("a b\rc d.\n", tok) == "a b\nc d.\n\n"
    assert segment_text("x y\r\nz.\n", tok) == "x y\nz.\n\n"
    # a one-character last line (no newline) also counts as "blank" before being segmented
    assert segment_text("Hi there.\nX", tok) == "Hi there.\n\nX\n\n"
    # whitespace-only lines vanish (no sentences, length > 1)
    assert segment_text("  \nA b.\n", tok) == "A b.\n\n"


def test_word_fast_path_equals_word_regex() -> None:
    rng = random.Random(3)
    alphabet = "aZé_9.. \t\xa0-,;:'\"()!?"
    def word() -> str:  # mostly word characters, sometimes punctuation
        return "".join(rng.choice("aZé_9" if rng.random() < 0.85 else alphabet) for _ in range(rng.randrange(1, 6)))

    fast = 0
    for _ in range(20000):
        ctx = word() + "." + rng.choice([" ", "\t", "\xa0", "  "]) + word()  # the shape of most contexts
        fast += punkt_345._SIMPLE_CONTEXT_RE.fullmatch(ctx) is not None
        assert punkt_345._words(ctx) == punkt_345.WORD_RE.findall(ctx), ctx
    assert fast > 1000
    assert punkt_345._words("Smith. He") == ["Smith.", "He"]
