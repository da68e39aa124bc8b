"""Text stages 3-6 against the reference's own outputs (golden/text_chain in every tier; mlperf_sample in ../shared).

Every comparison is byte for byte: the stage outputs are the product.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bertpipe.cli import main
from core.manifest import verify_manifest
from preprocessing.text.clean import CleanConfig, run_clean
from preprocessing.text.gather import GatherConfig, run_gather
from preprocessing.text.segment import SegmentConfig, run_segment
from preprocessing.text.split_eval import SplitEvalConfig, run_split_eval

NAMES = ("wiki_00", "wiki_01", "wiki_02")
FINAL = ("part-00000-of-00500", "eval.txt", "eval.md5")


@pytest.fixture(scope="module")
def chain(golden: Path) -> Path:
    d = golden / "text_chain"
    if not (d / "text" / "AA" / "wiki_00").is_file():
        pytest.skip(f"{d} lacks the golden text chain")
    return d


def _same(out: Path, ref: Path) -> None:
    got, want = out.read_bytes(), ref.read_bytes()
    assert len(got) == len(want) and got == want, f"{out} differs from {ref}"


def test_clean_matches_cleanup_file_and_clean_sh(chain: Path, tmp_path: Path) -> None:
    src = chain / "text"
    m = run_clean(src, tmp_path, CleanConfig(keep_cleanup_output=True, workers=2))
    for n in NAMES:
        _same(tmp_path / "AA" / f"{n}.1", src / "AA" / f"{n}.1")
        _same(tmp_path / "AA" / f"{n}.2", src / "AA" / f"{n}.2")
    assert sorted(f.name for f in m.files) == sorted(f"AA/{n}{s}" for n in NAMES for s in (".1", ".2"))
    verify_manifest(tmp_path)


def test_segment_matches_nltk_345(chain: Path, tmp_path: Path) -> None:
    src = chain / "text"
    run_segment(src, tmp_path, SegmentConfig(workers=1))
    for n in NAMES:
        _same(tmp_path / "AA" / f"{n}.3", src / "AA" / f"{n}.3")


def test_split_eval_matches_seperate_test_set(chain: Path, tmp_path: Path) -> None:
    src = chain / "text"
    m = run_split_eval(src, tmp_path, SplitEvalConfig(num_test_articles=20, workers=2))
    for n in NAMES:
        _same(tmp_path / "AA" / f"{n}.4", src / "AA" / f"{n}.4")
    _same(tmp_path / "eval.txt", chain / "eval.txt")
    _same(tmp_path / "eval.md5", chain / "eval.md5")
    assert m.counters["eval_articles"] == 20


def test_gather_matches_do_gather(chain: Path, tmp_path: Path) -> None:
    m = run_gather(chain / "text", tmp_path, GatherConfig(block_size_mb=26.92))
    _same(tmp_path / "part-00000-of-00500", chain / "part-00000-of-00500")
    assert [f.name for f in m.files] == ["part-00000-of-00500"]


def test_gather_rolls_over_by_raw_file_size(chain: Path, tmp_path: Path) -> None:
    """A block just under two raw files: wiki_00 + wiki_01 exceed it, so each goes to its own part;
    the parts concatenate to the single-part output (sizes come from the raw files, not the .4)."""
    src = chain / "text"
    raw = [(src / "AA" / n).stat().st_size for n in NAMES]
    block = (raw[0] + raw[1] - 1) / 2**20
    run_gather(src, tmp_path, GatherConfig(block_size_mb=block))
    parts = sorted(p.name for p in tmp_path.glob("part-*"))
    assert parts == ["part-00000-of-00500", "part-00001-of-00500"]  # wiki_01 + wiki_02 fit one block
    joined = b"".join((tmp_path / p).read_bytes() for p in parts)
    assert joined == (chain / "part-00000-of-00500").read_bytes()


@pytest.mark.parametrize("flags", [["--num-test-articles", "20"], ["--num_test_articles=20", "--workers", "2"]])
def test_bertpipe_text_on_golden_extractor_output(chain: Path, tmp_path: Path, flags: list[str]) -> None:
    out = tmp_path / "results"
    assert main(["text", "--extracted", str(chain / "text"), "--out", str(out), *flags]) == 0
    for n in FINAL:
        _same(out / n, chain / n)
    m = verify_manifest(out)
    assert m.counters["articles"] == 86 and m.counters["eval_articles"] == 20
    assert sorted(p.name for p in out.iterdir()) == sorted((*FINAL, "_manifest.json"))


def test_bertpipe_text_keeps_the_reference_intermediates(chain: Path, data_tier: str, request: pytest.FixtureRequest,
                                                         tmp_path: Path) -> None:
    """`bertpipe text --keep-intermediate` with the reference's flag spellings on real extractor files: the final
    files are the reference's, the kept .4 pieces gathered give the part file, and where the reference's own
    intermediates are known (the golden text chain) each .1-.4 is theirs. On MLCommons' sample (4 files of the
    enwiki-20200101 dump MLPerf uses) where ../shared has it, and on the golden text chain in every tier."""
    samples = {"golden text chain": (chain / "text", chain, NAMES, True)}
    if data_tier == "shared":
        sample = request.getfixturevalue("mlperf_sample")
        samples["MLPerf sample"] = (sample / "extracted", sample, tuple(f"wiki_0{k}" for k in range(4)), False)
    for k, (what, (extracted, ref, names, theirs_kept)) in enumerate(samples.items()):
        out = tmp_path / f"results{k}"
        rc = main(["text", "--extracted", str(extracted), "--out", str(out), "--num_test_articles=20",
                   "--block_size_mb=26.92", "--keep-intermediate"])
        assert rc == 0, what
        for n in FINAL:
            _same(out / n, ref / n)
        # the intermediates are the reference's files too: .4 pieces gathered give the part file
        fours = sorted((out / "text" / "AA").glob("wiki_0?.4"))
        assert [p.name for p in fours] == [f"{n}.4" for n in names], what
        pieces = [p.read_bytes() for p in fours]
        pieces = [b[:-1] if b.endswith(b"\n\n") else b for b in pieces]
        assert b"".join(pieces) == (ref / "part-00000-of-00500").read_bytes(), what
        kept = sorted(p.name for p in (out / "text" / "AA").iterdir())
        assert kept == sorted(f"{n}.{i}" for n in names for i in range(1, 5)), what
        for name in kept if theirs_kept else ():  # the golden chain holds the reference's own .1-.4
            _same(out / "text" / "AA" / name, extracted / "AA" / name)
        verify_manifest(out)


def test_stage_subcommands_chain(chain: Path, tmp_path: Path) -> None:
    """clean -> segment -> split-eval -> gather as separate commands (reference flag spellings)."""
    raw = str(chain / "text")
    c, s, e, r = (str(tmp_path / n) for n in ("clean", "segment", "split", "results"))
    assert main(["clean", "--extracted", raw, "--out", c, "--keep-cleanup-output"]) == 0
    assert main(["segment", "--input", c, "--out", s, "--workers", "2"]) == 0
    assert main(["split-eval", "--input", s, "--out", e, "--num_test_articles=20", "--seed=12345"]) == 0
    assert main(["gather", "--input", e, "--extracted", raw, "--out", r, "--block_size=26.92"]) == 0
    for n in NAMES:
        _same(tmp_path / "clean" / "AA" / f"{n}.1", chain / "text" / "AA" / f"{n}.1")
        _same(tmp_path / "segment" / "AA" / f"{n}.3", chain / "text" / "AA" / f"{n}.3")
    _same(tmp_path / "split" / "eval.md5", chain / "eval.md5")
    _same(tmp_path / "results" / "part-00000-of-00500", chain / "part-00000-of-00500")


@pytest.mark.slow
@pytest.mark.needs_shared("data/mlperf_sample")
def test_many_files_roll_over_and_do_not_depend_on_workers(mlperf_sample: Path, tmp_path: Path) -> None:
    """30 real extractor files (8 folders, ~31 MB): two 26.92 MB parts, identical for 1 and 3 workers,
    and the parts together are the one-part output of a huge block size."""
    src = sorted((mlperf_sample / "extracted" / "AA").glob("wiki_0?"))
    root = tmp_path / "extracted"
    for k in range(30):
        d = root / f"A{chr(65 + k // 4)}"
        d.mkdir(parents=True, exist_ok=True)
        (d / f"wiki_{k % 4:02d}").symlink_to(src[k % 4])
    outs = {}
    for workers, block in ((1, 26.92), (3, 26.92), (2, 1000.0)):
        out = tmp_path / f"out{workers}"
        m = run_text_stages_cli(root, out, workers, block)
        outs[workers] = {f.name: f.md5 for f in m.files}
    assert outs[1] == outs[3]
    assert sorted(n for n in outs[1] if n.startswith("part-")) == ["part-00000-of-00500", "part-00001-of-00500"]
    joined = b"".join((tmp_path / "out1" / n).read_bytes() for n in ("part-00000-of-00500", "part-00001-of-00500"))
    assert joined == (tmp_path / "out2" / "part-00000-of-00500").read_bytes()
    assert outs[1]["eval.md5"] == outs[2]["eval.md5"]


def run_text_stages_cli(root: Path, out: Path, workers: int, block: float):  # noqa: ANN201
    assert main(["text", "--extracted", str(root), "--out", str(out), "--num-test-articles", "60",
                 "--workers", str(workers), "--block-size-mb", str(block)]) == 0
    return verify_manifest(out)
