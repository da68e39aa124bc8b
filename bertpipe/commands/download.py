"""Fetch a dump, MLCommons' text or a local file into a stage folder: resumable, retried, md5-verified.

  bertpipe download enwiki-latest --out work/download            # latest enwiki multistream dump + md5sums
  bertpipe download enwiki-20240601 --out work/download          # a dated dump
  bertpipe download mlcommons:eval.txt --out work/mlc --mlcommons-base-url https://<bucket>/results
  bertpipe download https://host/path/dump.xml.bz2 --md5 <md5> --out work/download
  bertpipe download ./dump.xml.bz2 --out work/download            # a local file (md5 from a .md5/md5sums beside it)

An interrupted download leaves <out>/<name>.part; running the same command again resumes it (HTTP Range).
Only https:// and file:// URLs are accepted; a private CA can be given with --ca-bundle.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bertpipe.commands._common import nonneg_int, number
from core.paths import path_arg


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="enwiki-latest | <wiki>-YYYYMMDD | mlcommons:<part-XXXXX-of-00500|eval.txt|"
                   "eval.md5> | https:// or file:// URL | local path")
    p.add_argument("--out", type=path_arg, required=True, help="stage folder (gets the file and _manifest.json)")
    p.add_argument("--md5", default=None, help="expected md5 (default: the published one, if any)")
    p.add_argument("--filename", default=None, help="local file name (default: the source's last path part)")
    p.add_argument("--retries", type=nonneg_int(1000), default=5, help="retries after network errors (default: 5)")
    p.add_argument("--timeout", type=number(float, 0, 86400, lo_open=True), default=60.0, help="socket timeout in seconds (default: 60)")
    p.add_argument("--ca-bundle", default=None, help="PEM file of trusted CAs (default: $BERTPIPE_CA_BUNDLE "
                   "or the system's)")
    p.add_argument("--mlcommons-base-url", default=None,
                   help="URL of MLCommons' results/ folder (default: $BERTPIPE_MLCOMMONS_BASE_URL)")
    p.add_argument("--require-md5", action="store_true", help="fail when no md5 is given or published")


def check_source(source: str) -> None:
    """A URL must be one token: no spaces or control characters (percent-encode them: %20)."""
    from core.errors import InputError

    if "://" in source:
        bad = next((c for c in source if c.isspace() or ord(c) < 32 or ord(c) == 127), None)
        if bad is not None:
            raise InputError(f"source URL {source!r} contains {bad!r}: a URL cannot hold spaces or control "
                             "characters; percent-encode them (a space is %20)")
    elif not source.strip():
        raise InputError("source is empty; give a preset (enwiki-latest), a URL or a local path")


def run(args: argparse.Namespace) -> int:
    from core.paths import PathCheck
    from preprocessing.download import DownloadConfig, run_download

    check_source(args.source)
    pc = PathCheck()
    if "://" not in args.source and ":" not in args.source and Path(args.source).exists():
        pc.input_file("source", args.source, "local file")  # not a folder, a FIFO ...
    if args.ca_bundle:
        pc.input_file("--ca-bundle", args.ca_bundle, "PEM file")
    names = [args.filename] if args.filename else []
    if args.filename and ("/" in args.filename or args.filename in (".", "..")):
        from core.errors import InputError

        raise InputError(f"--filename {args.filename!r} must be a plain file name (no '/'); the file goes into --out")
    pc.output_dir("--out", args.out, names, stage="download")

    cfg = DownloadConfig(retries=args.retries, timeout_s=args.timeout, ca_bundle=args.ca_bundle,
                         mlcommons_base_url=args.mlcommons_base_url, require_md5=args.require_md5)
    m = run_download(args.source, args.out, md5=args.md5, filename=args.filename, cfg=cfg)
    f = m.files[0]
    print(f"{args.out / f.name}\t{f.bytes} bytes\tmd5 {f.md5}\t(verified against: {m.counters['md5_origin']})")
    return 0
