"""Run bertpipe end to end on its built-in sample (the README's main command).

  bertpipe demo --work-dir work/demo
  bash scripts/demo.sh                   # sets up ./.venv first, then runs the line above

Stages so far: download (from the packaged sample-wiki.xml.bz2, md5-checked) -> extract (wikiextractor
3.1.0, clock pinned) -> text stages (clean, segment, split_eval, gather). Each stage writes into
<work-dir>/<stage>/ with its _manifest.json; a second run redoes them over the same inputs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

DEMO_TIME = "2026-01-01T00:00:00"  # what {{CURRENTYEAR}} & co. expand to in the demo (reproducible output)
DEMO_TEST_ARTICLES = 5  # eval articles withheld from the sample's ~50


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--work-dir", "--work_dir", dest="work_dir", type=Path, default=Path("work/demo"),
                   help="folder for every stage's output (default: work/demo)")
    p.add_argument("--processes", type=int, default=1, help="worker processes per stage (default: 1)")


def run_demo(work_dir: Path, processes: int = 1) -> dict[str, object]:
    """The demo DAG, stage after stage; returns each stage's manifest by name."""
    from preprocessing.download import run_download
    from preprocessing.extract import ExtractConfig, run_extract
    from preprocessing.sample import SAMPLE_MD5, sample_dump_path
    from preprocessing.text_pipeline import TextConfig, run_text_stages

    dump = sample_dump_path()
    dl = run_download(str(dump), work_dir / "download", md5=SAMPLE_MD5)
    ex = run_extract(work_dir / "download" / dl.files[0].name, work_dir / "extract",
                     ExtractConfig(processes=processes, current_time=DEMO_TIME), upstream=[dl])
    text = run_text_stages(work_dir / "extract", work_dir / "text",
                           TextConfig(num_test_articles=DEMO_TEST_ARTICLES, workers=processes), upstream=[ex])
    return {"download": dl, "extract": ex, "text": text}


def run(args: argparse.Namespace) -> int:
    stages = run_demo(args.work_dir, args.processes)
    print(f"bertpipe demo: done; outputs under {args.work_dir}/")
    for name, m in stages.items():
        size = sum(f.bytes for f in m.files)
        counters = ", ".join(f"{k}={v}" for k, v in sorted(m.counters.items()) if isinstance(v, int | float))
        print(f"  {name:<9} {args.work_dir / name}/  {len(m.files)} files, {size:,} bytes  {counters}")
    text_dir = args.work_dir / "text"
    print(f"  training text: {text_dir}/part-00000-of-00500  eval text: {text_dir}/eval.txt")
    return 0
