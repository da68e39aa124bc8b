"""`bertpipe text --dump`: download/extract wired to the text stages, on the real shortened enwiki dump."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bertpipe.cli import main
from core.manifest import verify_manifest

FINAL = ("part-00000-of-00500", "eval.txt", "eval.md5")


@pytest.fixture(scope="module")
def dump_run(real_dump, tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("wikiextractor")
    out = tmp_path_factory.mktemp("dump") / "results"
    rc = main(["text", "--dump", str(real_dump.path), "--out", str(out), "--num_test_articles=20",
               "--current-time", "2026-01-01T00:00:00", "--workers", "2"])
    assert rc == 0
    return out


def test_dump_to_part_files(dump_run: Path, real_dump) -> None:
    m = verify_manifest(dump_run)
    assert sorted(f.name for f in m.files) == sorted(FINAL)
    assert m.counters["eval_articles"] == 20 and m.counters["articles"] >= real_dump.with_text - 20
    extract = verify_manifest(dump_run / "_work" / "extract")
    assert m.upstream == {f"extract:{extract.key}": extract.digest}  # the input was checked against it
    assert len((dump_run / "eval.md5").read_text().splitlines()) == 20
    text = (dump_run / "part-00000-of-00500").read_text(encoding="utf-8")
    lines = text.split("\n")
    # one sentence per line (stripped, no markup left), articles separated by blank lines
    assert all(line == line.strip() for line in lines)
    assert not any("<doc" in line or "</doc>" in line for line in lines)
    assert sum(1 for line in lines if line) > real_dump.min_lines
    assert real_dump.first_line in lines[0]
    assert "\n\n\n\n\n" not in text  # at most an empty article or a file boundary in between


def test_dump_equals_text_stages_on_its_extraction(dump_run: Path, tmp_path: Path) -> None:
    """--dump runs exactly the --extracted stages on the extractor output it produced."""
    again = tmp_path / "again"
    assert main(["text", "--extracted", str(dump_run / "_work" / "extract"), "--out", str(again),
                 "--num-test-articles", "20", "--workers", "1"]) == 0
    for name in FINAL:
        assert (again / name).read_bytes() == (dump_run / name).read_bytes(), name
    params = json.loads((dump_run / "_manifest.json").read_text())["params"]
    assert params["num_test_articles"] == 20 and params["block_size_mb"] == 26.92


def test_dump_rerun_reuses_the_extraction(dump_run: Path, real_dump,
                                          caplog: pytest.LogCaptureFixture) -> None:
    before = {n: (dump_run / n).read_bytes() for n in FINAL}
    extract_manifest = (dump_run / "_work" / "extract" / "_manifest.json").read_bytes()
    with caplog.at_level("INFO"):
        rc = main(["text", "--dump", str(real_dump.path), "--out", str(dump_run), "--num_test_articles=20",
                   "--current-time", "2026-01-01T00:00:00", "--workers", "1"])
    assert rc == 0
    assert any("reusing the extraction" in r.getMessage() for r in caplog.records)
    assert (dump_run / "_work" / "extract" / "_manifest.json").read_bytes() == extract_manifest
    assert {n: (dump_run / n).read_bytes() for n in FINAL} == before


def test_dump_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "no-such-dump.xml.bz2"
    assert main(["text", "--dump", str(missing), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert str(missing) in err or "no-such-dump" in err
    assert not (tmp_path / "o" / "_manifest.json").exists()


def test_dump_url_md5_mismatch(real_dump, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A URL goes through the download stage: a wrong md5 stops before extraction, nothing is kept."""
    out = tmp_path / "o"
    url = real_dump.path.resolve().as_uri()
    assert main(["text", "--dump", url, "--md5", "0" * 32, "--out", str(out)]) == 2
    assert "md5 mismatch" in capsys.readouterr().err
    assert not (out / "_work" / "extract").exists() and not (out / "_manifest.json").exists()
