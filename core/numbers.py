"""Numeric command-line values checked at parse time: an argparse ``type=`` that refuses nan, inf,
values out of range and huge numbers, so argparse names the flag in one line and nothing starts."""

from __future__ import annotations

import argparse

INT_MAX = 2**31 - 1  # "huge": past what any of our counts, sizes or lengths can mean


def number(kind: type = int, lo: float | None = None, hi: float | None = None, *, lo_open: bool = False,
           hi_open: bool = False):
    """An argparse ``type=`` that parses ``kind`` and refuses nan, inf and values outside [lo, hi]
    (``lo_open``/``hi_open``: the bound itself is excluded). argparse then prints the flag's name."""
    import math

    def show(b: float) -> str:
        return str(int(b)) if kind is int else f"{b:g}"

    lo_txt = "" if lo is None else (f"> {show(lo)}" if lo_open else f">= {show(lo)}")
    hi_txt = "" if hi is None else (f"< {show(hi)}" if hi_open else f"<= {show(hi)}")
    rng = " and ".join(t for t in (lo_txt, hi_txt) if t)
    noun = "an integer" if kind is int else "a number"
    want = f"{noun} {rng}" if rng else noun

    def parse(text: str):
        try:
            v = kind(text.strip())
        except (ValueError, TypeError):
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}") from None
        if kind is float and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"expected a finite number {rng}, got {text!r}".rstrip())
        if (lo is not None and (v < lo or (lo_open and v == lo))) or (
                hi is not None and (v > hi or (hi_open and v == hi))):
            raise argparse.ArgumentTypeError(f"expected {want}, got {text!r}")
        return v

    parse.__name__ = kind.__name__
    parse.bounds = (kind, lo, hi, lo_open, hi_open)  # type: ignore[attr-defined] - read by the hostile-CLI tests
    return parse
