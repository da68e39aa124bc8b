"""WikiExtractor over a MediaWiki dump -> <out>/AA/wiki_00, AA/wiki_01 ...

  bertpipe extract --dump enwiki-latest-pages-articles-multistream.xml.bz2 --out work/text --processes 8
  bertpipe extract --dump sample.xml.bz2 --out text --current-time 2020-01-01T00:00:00
  bertpipe extract --dump enwiki-20200101-pages-articles-multistream.xml.bz2 --out text --extractor mlperf \
      --extractor-script WikiExtractor.py --current-time 2020-01-01T00:00:00

Two extractors: ``mlperf``, the script MLPerf pins (attardi/wikiextractor @ 3162bb6c, WikiExtractor.py: fetched
from that commit and sha256-checked, or --extractor-script PATH; its bytes, for any --processes), the default
for a dump named enwiki-20200101*; ``wikiextractor-3.1``, the PyPI package 3.1.0, the default for any other.

The reference's layout (spec §2): <doc id url title> lines, the title, the text, </doc>, 1 MB files, 100
per folder. The .bz2 dump is read directly. --current-time pins what {{CURRENTYEAR}} & co. expand to, so
the output is reproducible (the reference used the clock). The output does not depend on --processes.
With a -multistream dump (what `bertpipe download enwiki-latest` fetches) every worker decompresses its own
bz2 streams, so the stage scales with --processes; a single-stream dump is decompressed by one thread.
"""

from __future__ import annotations

import argparse
import os

from bertpipe.commands._common import flag, overwrite_flag, positive_int
from core.paths import path_arg


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dump", type=path_arg, required=True, help="MediaWiki dump, .xml.bz2 (or uncompressed .xml)")
    p.add_argument("--out", type=path_arg, required=True, help="output folder (gets AA/wiki_00 ... and _manifest.json)")
    p.add_argument("--processes", type=positive_int(4096), default=max(1, (os.cpu_count() or 2) - 1),
                   help="worker processes (default: CPUs - 1); the output does not depend on it")
    flag(p, "current_time", default=None, metavar="ISO",
         help="time for {{CURRENTYEAR}} & co., e.g. 2020-01-01T00:00:00 (default: now, as the reference)")
    p.add_argument("--bytes", type=parse_size, default="1M", help="max bytes per output file, n[KMG] (default: 1M)")
    p.add_argument("--no-templates", action="store_true", help="do not expand templates")
    p.add_argument("--extractor", choices=("mlperf", "wikiextractor-3.1"), default=None,
                   help="mlperf: WikiExtractor.py @ 3162bb6c, MLPerf's bytes; wikiextractor-3.1: the PyPI package "
                        "(default: mlperf for a dump named enwiki-20200101*, else wikiextractor-3.1)")
    p.add_argument("--extractor-script", "--extractor_script", dest="extractor_script", type=path_arg, default=None,
                   metavar="PATH", help="mlperf: an offline copy of the pinned WikiExtractor.py (sha256-checked; "
                                        "default: fetched from its commit into ~/.cache/bertpipe)")
    p.add_argument("--gather-templates", action="store_true",
                   help="mlperf: collect the dump's template definitions first, as WikiExtractor.py --templates FILE "
                        "(MLPerf's command line does not: its templates expand to nothing)")
    overwrite_flag(p)


def parse_size(text: str) -> int:
    """WikiExtractor's --bytes syntax: 500K, 1M, 2G or a plain number of bytes."""
    t = text.strip().upper()
    power = "KMG".find(t[-1:]) + 1 if t[-1:] in ("K", "M", "G") else 0
    try:
        n = int(t[:-1] if power else t) * 1024 ** power
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size like 1M or 500K, got {text!r}") from None
    if not 1 <= n <= 1 << 40:
        raise argparse.ArgumentTypeError(f"expected a size from 1 byte to 1T, like 1M or 500K, got {text!r}")
    return n


def run(args: argparse.Namespace) -> int:
    from core.paths import PathCheck
    from preprocessing.text.extract import EXTRACTOR_MLPERF, ExtractConfig, default_extractor, run_extract

    pc = PathCheck(overwrite=args.overwrite)
    pc.input_file("--dump", args.dump, "dump")
    pc.output_dir("--out", args.out, ["_manifest.json"], stage="extract")

    extractor = args.extractor or default_extractor(str(args.dump))
    if extractor == EXTRACTOR_MLPERF:
        from preprocessing.text.mlperf_extractor import script_path

        script_path(args.extractor_script)  # before any output: one line saying where to get it
    cfg = ExtractConfig(processes=args.processes, current_time=args.current_time,
                        bytes_per_file=args.bytes, expand_templates=not args.no_templates, extractor=extractor,
                        extractor_script=str(args.extractor_script) if args.extractor_script else None,
                        gather_templates=args.gather_templates)
    m = run_extract(args.dump, args.out, cfg)
    c = m.counters
    print(f"{args.out}: {c['articles']} articles in {c['files']} files "
          f"({c.get('pages_failed', 0)} pages failed; {{{{CURRENTYEAR}}}} & co. from {c['current_time']}; "
          f"extractor {extractor})")
    return 0
