"""The built-in sample: a small MediaWiki dump of original articles, shipped with the package.

``sample-wiki.xml.bz2`` is written by ``make_sample.py`` in this folder (deterministic bytes; regenerate with
``python -m preprocessing.sample.make_sample``). It is what ``bertpipe demo`` and the README's main command run
the pipeline on: ~50 short encyclopedia-style articles with templates (incl. ``{{CURRENTYEAR}}``), links, refs,
tables, lists, categories, redirects, non-article namespaces and odd Unicode.
"""

from __future__ import annotations

from pathlib import Path

SAMPLE_NAME = "sample-wiki.xml.bz2"
SAMPLE_MD5 = "7feec221ac818a85c20b476bf6121f5f"  # of the packaged file; update with make_sample.py (a test checks)


def sample_dump_path() -> Path:
    """Path of the packaged sample dump (``preprocessing/sample/sample-wiki.xml.bz2``)."""
    path = Path(__file__).resolve().parent / SAMPLE_NAME
    if not path.is_file():
        from core.errors import InputError

        raise InputError(f"{path} is missing from this installation; regenerate it with "
                         "`python -m preprocessing.sample.make_sample`")
    return path
