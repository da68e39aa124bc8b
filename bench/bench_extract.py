"""Throughput of the extract stage (wikiextractor 3.1.0) and its scaling from 1 to 2 worker processes.

  .venv/bin/python bench/bench_extract.py [--repeat 3] [--dump PATH] [--processes 1 2]
  .venv/bin/python bench/bench_extract.py --extractor mlperf [--copies 6] [--processes 1 2]

``--extractor mlperf`` (MLPerf's pinned WikiExtractor.py, see :func:`main_mlperf`): pages per second per worker
against the script run alone in the same run, and the projection for the enwiki-20200101 dump.

Input: the real, shortened enwiki dump (../shared/data/enwiki-latest-pages-articles1.xml-...-shortened.bz2,
1.7 MB bz2, 106 articles) or --dump. MB/s is of the uncompressed XML (MB = 10^6 bytes), best of --repeat runs
of ``run_extract`` (both passes: template scan + extraction). Baseline in the same run: plain bz2 decompression
of the same file (a floor for one reader: the stage reads the dump twice). Scaling = MB/s(N workers) /
MB/s(1 worker). The dump is run as shipped (one bz2 stream: one reader feeds the workers) and re-packed the way
Wikimedia's -multistream dumps are (here 10 pages per stream instead of 100, for a dump of 206 pages), where the
workers decompress their own streams. All outputs are checked to be byte-identical. Peak RSS: this process and
its largest child.
"""

from __future__ import annotations

import argparse
import bz2
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from preprocessing.text.extract import ExtractConfig, run_extract  # noqa: E402
from preprocessing.text.extract_streams import to_multistream  # noqa: E402

REAL = "data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"


def best(fn: Callable[[], object], repeat: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return min(times), result


def decompress(dump: Path) -> int:
    n = 0
    with bz2.open(dump, "rb") as f:
        while block := f.read(1 << 20):
            n += len(block)
    return n


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    p.add_argument("--dump", type=Path, default=None)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    p.add_argument("--extractor", choices=("wikiextractor-3.1", "mlperf"), default="wikiextractor-3.1")
    p.add_argument("--copies", type=int, default=6, help="mlperf: copies of the dump's pages in the bench dump")
    p.add_argument("--script", type=Path, default=None, help="mlperf: WikiExtractor.py (default: ../shared copy)")
    args = p.parse_args()
    if args.extractor == "mlperf":
        return main_mlperf(args)
    dump = args.dump or args.shared / REAL
    if not dump.is_file():
        print(f"{dump} not found (pass --dump or --shared)", file=sys.stderr)
        return 2
    secs, xml_bytes = best(lambda: decompress(dump), args.repeat)
    mb = xml_bytes / 1e6
    print(f"dump: {dump.name}: {dump.stat().st_size / 1e6:.2f} MB bz2, {mb:.2f} MB XML")
    print(f"{'what':<28}{'seconds':>9}{'MB/s (XML)':>12}{'ratio':>8}")
    print(f"{'baseline: bz2 decompress':<28}{secs:>9.3f}{mb / secs:>12.2f}{'':>8}")
    digests = set()
    with tempfile.TemporaryDirectory() as tmp:
        multi = Path(tmp) / "multistream.xml.bz2"
        multi.write_bytes(to_multistream(bz2.decompress(dump.read_bytes()), 10))
        runs = [(label, path, n) for label, path in (("single stream", dump), ("multistream", multi))
                for n in args.processes]
        times: dict[tuple, float] = {}
        manifests: dict[tuple, object] = {}
        for _ in range(args.repeat):  # interleaved, best of --repeat: a noisy shared machine hits all alike
            for label, path, n in runs:
                cfg = ExtractConfig(processes=n, current_time="2026-01-01T00:00:00")
                secs, m = best(lambda cfg=cfg, path=path, n=n, label=label:
                               run_extract(path, Path(tmp) / f"{label}-{n}", cfg), 1)
                times[label, n] = min(secs, times.get((label, n), secs))
                manifests[label, n] = m
                digests.add(tuple((f.name, f.md5) for f in m.files))
        for label, _, n in runs:
            secs, m, one = times[label, n], manifests[label, n], times[label, args.processes[0]]
            print(f"{f'{label}, {n} worker(s)':<28}{secs:>9.3f}{mb / secs:>12.2f}{one / secs:>7.2f}x"
                  f"   ({m.counters['articles']} articles, {m.counters['files']} files, "
                  f"{m.counters['bz2_chunks']} stream chunks)")
    self_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child_rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"peak RSS: {self_rss:.0f} MiB (main), {child_rss:.0f} MiB (largest worker)")
    print(f"outputs identical across worker counts: {len(digests) == 1}")
    return 0 if len(digests) == 1 else 1


