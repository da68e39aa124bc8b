"""Fetch a dump, MLCommons' text or a local file into a stage folder: resumable, retried, md5-verified.

  bertpipe download enwiki-latest --out work/download            # latest enwiki multistream dump + md5sums
  bertpipe download enwiki-20240601 --out work/download          # a dated dump
  bertpipe download mlcommons --out mlc/wiki                     # MLCommons' BERT wikipedia dataset (R2), every file
  bertpipe download mlcommons --text --out mlperf/text           # its part files + eval.txt, unpacked and verified
  bertpipe download mlcommons --dataset input-files --include vocab.txt --out mlc/in
  bertpipe download mlcommons:eval.txt --out work/mlc --mlcommons-base-url https://<mirror>/results
  bertpipe download https://host/path/dump.xml.bz2 --md5 <md5> --out work/download
  bertpipe download ./dump.xml.bz2 --out work/download            # a local file (md5 from a .md5/md5sums beside it)

`mlcommons` follows MLCommons' R2 downloader: the dataset's metadata file (<metadata>/<dataset>.uri: its
base URL), the md5 list beside it, then each file, sent with `cf-access-token: <token>` (--token or
$MLCOMMONS_CF_ACCESS_TOKEN; get one with `cloudflared access token --app=<metadata URL>`; or a service
token in $CF_ACCESS_CLIENT_ID / $CF_ACCESS_CLIENT_SECRET) and verified against the list.
With --mlcommons-base-url / $BERTPIPE_MLCOMMONS_BASE_URL (a flat mirror of results/) the
wikipedia dataset is read from the mirror instead.

An interrupted download leaves <out>/<name>.part; running the same command again resumes it (HTTP Range)
and skips the files already verified.
Only https:// and file:// URLs are accepted; a private CA can be given with --ca-bundle.
"""

from __future__ import annotations

import argparse

from bertpipe.commands._common import nonneg_int, number
from core.paths import path_arg


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", help="enwiki-latest | <wiki>-YYYYMMDD | mlcommons (MLCommons' distribution) | "
                   "mlcommons:<part-XXXXX-of-00500|eval.txt|eval.md5|vocab.txt> (a flat mirror) | https:// or "
                   "file:// URL | local path")
    p.add_argument("--out", type=path_arg, required=True, help="stage folder (gets the file and _manifest.json)")
    p.add_argument("--md5", default=None, help="expected md5 (default: the published one, if any)")
    p.add_argument("--filename", default=None, help="local file name (default: the source's last path part)")
    p.add_argument("--retries", type=nonneg_int(1000), default=5, help="retries after network errors (default: 5)")
    p.add_argument("--timeout", type=number(float, 0, 86400, lo_open=True), default=60.0, help="socket timeout in seconds (default: 60)")
    p.add_argument("--ca-bundle", default=None, help="PEM file of trusted CAs (default: $BERTPIPE_CA_BUNDLE "
                   "or the system's)")
    p.add_argument("--mlcommons-base-url", default=None,
                   help="a flat mirror of MLCommons' results/ folder, read instead of MLCommons' distribution "
                   "(default: $BERTPIPE_MLCOMMONS_BASE_URL)")
    p.add_argument("--require-md5", action="store_true", help="fail when no md5 is given or published")
    g = p.add_argument_group("mlcommons (MLCommons' distribution: Cloudflare R2 behind Cloudflare Access)")
    g.add_argument("--dataset", default="wikipedia", help="wikipedia (the BERT text), input-files (vocab, config, "
                   "checkpoints) or a metadata URL ending in .uri (default: wikipedia)")
    g.add_argument("--include", action="append", default=[], metavar="PATTERN",
                   help="only files whose relative path (or, for a pattern without '/', name) matches; repeatable")
    g.add_argument("--token", default=None, help="Cloudflare Access token (default: $MLCOMMONS_CF_ACCESS_TOKEN, "
                   "which keeps it out of the process list); get one with `cloudflared access token "
                   "--app=<metadata URL>`")
    g.add_argument("--text", action="store_true", help="the MLPerf text for `bertpipe run --text-dir`: part files, "
                   "eval.txt and eval.md5 flat in --out (unpacked from results_text.tar.gz, each verified)")


def _local(source: str) -> bool:
    """A local path (not a URL, ``mlcommons``, ``mlcommons:...`` or a ``<wiki>-latest`` / ``<wiki>-YYYYMMDD`` preset)."""
    import re

    return ("://" not in source and ":" not in source and source != "mlcommons"
            and not re.fullmatch(r"[a-z_]+wiki-(latest|\d{8})", source))


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
    from preprocessing.text.download import DownloadConfig, run_download

    check_source(args.source)
    pc = PathCheck()
    if _local(args.source):
        pc.input_file("source", args.source, "local file")  # not a folder, a FIFO ...
    if args.ca_bundle:
        pc.input_file("--ca-bundle", args.ca_bundle, "PEM file")
    names = [args.filename] if args.filename else []
    if args.filename and ("/" in args.filename or args.filename in (".", "..")):
        from core.errors import InputError

        raise InputError(f"--filename {args.filename!r} must be a plain file name (no '/'); the file goes into --out")
    pc.output_dir("--out", args.out, names, stage="download")

    cfg = DownloadConfig(retries=args.retries, timeout_s=args.timeout, ca_bundle=args.ca_bundle,
                         mlcommons_base_url=args.mlcommons_base_url, require_md5=args.require_md5, token=args.token)
    if args.source == "mlcommons":
        return _run_mlcommons(args, cfg)
    if args.include or args.text or args.token or args.dataset != "wikipedia":
        from core.errors import InputError

        raise InputError("--dataset, --include, --token and --text go with the source `mlcommons`; "
                         f"drop them for {args.source}")
    m = run_download(args.source, args.out, md5=args.md5, filename=args.filename, cfg=cfg)
    f = m.files[0]
    print(f"{args.out / f.name}\t{f.bytes} bytes\tmd5 {f.md5}\t(verified against: {m.counters['md5_origin']})")
    return 0


def _run_mlcommons(args: argparse.Namespace, cfg) -> int:
    from preprocessing.text.download import run_mlcommons, run_mlcommons_dataset

    if args.md5 or args.filename:
        from core.errors import InputError

        raise InputError("--md5 and --filename do not apply to `mlcommons`: its md5 list names and checks every "
                         "file (select files with --include)")
    if args.text:
        if args.dataset != "wikipedia":
            from core.errors import InputError

            raise InputError(f"--text reads the wikipedia dataset; drop --dataset {args.dataset}")
        m = run_mlcommons(args.out, vocab=False, include=args.include, cfg=cfg)
    else:
        m = run_mlcommons_dataset(args.out, dataset=args.dataset, include=args.include, cfg=cfg)
    for f in m.files[:20]:
        print(f"{args.out / f.name}\t{f.bytes} bytes\tmd5 {f.md5}")
    more = f" ({len(m.files) - 20} more in {args.out / '_manifest.json'})" if len(m.files) > 20 else ""
    print(f"{len(m.files)} files, {sum(f.bytes for f in m.files)} bytes in {args.out}, verified against "
          f"{m.counters['md5_origin']}{more}")
    return 0
