"""Text stages 3-6 end to end: extractor output -> ``part-XXXXX-of-00500``, ``eval.txt``, ``eval.md5``.

Runs clean (cleanup_file.py + clean.sh), segment (nltk 3.4.5 punkt), split_eval
(seperate_test_set.py) and gather (do_gather.py) exactly as the MLPerf reference does, with one
worker task per extractor file for the first three (results consumed in file order, so the output
does not depend on the number of workers) and gather streaming in the main process. Nothing is
written into the input folder; the per-file intermediates (``.1`` ... ``.4``) are kept only on request
(``keep_intermediate``), under ``out_dir/text/``.

Example::

    from preprocessing.text.pipeline import TextConfig, run_text_stages
    m = run_text_stages(Path("work/extract"), Path("work/text"), TextConfig(num_test_articles=20))
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from core.errors import InputError
from core.manifest import Manifest, StageOutput
from core.pools import default_workers, ordered_map
from core.progress import progress
from core.stage import Stage
from preprocessing.params import spell
from preprocessing.text.clean import clean_text, warn_nul
from preprocessing.text.gather import GatherConfig, PartWriter, gather_content
from preprocessing.text.segment import segment_text
from preprocessing.text.split_eval import eval_md5_line, split_text
from preprocessing.text.textio import (
    check_output_dir,
    list_wiki_files,
    read_utf8,
    relative_name,
    verify_upstream,
    write_bytes,
)

log = logging.getLogger(__name__)

STAGE_VERSION = "1"


@dataclass(frozen=True, kw_only=True)
class TextConfig:
    num_test_articles: int | None = 10000  # articles withheld for eval over all files (seperate_test_set.py);
    # None: sized from the articles found (:func:`auto_test_articles`)
    seed: int = 12345  # eval selection seed; file k draws with seed + 13*k
    block_size_mb: float = 26.92  # part size limit, MiB of raw extractor input (do_gather.py --block_size)
    num_outputs: int = 500  # the "-of-00500" in part names (names only)
    workers: int = 0  # processes for the per-file stages; 0 = one per CPU; output is independent of it
    keep_intermediate: bool = False  # also write out_dir/text/AA/wiki_00.{1,2,3,4} (the reference's files)

    def params(self) -> dict[str, object]:
        """The fields that determine the output (workers excluded)."""
        return {"num_test_articles": self.num_test_articles, "seed": self.seed, "block_size_mb": self.block_size_mb,
                "num_outputs": self.num_outputs, "keep_intermediate": self.keep_intermediate}

    def gather(self) -> GatherConfig:
        return GatherConfig(block_size_mb=self.block_size_mb, num_outputs=self.num_outputs)


@dataclass
class FileResult:
    raw_size: int  # bytes of the raw extractor file (do_gather sizes parts by it)
    train: str  # the .4 text
    tests: list[str]  # eval articles, in file order
    intermediates: dict[str, bytes]  # suffix -> bytes, when keep_intermediate
    has_nul: bool = False  # the cleaned text holds a NUL (where GNU grep's output is not reproducible)


def process_file(job: tuple[Path, int, int, TextConfig]) -> FileResult:
    """clean + segment + split_eval of one extractor file (runs in a worker process)."""
    raw_path, file_id, num_files, cfg = job
    raw = read_utf8(raw_path)
    one, two = clean_text(raw)
    three = segment_text(two)
    train, tests = split_text(three, file_id, num_files, cfg.num_test_articles, cfg.seed, name=f"{raw_path}.3")
    inter: dict[str, bytes] = {}
    if cfg.keep_intermediate:
        inter = {".1": one.encode(), ".2": two.encode(), ".3": three.encode(), ".4": train.encode()}
    return FileResult(raw_path.stat().st_size, train, tests, inter, "\x00" in one)


def _check_cfg(cfg: TextConfig) -> None:
    if cfg.num_test_articles is not None and cfg.num_test_articles < 0:
        raise InputError(f"{spell('num_test_articles')} must be >= 0, got {cfg.num_test_articles}")
    if not cfg.block_size_mb > 0:
        raise InputError(f"--block-size-mb must be > 0, got {cfg.block_size_mb}")


#: MLPerf withholds 10,000 of ~6 M articles; a smaller dump gets 10 % of its articles.
AUTO_TEST_ARTICLES, AUTO_TEST_FRACTION = 10000, 0.1


def auto_test_articles(docs_per_file: Sequence[int]) -> int:
    """The eval split for a dump of ``docs_per_file`` articles per extractor file when none is given.

    10 % of the articles, at most 10,000 (MLPerf's figure), and no more than every file can give:
    seperate_test_set.py asks file k for ``int((k+1)N/F) - int(kN/F)`` articles whatever its size (and
    loops forever when a file has fewer), so N is the largest value whose quotas fit every file.
    """
    from preprocessing.text.split_eval import num_tests_for

    n_files = len(docs_per_file)
    cap = min(AUTO_TEST_ARTICLES, max(1, int(sum(docs_per_file) * AUTO_TEST_FRACTION)))

    def fits(n: int) -> bool:
        return all(num_tests_for(k, n_files, n) <= d for k, d in enumerate(docs_per_file))

    lo, hi = 0, cap  # quotas grow with N: the largest N that fits, by bisection
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid - 1)
    return lo


def count_docs(path: Path) -> int:
    """Articles in one extractor file (its ``<doc `` lines)."""
    with open(path, "rb") as f:
        data = f.read()
    return data.count(b"\n<doc ") + data.startswith(b"<doc ")


def _sized(cfg: TextConfig, files: Sequence[Path]) -> TextConfig:
    """``cfg`` with the eval split decided (auto: from the articles of ``files``)."""
    if cfg.num_test_articles is not None:
        return cfg
    from dataclasses import replace

    n = auto_test_articles([count_docs(f) for f in files])
    if n < 1:
        raise InputError(f"the extractor files hold too few articles to withhold any for eval; pass "
                         f"{spell('num_test_articles')} explicitly")
    log.info("text: withholding %d of the dump's articles for eval (10%%, at most 10000; set %s to choose)", n,
             spell("num_test_articles"))
    return replace(cfg, num_test_articles=n)


def run_text_stages(extracted_dir: Path, out_dir: Path, cfg: TextConfig = TextConfig(),
                    upstream: Sequence[Manifest] = ()) -> Manifest:
    """clean + segment + split_eval + gather over ``extracted_dir/*/wiki_??``.

    Writes ``out_dir/part-XXXXX-of-00500``..., ``out_dir/eval.txt``, ``out_dir/eval.md5`` and the
    ``text`` stage manifest (last). ``upstream`` (the extract manifest) is verified first.

    Raises:
        InputError: missing/empty input folder, unusable output folder, undecodable input, or more
            test articles due from a file than it holds.
    """
    extracted_dir, out_dir = Path(extracted_dir), Path(out_dir)
    _check_cfg(cfg)
    files = list_wiki_files(extracted_dir, what="extractor output folder")
    verify_upstream(extracted_dir, upstream)
    check_output_dir(out_dir, extracted_dir)
    t0 = time.perf_counter()
    params, cfg = cfg.params(), _sized(cfg, files)
    jobs = [(f, k, len(files), cfg) for k, f in enumerate(files)]
    with StageOutput(out_dir, "text", params=params, upstream=upstream, code_version=STAGE_VERSION) as out:
        out.manifest.counters["num_test_articles"] = cfg.num_test_articles
        writer = PartWriter(out, cfg.gather())
        bar = progress(total=sum(f.stat().st_size for f in files), desc="text", unit="B", unit_scale=True)
        try:
            with closing(ordered_map(process_file, jobs, cfg.workers or default_workers())) as results, \
                    out.open_text("eval.txt") as ev, out.open_text("eval.md5") as md5s:
                for base, res in zip(files, results, strict=True):
                    _write_file_result(out, writer, ev, md5s, relative_name(base, extracted_dir), res)
                    bar.update(res.raw_size)
        except BaseException as exc:
            writer.close(exc)
            raise
        finally:
            bar.close()
        writer.close()
        out.count("parts", len(writer.names))
    m = out.manifest
    log.info("text: %d files, %d articles (+%d eval), %.1f MB in -> %d parts, %.1fs", m.counters["files"],
             m.counters["articles"], m.counters["eval_articles"], m.counters["bytes_in"] / 1e6,
             m.counters["parts"], time.perf_counter() - t0)
    return m


def _write_file_result(out: StageOutput, writer: PartWriter, ev: TextIO, md5s: TextIO, name: str,
                       res: FileResult) -> None:
    """One file's share of the outputs, in file order: intermediates, eval articles, part text."""
    for suffix, data in res.intermediates.items():
        write_bytes(out, f"text/{name}{suffix}", data)
    for article in res.tests:
        ev.write(article + "\n\n")
        md5s.write(eval_md5_line(article))
    writer.add(res.raw_size, gather_content(res.train, f"{name}.4"))
    out.count("files")
    out.count("bytes_in", res.raw_size)
    out.count("articles", sum(1 for a in res.train.split("\n\n") if a.strip()))
    out.count("eval_articles", len(res.tests))
    out.count("eval_empty_articles", sum(1 for a in res.tests if not a.strip()))
    if res.has_nul:
        warn_nul(name, "\x00")
        out.count("files_with_nul")


# -- the DAG's declaration of this stage (core/stage.py) -----------------------------------------------
def _text_config(p: Any) -> TextConfig:
    from core.pools import default_workers

    return TextConfig(num_test_articles=p.resolved_test_articles(), workers=p.workers or default_workers())


DAG_STAGES = (Stage(name="text", title="cleanup, sentences, eval split, gather -> part files + eval.txt",
                    reads=("extract",), run=run_text_stages, version=STAGE_VERSION, config=TextConfig,
                    configure=_text_config, key_params=TextConfig.params,
                    plan=lambda plan: [plan.unit(str(plan.result("extract").dir), cfg=plan.cfg)],
                    when=lambda p: p.source_kind == "dump", outputs={"text_dir": ""}, aliases=("text_stages",)),)
