"""Differential test against the real nltk 3.4.5 Punkt (fetched from PyPI; `-m network`).

nltk 3.4.5 does not import on Python 3.11, but its punkt.py alone does once three imports (py2
compatibility helpers, FreqDist for training, the TokenizerI base class) are stubbed. Its tokenizer,
built from the same English parameters, must split every real and random text exactly as ours.
"""

from __future__ import annotations

import random
import subprocess
import sys
import types
import zipfile
from collections import defaultdict
from pathlib import Path

import pytest

from preprocessing.text.punkt_345 import Punkt345, english_model
from preprocessing.text.textio import iter_lines, universal_newlines

pytestmark = pytest.mark.network

STUBS = {
    "from nltk.compat import unicode_repr, python_2_unicode_compatible":
        "unicode_repr = repr\ndef python_2_unicode_compatible(c):\n    return c",
    "from nltk.probability import FreqDist": "from collections import Counter as FreqDist",
    "from nltk.tokenize.api import TokenizerI": "TokenizerI = object",
}


@pytest.fixture(scope="module")
def nltk345(tmp_path_factory: pytest.TempPathFactory):  # noqa: ANN201
    d = tmp_path_factory.mktemp("nltk345")
    subprocess.run([sys.executable, "-m", "pip", "download", "nltk==3.4.5", "--no-deps", "--no-binary", ":all:",
                    "-d", str(d)], check=True, capture_output=True, timeout=300)
    with zipfile.ZipFile(d / "nltk-3.4.5.zip") as z:
        src = z.read("nltk-3.4.5/nltk/tokenize/punkt.py").decode("utf-8")
    for old, new in STUBS.items():
        assert old in src
        src = src.replace(old, new)
    mod = types.ModuleType("nltk345_punkt")
    exec(compile(src, "nltk-3.4.5/nltk/tokenize/punkt.py", "exec"), mod.__dict__)  # noqa: S102
    m = english_model()
    params = mod.PunktParameters()
    params.abbrev_types, params.collocations = set(m.abbrev_types), set(m.collocations)
    params.sent_starters, params.ortho_context = set(m.sent_starters), defaultdict(int, m.ortho_context)
    return mod.PunktSentenceTokenizer(params)


def test_same_splits_on_real_text(nltk345, golden: Path) -> None:
    ours = Punkt345()
    for n in ("wiki_00.2", "wiki_01.2", "wiki_02.2"):
        text = universal_newlines((golden / "text_chain" / "text" / "AA" / n).read_text(encoding="utf-8"))
        for line in iter_lines(text):
            assert ours.tokenize(line) == nltk345.tokenize(line), line


def test_same_splits_on_random_text(nltk345) -> None:
    """Texts made of abbreviations, initials, numbers, collocations, sentence starters, quotes,
    brackets, ellipses and odd whitespace: every branch of the two Punkt passes."""
    m = english_model()
    rng = random.Random(2020)
    abbrev, starters, colloc, ortho = (sorted(x) for x in (m.abbrev_types, m.sent_starters, m.collocations,
                                                             m.ortho_context))
    extras = ["J.", "A.B.", "1990.", "5.", "iii.", "etc.", "e.g.", "...", ". . .", "--", '"', "\u201c", "\u201d", "'",
              "(", ")", "[", "]", ";", ":", ",", "!", "?", "?!", ".", "..", "4.5", "1,000.", "co-op.", "non-U.S."]
    closers = ['."', ".)", ".\u201d", '?"', "!)", ".'", ".]"]

    def word() -> str:
        r = rng.random()
        if r < 0.25:
            return rng.choice(extras)
        if r < 0.4:
            w = rng.choice(abbrev)
            return (w.capitalize() if rng.random() < 0.3 else w) + "."
        if r < 0.5:
            return rng.choice(starters).capitalize()
        if r < 0.6:
            a, b = rng.choice(colloc)
            return a.replace("##number##", str(rng.randrange(100))) + ". " + b
        if r < 0.85:
            w = rng.choice(ortho)
            return (w.capitalize() if rng.random() < 0.5 else w) + ("." if rng.random() < 0.3 else "")
        return rng.choice(closers)

    seps = [" "] * 12 + ["  ", "\t", "\xa0", "", " \u2009", "\n", " \n\n"]
    ours = Punkt345()
    for _ in range(20000):
        text = "".join(word() + rng.choice(seps) for _ in range(rng.randrange(1, 25)))
        assert ours.tokenize(text) == nltk345.tokenize(text), text
