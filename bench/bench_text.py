"""Throughput of the text stages (clean, segment, split_eval, gather) and segment vs nltk.

  .venv/bin/python bench/bench_text.py [--repeat 3] [--shared ../shared]

Inputs: the reference extractor output of the real (shortened) enwiki dump
(../shared/data/golden/text_chain/text) and MLCommons' four enwiki-20200101 sample files
(../shared/data/mlperf_sample/extracted). MB/s is of each stage's input text (MB = 10^6 bytes),
single process, best of --repeat runs; "end to end" is run_text_stages with 1 and 2 workers.
The baseline is nltk's own PunktSentenceTokenizer (the installed nltk, 3.10.x) built from the same
English parameters (nltk cannot download its pickle here), timed in the same run on the same lines.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from core.manifest import StageOutput  # noqa: E402
from preprocessing.text import segment  # noqa: E402
from preprocessing.text.clean import clean_text  # noqa: E402
from preprocessing.text.gather import GatherConfig, gather_into  # noqa: E402
from preprocessing.text.pipeline import TextConfig, run_text_stages  # noqa: E402
from preprocessing.text.punkt_345 import Punkt345, english_model, nltk_tokenizer  # noqa: E402
from preprocessing.text.segment import segment_text  # noqa: E402
from preprocessing.text.split_eval import split_text  # noqa: E402
from preprocessing.text.textio import iter_lines, list_wiki_files, universal_newlines  # noqa: E402


def best(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def bench_dataset(name: str, root: Path, repeat: int) -> list[tuple[str, str, float, float, str]]:
    files = list_wiki_files(root)
    raws = [f.read_bytes().decode("utf-8") for f in files]
    sizes = [f.stat().st_size for f in files]
    ones_twos = [clean_text(r) for r in raws]
    twos = [t for _, t in ones_twos]
    threes = [segment_text(t) for t in twos]
    splits = [split_text(t, k, len(files), 20) for k, t in enumerate(threes)]
    mb = lambda texts: sum(len(t.encode()) for t in texts) / 1e6  # noqa: E731
    rows = []

    def add(stage: str, size_mb: float, secs: float, note: str = "") -> None:
        rows.append((name, stage, size_mb, size_mb / secs, note))

    add("clean", mb(raws), best(lambda: [clean_text(r) for r in raws], repeat), "cleanup_file + clean.sh")
    model = english_model()
    add("segment", mb(twos), best(lambda: [segment_text(t, Punkt345(model)) for t in twos], repeat),
        "cold decision cache")
    warm = Punkt345(model)
    [segment_text(t, warm) for t in twos]
    add("segment", mb(twos), best(lambda: [segment_text(t, warm) for t in twos], repeat), "warm cache (long runs)")
    add("split_eval", mb(threes), best(lambda: [split_text(t, k, len(files), 20) for k, t in enumerate(threes)],
                                       repeat))

    def gather() -> None:
        with tempfile.TemporaryDirectory() as d, StageOutput(d, "gather") as out:
            gather_into(out, ((s, tr, "") for s, (tr, _) in zip(sizes, splits, strict=True)), GatherConfig())
    add("gather", mb([tr for tr, _ in splits]), best(gather, repeat), "incl. md5 + fsync")
    for workers in (1, 2):
        def e2e(w: int = workers) -> None:
            segment._TOKENIZER = None  # start cold, as a fresh worker does
            with tempfile.TemporaryDirectory() as d:
                run_text_stages(root, Path(d), TextConfig(num_test_articles=20, workers=w))
        add("end to end", sum(sizes) / 1e6, best(e2e, repeat), f"run_text_stages, {workers} worker(s)")

    # segment vs nltk on the same lines
    lines = [ln for t in twos for ln in iter_lines(universal_newlines(t))]
    ref = nltk_tokenizer(model)
    t_nltk = best(lambda: [ref.tokenize(ln) for ln in lines], repeat)
    t_cold = best(lambda: [tok.tokenize(ln) for tok in [Punkt345(model)] for ln in lines], repeat)
    t_warm = best(lambda: [warm.tokenize(ln) for ln in lines], repeat)
    size = mb(lines)
    diff = sum(1 for ln in lines if ref.tokenize(ln) != warm.tokenize(ln))
    t_ref_stage = best(lambda: [segment_text(t, ref) for t in twos], repeat)  # same loop, nltk inside
    t_stage = best(lambda: [segment_text(t, Punkt345(model)) for t in twos], repeat)
    rows.append((name, "segment stage, nltk", size, size / t_ref_stage,
                 "do_sentence_segmentation loop with nltk 3.10 (baseline)"))
    rows.append((name, "segment stage, ours", size, size / t_stage,
                 f"cold cache: {t_ref_stage / t_stage:.1f}x the nltk loop"))
    rows.append((name, "nltk sent_tokenize", size, size / t_nltk, "baseline (nltk 3.10, same params)"))
    rows.append((name, "punkt_345 tokenize", size, size / t_cold, f"cold: {t_nltk / t_cold:.1f}x nltk"))
    rows.append((name, "punkt_345 tokenize", size, size / t_warm, f"warm: {t_nltk / t_warm:.1f}x nltk; "
                 f"{diff} of {len(lines)} lines split differently (3.4.5 vs 3.10)"))
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    args = ap.parse_args()
    data = args.shared / "data"
    sets = [("golden (gensim enwiki)", data / "golden" / "text_chain" / "text"),
            ("mlperf_sample (enwiki-20200101)", data / "mlperf_sample" / "extracted")]
    rows = []
    for name, root in sets:
        if not root.is_dir():
            print(f"skip {name}: {root} not found", file=sys.stderr)
            continue
        rows += bench_dataset(name, root, args.repeat)
    print(f"{'data':32} {'stage':20} {'MB':>6} {'MB/s':>7}  note")
    for name, stage, size, rate, note in rows:
        print(f"{name:32} {stage:20} {size:6.2f} {rate:7.2f}  {note}")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
    print(f"peak RSS: {peak:.0f} MiB (this process), {child:.0f} MiB (largest worker)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
