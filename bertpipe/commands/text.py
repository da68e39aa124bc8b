"""Runs clean, segment, split-eval and gather in one pass, without intermediate files:

  bertpipe text --extracted text --out results --num_test_articles=10000 --block_size=26.92
  bertpipe text --dump enwiki-20200101-pages-articles-multistream.xml.bz2 --out results
  bertpipe text --dump https://.../dump.xml.bz2 --md5 <md5> --out results

With --dump, a URL is downloaded (resumable, md5-verified) and the dump extracted (WikiExtractor)
into <out>/_work/ first; a local dump file is read in place. The output is byte-identical to the
MLPerf reference scripts (cleanup_file.py, clean.sh, nltk 3.4.5 segmentation, seperate_test_set.py,
do_gather.py) run on the same extractor output.
"""

from __future__ import annotations

import argparse
import logging
import time
from pathlib import Path

from bertpipe.commands._common import flag, nonneg_int, number, overwrite_flag, positive_int
from bertpipe.commands.text_stages import block_size_flag
from core.paths import path_arg

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--extracted", type=path_arg, metavar="DIR", help="WikiExtractor output folder (AA/wiki_00, ...)")
    src.add_argument("--dump", metavar="FILE_OR_URL",
                     help="a MediaWiki dump (.xml.bz2 or .xml): local path, file:// or https:// URL, or a "
                     "download preset such as enwiki-latest")
    p.add_argument("--out", type=path_arg, required=True, metavar="DIR", help="folder for part-XXXXX-of-00500, eval.txt, eval.md5")
    flag(p, "num_test_articles", type=positive_int(), default=10000, metavar="N", help="articles withheld for eval (default: 10000)")
    block_size_flag(p)
    flag(p, "seed", type=number(int, -(2**63), 2**63 - 1), default=12345, metavar="N", help="eval selection seed (default: 12345)")
    p.add_argument("--workers", type=nonneg_int(4096), default=0, metavar="N", help="worker processes (default: one per CPU; "
                   "the output does not depend on it)")
    flag(p, "keep_intermediate", action="store_true",
         help="also write the reference's per-file intermediates to <out>/text/AA/wiki_00.{1,2,3,4}")
    g = p.add_argument_group("with --dump")
    g.add_argument("--md5", default=None, help="expected md5 of a downloaded dump")
    flag(g, "current_time", default=None, metavar="ISO",
         help="the time {{CURRENTYEAR}} & co. expand to, e.g. 2020-01-01T00:00:00 (default: now); when "
         "pinned, a re-run reuses a finished extraction of the same dump")
    p.add_argument("--work", type=path_arg, default=None, metavar="DIR", help="folder for download/extract with --dump "
                   "(default: <out>/_work)")
    overwrite_flag(p)


def check_paths(args: argparse.Namespace) -> None:
    """The source exists (a folder, or a dump file unless it is a URL/preset); --out and --work are not inputs."""
    from core.paths import PathCheck

    pc = PathCheck(overwrite=args.overwrite)
    if args.extracted is not None:
        pc.input_dir("--extracted", args.extracted, "WikiExtractor output folder")
    else:
        from bertpipe.commands.download import check_source

        check_source(args.dump)
        if "://" not in args.dump and (Path(args.dump).exists() or "/" in args.dump or args.dump.endswith(
                (".bz2", ".xml"))):
            pc.input_file("--dump", args.dump, "dump")
    pc.output_dir("--out", args.out, ["_manifest.json", "eval.txt", "eval.md5"], stage="text")
    if args.work is not None:
        pc.output_dir("--work", args.work)


def _extract_dump(args: argparse.Namespace) -> tuple[Path, list]:
    """Download (URLs only) and extract the dump; returns the extractor folder and its manifest."""
    from preprocessing.text.extract import ExtractConfig, run_extract

    work = args.work or args.out / "_work"
    upstream: list = []
    local = Path(args.dump)
    if not local.is_file():  # a URL or a download preset (run_download names a missing local path)
        from preprocessing.text.download import run_download

        dl = run_download(args.dump, work / "download", md5=args.md5)
        local = work / "download" / dl.files[0].name
        upstream = [dl]
    cfg = ExtractConfig(processes=args.workers or _cpus(), current_time=args.current_time)
    prev = _reusable_extraction(work / "extract", local, cfg.params(), upstream)
    if prev is not None:
        log.info("text: reusing the extraction in %s (same dump and settings; delete it to redo)", work / "extract")
        return work / "extract", [prev]
    m = run_extract(local, work / "extract", cfg, upstream=upstream)
    return work / "extract", [m]


def _reusable_extraction(extract_dir: Path, dump: Path, params: dict, upstream: list):  # noqa: ANN202
    """A finished extraction of the same dump with the same settings (a pinned --current-time), or None.

    The dump is "the same" when it came through a verified download with the same md5, or, for a
    local file, has the recorded size. The text stages then re-check every extracted file's md5.
    """
    from core.manifest import is_done

    if params.get("current_time") is None:
        return None  # {{CURRENTYEAR}} & co. follow the clock: extract again
    prev = is_done(extract_dir, check_md5=False)
    if prev is None or prev.params != params:
        return None
    if prev.upstream != {f"{m.stage}:{m.key}": m.digest for m in upstream}:
        return None
    if not upstream and prev.counters.get("dump_bytes") != dump.stat().st_size:
        return None
    return prev


def _cpus() -> int:
    from core.pools import default_workers

    return default_workers()


def run(args: argparse.Namespace) -> int:
    from preprocessing.text.pipeline import TextConfig, run_text_stages

    t0 = time.perf_counter()
    check_paths(args)
    cfg = TextConfig(num_test_articles=args.num_test_articles, block_size_mb=args.block_size_mb, seed=args.seed,
                     workers=args.workers, keep_intermediate=args.keep_intermediate)
    if args.dump:
        extracted, upstream = _extract_dump(args)
    else:
        extracted, upstream = args.extracted, []
    m = run_text_stages(extracted, args.out, cfg, upstream=upstream)
    c = m.counters
    parts = sum(1 for f in m.files if f.name.startswith("part-"))
    print(f"text: {c['files']} files, {c['articles']} articles + {c['eval_articles']} eval, "
          f"{c['bytes_in'] / 1e6:.2f} MB in -> {parts} part file(s), eval.txt, eval.md5 in {args.out}, "
          f"{time.perf_counter() - t0:.1f} s")
    return 0
