"""Helpers shared by subcommands: reference-style flag spellings and absl-style booleans."""

from __future__ import annotations

import argparse

from core.numbers import INT_MAX, number

__all__ = ["INT_MAX", "bool_flag", "flag", "nonneg_int", "number", "overwrite_flag", "parse_bool",
           "positive_int"]


def parse_bool(text: str) -> bool:
    """absl/TF1 boolean flag values: True/False, true/false, 1/0, yes/no."""
    t = text.strip().lower()
    if t in ("true", "t", "1", "yes", "y"):
        return True
    if t in ("false", "f", "0", "no", "n"):
        return False
    raise argparse.ArgumentTypeError(f"expected a boolean (True/False), got {text!r}")


def flag(p: argparse.ArgumentParser | argparse._ArgumentGroup, name: str, **kw) -> argparse.Action:
    """Add ``--dashed-name`` and the reference's ``--underscored_name`` spelling of one option.

    ``name`` is written with underscores, as in the reference script (e.g. "max_seq_length").
    Both ``--max_seq_length=512`` and ``--max-seq-length 512`` then work.
    """
    dashed, under = "--" + name.replace("_", "-"), "--" + name
    opts = [dashed] if dashed == under else [dashed, under]
    kw.setdefault("dest", name)
    return p.add_argument(*opts, **kw)


def bool_flag(p: argparse.ArgumentParser | argparse._ArgumentGroup, name: str, default: bool, help: str) -> None:
    """A boolean in absl style: ``--name``, ``--name=True|False``, ``--noname`` (both spellings)."""
    dashed, under = name.replace("_", "-"), name
    opts = sorted({f"--{dashed}", f"--{under}"})
    p.add_argument(*opts, dest=name, nargs="?", const=True, default=default, type=parse_bool,
                   help=f"{help} (default: {default})")
    neg = sorted({f"--no{under}", f"--no-{dashed}"})
    p.add_argument(*neg, dest=name, action="store_false", help=argparse.SUPPRESS)


def positive_int(hi: int = INT_MAX):
    """An integer >= 1 (and <= hi)."""
    return number(int, 1, hi)


def nonneg_int(hi: int = INT_MAX):
    """An integer >= 0 (and <= hi)."""
    return number(int, 0, hi)


def overwrite_flag(p: argparse.ArgumentParser, what: str = "a folder that already holds another data set") -> None:
    p.add_argument("--overwrite", action="store_true", help=f"replace {what} (default: refuse)")