# -- MLPerf's extractor -----------------------------------------------------------------------------------------
# enwiki-20200101-pages-articles-multistream.xml.bz2 (MLPerf's dump): ~20.0 M <page>s, of which ~6.0 M articles
# (main namespace, not redirects: what the script extracts), ~17.7 GB bz2.
DUMP_2020_ARTICLES = 6.0e6
DUMP_2020_PAGES = 20.0e6
_CLOCK = "2026-11-27T12:00:00"
_RUNNER = (
    "import sys, time, runpy, datetime\n"
    "iso = sys.argv[1]; t = datetime.datetime.strptime(iso, '%Y-%m-%dT%H:%M:%S').timetuple(); _s = time.strftime\n"
    "time.strftime = lambda f, tt=None: _s(f, t if tt is None else tt)\n"
    "script = sys.argv[2]; sys.argv = [script] + sys.argv[3:]\n"
    "if sys.version_info >= (3, 11):\n"
    "    sys.path.insert(0, sys.argv.pop()); from preprocessing.text.mlperf_extractor import load_script\n"
    "    load_script(__import__('pathlib').Path(script), iso).main()\n"
    "else:\n"
    "    runpy.run_path(script, run_name='__main__')\n")


def _python37() -> str | None:
    import glob
    import os
    import subprocess

    for c in [*sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.7*/bin/python3.7"))), "python3.7"]:
        try:
            r = subprocess.run([c, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True,
                               timeout=30, cwd=ROOT)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0 and r.stdout.strip() == "(3, 7)":
            return c
    return None


def repeated_dump(xml: bytes, copies: int) -> tuple[bytes, int]:
    """The dump's pages ``copies`` times (ids renumbered, so no page repeats the one before it), one siteinfo."""
    import re

    head_end = xml.index(b"<page>")
    head_end = xml.rfind(b"\n", 0, head_end) + 1
    tail = xml.rindex(b"</mediawiki>")
    body = xml[head_end:tail]
    out = [xml[:head_end]]
    for k in range(copies):
        out.append(re.sub(rb"(<page>\s*<title>[^<]*</title>\s*<ns>[^<]*</ns>\s*<id>)(\d+)",
                          lambda m, k=k: m.group(1) + str(int(m.group(2)) + k * 10_000_000).encode(), body))
    out.append(xml[tail:])
    return b"".join(out), body.count(b"<page>") * copies


def main_mlperf(args: argparse.Namespace) -> int:
    """Pages per second: the pinned script run alone (``python WikiExtractor.py DUMP -o OUT --processes 1``, on
    Python 3.7 if the machine has one, and on this Python through the compatibility layer), then bertpipe's
    ``--extractor mlperf`` with 1, 2 ... workers on the same dump as Wikimedia packs it (multistream, 100 pages a
    stream) and as one bz2 stream. The bench dump is the real shortened enwiki dump's pages ``--copies`` times. All
    outputs are checked byte-identical. The script alone uses its mapper, one extract process and its reducer
    (about one core busy); "per worker" divides by the worker count. Projection for enwiki-20200101 from the best
    per-worker rate: core-hours, and wall time on 16 and 64 cores (workers = cores, at the 2-worker efficiency)."""
    import subprocess

    script = args.script or args.shared / "reference" / "wikiextractor-3162bb6c" / "WikiExtractor.py"
    src = args.dump or args.shared / REAL
    xml, pages = repeated_dump(bz2.decompress(src.read_bytes()), args.copies)
    py37 = _python37()
    results: dict[str, tuple[float, dict]] = {}
    cpu: dict[str, float] = {}  # CPU seconds of a run, all its processes (the script alone; bertpipe in-process)
    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        plain, multi = t / "bench.xml.bz2", t / "bench-multistream.xml.bz2"
        plain.write_bytes(bz2.compress(xml, 9))
        multi.write_bytes(to_multistream(xml, 100))
        print(f"bench dump: {src.name} x {args.copies}: {pages} pages, {len(xml) / 1e6:.1f} MB XML, "
              f"{multi.stat().st_size / 1e6:.1f} MB multistream bz2")

        def files(out: Path) -> dict[str, bytes]:
            return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.glob("*/wiki_*"))}

        def alone(py: str, label: str) -> None:
            def go() -> dict:
                out = t / f"alone-{label}-{time.perf_counter_ns()}"
                cmd = [py, "-c", _RUNNER, _CLOCK, str(script), str(plain), "-o", str(out), "-q", "--processes", "1"]
                if py == sys.executable:
                    cmd.append(str(ROOT))
                r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
                subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True)
                r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
                used = r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime
                cpu[label] = min(used, cpu.get(label, used))
                return files(out)
            results[label] = best(go, args.repeat)

        if py37:
            alone(py37, "script alone, Python 3.7")
        alone(sys.executable, f"script alone, Python {sys.version_info[0]}.{sys.version_info[1]} + compat")
        for path, kind in ((multi, "multistream"), (plain, "one stream")):
            for n in args.processes if path == multi else [n for n in args.processes if n <= 2]:
                cfg = ExtractConfig(extractor="mlperf", extractor_script=str(script), processes=n, current_time=_CLOCK)

                def go(cfg=cfg, path=path, n=n, label=f"bertpipe, {kind}, {n} worker(s)") -> dict:
                    out = t / f"ours-{n}-{time.perf_counter_ns()}"
                    c0 = time.process_time()
                    run_extract(path, out, cfg)
                    if n == 1:  # in this process: its CPU time is the run's
                        used = time.process_time() - c0
                        cpu[label] = min(used, cpu.get(label, used))
                    return files(out)
                results[f"bertpipe, {kind}, {n} worker(s)"] = best(go, args.repeat)
    outputs = {tuple(sorted((k, hash(v)) for k, v in r[1].items())) for r in results.values()}
    articles = sum(v.count(b"<doc ") for v in next(iter(results.values()))[1].values())
    base_label = next(iter(results))
    base = results[base_label][0]
    print(f"{articles} articles extracted; outputs byte-identical: {len(outputs) == 1}")
    print(f"{'what':<44}{'seconds':>9}{'pages/s':>9}{'articles/s':>11}{'per worker':>11}{'vs alone':>9}")
    per_worker = {}
    for label, (secs, _) in results.items():
        n = int(label.split(", ")[-1].split()[0]) if "worker" in label else 1
        per_worker[label] = articles / secs / n
        print(f"{label:<44}{secs:>9.2f}{pages / secs:>9.1f}{articles / secs:>11.1f}{articles / secs / n:>11.1f}"
              f"{base / secs:>8.2f}x")
    ours = {k: v for k, v in results.items() if k.startswith("bertpipe, multistream")}
    if len(ours) >= 2:
        one = results["bertpipe, multistream, 1 worker(s)"][0] if "bertpipe, multistream, 1 worker(s)" in results \
            else None
        two = results.get("bertpipe, multistream, 2 worker(s)")
        if one and two:
            print(f"2 workers vs 1 (multistream): {one / two[0]:.2f}x; vs the script alone: {base / two[0]:.2f}x")
    for label, used in cpu.items():
        print(f"CPU: {label}: {used:.2f} CPU-s, {articles / used:.1f} articles per CPU-second")
    wall_rate = max(v for k, v in per_worker.items() if k.startswith("bertpipe, multistream"))
    cpu_label = "bertpipe, multistream, 1 worker(s)"
    rate = articles / cpu[cpu_label] if cpu_label in cpu else wall_rate  # CPU time: what a busy machine skews least
    eff = 1.0
    if "bertpipe, multistream, 2 worker(s)" in results and cpu_label in results:
        eff = results[cpu_label][0] / results["bertpipe, multistream, 2 worker(s)"][0] / 2
    core_h = DUMP_2020_ARTICLES / rate / 3600
    alone_label = next((k for k in cpu if k.startswith("script alone")), None)
    print(f"projection, enwiki-20200101 (~{DUMP_2020_PAGES / 1e6:.0f} M pages, ~{DUMP_2020_ARTICLES / 1e6:.1f} M "
          f"articles; these articles are long, early enwiki ids), at {rate:.1f} articles per CPU-second "
          f"({wall_rate:.1f}/s per worker by wall time here):")
    print(f"  {core_h:.1f} core-hours; wall {core_h / 16:.2f} h on 16 cores, {core_h / 64:.2f} h on 64 (at the "
          f"2-worker efficiency measured here, {eff:.2f}: {core_h / 16 / max(eff, 0.05):.2f} h and "
          f"{core_h / 64 / max(eff, 0.05):.2f} h)")
    if alone_label:
        print(f"  the script alone ({alone_label}): {DUMP_2020_ARTICLES / (articles / cpu[alone_label]) / 3600:.1f} "
              f"CPU-hours, {DUMP_2020_ARTICLES / (articles / results[alone_label][0]) / 3600:.1f} h of wall time")
    return 0 if len(outputs) == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
