"""Stage 5, split_eval: ``seperate_test_set.py`` of the MLPerf reference (``.3`` -> ``.4`` + eval).

Spec §6, quirks included. For file number ``file_id`` of ``num_files`` (every input file counts):

* ``num_tests = int((file_id+1)*N/num_files) - int(file_id*N/num_files)`` with N test articles;
* ``rng = random.Random(seed + 13*file_id)``; the file is read without newline translation and split
  on ``"\\n\\n"``: the file ends with ``"\\n\\n"``, so the last "article" is the empty string — and it
  can be picked (the official eval.md5 holds md5("") 60 times);
* ids are drawn with ``int(rng.random()*num_articles)``, repeats skipped;
* non-test articles go to ``.4`` as ``article + "\\n\\n"``; test articles, in file order, go to
  ``eval.txt`` the same way and to ``eval.md5`` as ``md5(article.rstrip())``.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from core.errors import InputError
from core.manifest import Manifest, StageOutput
from core.pools import default_workers, ordered_map
from core.progress import progress
from preprocessing.params import spell
from preprocessing.text.textio import (
    check_output_dir,
    list_wiki_files,
    read_utf8,
    relative_name,
    verify_upstream,
    write_bytes,
)

STAGE_VERSION = "1"


@dataclass(frozen=True, kw_only=True)
class SplitEvalConfig:
    num_test_articles: int = 10000  # articles withheld over all files (reference --num_test_articles)
    seed: int = 12345  # base seed; file k uses seed + 13*k (reference --seed)
    workers: int = 0  # processes; 0 = one per CPU (output does not depend on it)


def num_tests_for(file_id: int, num_files: int, num_test_articles: int) -> int:
    """How many test articles file ``file_id`` gives (0 or 1 per file for the full dump)."""
    return int((file_id + 1) * num_test_articles * 1.0 / num_files) - int(file_id * num_test_articles * 1.0 / num_files)


def pick_test_ids(num_articles: int, num_tests: int, seed: int) -> list[int]:
    """The reference's draw: distinct ``int(random()*num_articles)`` values, in draw order."""
    if num_tests > num_articles:
        raise ValueError(f"cannot pick {num_tests} test articles out of {num_articles}")
    rng = random.Random(seed)
    ids: list[int] = []
    while len(ids) < num_tests:
        new = int(rng.random() * num_articles)
        if new not in ids:
            ids.append(new)
    return ids


def split_text(text: str, file_id: int, num_files: int, num_test_articles: int,
               seed: int = 12345, name: str = "") -> tuple[str, list[str]]:
    """Split one ``.3`` text: returns (``.4`` text, the test articles in file order)."""
    articles = text.split("\n\n")
    num_tests = num_tests_for(file_id, num_files, num_test_articles)
    if num_tests > len(articles):
        raise InputError(
            f"{name or f'file {file_id}'}: {num_tests} test articles are due from this file but it holds only "
            f"{len(articles)} (counting the empty trailing one); lower {spell('num_test_articles')} "
            f"(the reference script loops forever here)")
    picked = set(pick_test_ids(len(articles), num_tests, seed + file_id * 13))
    train: list[str] = []
    tests: list[str] = []
    for i, article in enumerate(articles):
        if i in picked:
            tests.append(article)
        else:
            train.append(article)
            train.append("\n\n")
    return "".join(train), tests


def eval_md5_line(article: str) -> str:
    """One ``eval.md5`` line: md5 of the article without trailing whitespace."""
    return hashlib.md5(article.rstrip().encode("utf-8")).hexdigest() + "\n"


def _split_one(job: tuple[Path, str, int, int, int, int]) -> tuple[bytes, list[str]]:
    base, suffix, file_id, num_files, num_test_articles, seed = job
    path = Path(str(base) + suffix)
    train, tests = split_text(read_utf8(path), file_id, num_files, num_test_articles, seed, name=str(path))
    return train.encode("utf-8"), tests


def run_split_eval(in_dir: Path, out_dir: Path, cfg: SplitEvalConfig = SplitEvalConfig(),
                   upstream: Sequence[Manifest] = ()) -> Manifest:
    """``<in_dir>/*/wiki_??.3`` -> ``<out_dir>/*/wiki_??.4`` + ``eval.txt`` + ``eval.md5``."""
    in_dir, out_dir = Path(in_dir), Path(out_dir)
    files = list_wiki_files(in_dir, ".3", what="segmented text folder")
    verify_upstream(in_dir, upstream)
    check_output_dir(out_dir, in_dir)
    if cfg.num_test_articles < 0:
        raise InputError(f"{spell('num_test_articles')} must be >= 0, got {cfg.num_test_articles}")
    jobs = [(b, ".3", k, len(files), cfg.num_test_articles, cfg.seed) for k, b in enumerate(files)]
    params = {"num_test_articles": cfg.num_test_articles, "seed": cfg.seed}
    with StageOutput(out_dir, "split_eval", params=params, upstream=upstream, code_version=STAGE_VERSION) as out:
        results = ordered_map(_split_one, jobs, cfg.workers or default_workers())
        with out.open_text("eval.txt") as ev, out.open_text("eval.md5") as md5s:
            for base, (train, tests) in progress(zip(files, results, strict=True), total=len(files),
                                                 desc="split_eval", unit="file"):
                write_bytes(out, relative_name(base, in_dir, ".4"), train)
                for article in tests:
                    ev.write(article + "\n\n")
                    md5s.write(eval_md5_line(article))
                out.count("files")
                out.count("eval_articles", len(tests))
    return out.manifest
