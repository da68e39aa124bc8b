"""extract stage: wikiextractor 3.1.0 driven as a library, reference layout, pinned clock, bad dumps."""

from __future__ import annotations

import bz2
import hashlib
import io
import re
import subprocess
import sys
from pathlib import Path

import pytest

from core.errors import ChecksumError, InputError
from core.manifest import MANIFEST_NAME, Manifest, StageOutput, verify_manifest
from preprocessing.sample import SAMPLE_MD5, sample_dump_path
from preprocessing.text.extract import ExtractConfig, clock_values, output_name, run_extract

T0 = "2026-11-22T04:45:00"
DOC = re.compile(r'^<doc id="(\d+)" url="(.*)\?curid=(\d+)" title="(.*)">$')


def docs(out: Path) -> list[tuple[str, str, str]]:
    """(id, title, body) of every article, in file order; asserts the reference layout on the way."""
    found = []
    for f in sorted(out.glob("*/wiki_??")):
        lines = f.read_text(encoding="utf-8").split("\n")
        assert lines[-1] == "", f"{f} must end with a newline"
        i = 0
        while i < len(lines) - 1:
            m = DOC.match(lines[i])
            assert m and m[1] == m[3], f"{f}:{i + 1}: not a <doc> line: {lines[i]!r}"
            end = lines.index("</doc>", i)
            assert lines[i + 1] == m[4] and lines[i + 2] == "", f"{f}:{i + 2}: title line, then a blank line"
            found.append((m[1], m[4], "\n".join(lines[i + 3:end])))
            i = end + 1
    return found


@pytest.fixture(scope="module")
def real(real_dump, tmp_path_factory) -> tuple[Path, Manifest]:
    out = tmp_path_factory.mktemp("real") / "text"
    return out, run_extract(real_dump.path, out, ExtractConfig(current_time=T0))


def test_real_dump_gives_the_106_articles_of_the_reference_in_order(real, real_dump, golden):
    """(In a clone: the dump's first 127 pages give the reference's first 48 articles.)"""
    out, m = real
    got = docs(out)
    assert m.counters["articles"] == len(got) == real_dump.articles and m.counters.get("pages_failed", 0) == 0
    ref_ids = re.findall(r'^<doc id="(\d+)"', "".join(
        (golden / "text_chain/text/AA" / f"wiki_0{k}").read_text(encoding="utf-8") for k in range(3)), re.M)
    assert len(ref_ids) == 106
    assert [i for i, _, _ in got] == (ref_ids if real_dump.whole else ref_ids[:real_dump.articles])
    assert all(DOC.match(line)[2] == "https://en.wikipedia.org/wiki"
               for line in (out / "AA/wiki_00").read_text().splitlines() if line.startswith("<doc"))
    assert got[0][1] == "Anarchism" and got[0][2].startswith("Anarchism is a political philosophy")
    verify_manifest(out)


def test_files_roll_over_at_1_mib_like_wikiextractor(real, real_dump):
    out, m = real
    files = sorted(out.glob("AA/wiki_??"))
    assert [f.relative_to(out).as_posix() for f in files] == list(real_dump.files)
    assert [f.name for f in m.files] == list(real_dump.files) and len(files) >= 2
    for f, nxt in zip(files, files[1:], strict=False):
        size = f.stat().st_size
        first_next = nxt.read_bytes().split(b"</doc>\n")[0] + b"</doc>\n"
        assert size <= 1 << 20 < size + len(first_next)  # the next article would not have fit


def test_output_identical_whatever_the_worker_count(real, real_dump, tmp_path):
    out, m1 = real
    m2 = run_extract(real_dump.path, tmp_path / "p2", ExtractConfig(current_time=T0, processes=2, batch_pages=5))
    assert [(f.name, f.md5) for f in m2.files] == [(f.name, f.md5) for f in m1.files]
    assert m2.key == m1.key  # worker count and batch size are not part of the stage key


def test_pinned_time_is_what_currentyear_expands_to(tmp_path):
    m = run_extract(sample_dump_path(), tmp_path / "a", ExtractConfig(current_time="1999-12-31T23:59:59"))
    text = (tmp_path / "a/AA/wiki_00").read_text(encoding="utf-8")
    assert "As of 1999, almost every light is automatic" in text
    assert "was written for bertpipe in 1999." in text  # CURRENTYEAR inside a template
    assert m.counters["current_time"] == "1999-12-31T23:59:59"
    m2 = run_extract(sample_dump_path(), tmp_path / "b", ExtractConfig(current_time="2031-01-01"))
    assert "As of 2031," in (tmp_path / "b/AA/wiki_00").read_text(encoding="utf-8") and m2.key != m.key
    assert clock_values("2030-05-06T07:08:09")["currenttime"] == "07:08:09"
    with pytest.raises(InputError, match="ISO"):
        clock_values("next tuesday")


def test_pinned_extractor_equals_stock_wikiextractor_at_that_time(monkeypatch):
    """Our clean_text override must change nothing but the clock: compare with the stock class."""
    import datetime as dt

    import wikiextractor.WikiExtractor as wx
    from wikiextractor import extract as wxe
    from wikiextractor.WikiExtractor import collect_pages

    import preprocessing.text.extract as ex

    when = dt.datetime(2027, 3, 4, 5, 6, 7)

    class FakeTime:
        @staticmethod
        def strftime(fmt):
            return when.strftime(fmt)

    pinned = ex._pinned_clock_extractor(clock_values(when.isoformat()))
    monkeypatch.setattr(wxe, "time", FakeTime)
    monkeypatch.setattr(wx, "templateNamespace", "Template")
    with bz2.open(sample_dump_path(), "rt", encoding="utf-8") as f:
        pages = list(collect_pages(f))
    assert len(pages) == 51
    for page in pages:
        outs = []
        for cls in (wxe.Extractor, pinned):
            buf = io.StringIO()
            cls(page[0], page[1], "https://x/wiki", page[2], page[3]).extract(buf, True)
            outs.append(buf.getvalue())
        assert outs[0] == outs[1], page[2]


def test_table_markup_dump_without_siteinfo(shared_data, tmp_path):
    m = run_extract(shared_data / "enwiki-table-markup.xml.bz2", tmp_path / "t", ExtractConfig(current_time=T0))
    got = docs(tmp_path / "t")
    assert m.counters["articles"] == len(got) == 5
    assert got[0][1] == "Constructive vote of no confidence"
    assert not any("{|" in body or "|}" in body or "|-" in body for _, _, body in got)  # tables dropped


def test_builtin_sample(tmp_path):
    assert sample_dump_path().name == "sample-wiki.xml.bz2"
    r = subprocess.run([sys.executable, "-m", "preprocessing.sample.make_sample", "--check"], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stdout + r.stderr  # the packaged bytes are what make_sample.py writes
    assert hashlib.md5(sample_dump_path().read_bytes()).hexdigest() == SAMPLE_MD5
    m = run_extract(sample_dump_path(), tmp_path / "s", ExtractConfig(current_time=T0))
    got = docs(tmp_path / "s")
    titles = [t for _, t, _ in got]
    assert m.counters["articles"] == len(got) == 51 and len(set(titles)) == 51
    assert not {"Lighthouses", "Bike", "Talk:Lighthouse", "User:Sample editor", "Template:Lang"} & set(titles)
    text = "\n".join(b for _, _, b in got)
    for s in ("東京駅", "λόγος and Σωκράτης", "👨\u200d👩\u200d👧", "الخط العربي", "e\u0301", "café", "€"):
        assert s in text, s
    assert "[[" not in text and "{{" not in text and "<ref" not in text and "Category:" not in text
    assert 80_000 < sum(len(b) for _, _, b in got) < 400_000


def test_small_files_and_articles_bigger_than_a_file(tmp_path):
    m = run_extract(sample_dump_path(), tmp_path / "a", ExtractConfig(current_time=T0, bytes_per_file=1500))
    sizes = [f.bytes for f in m.files]  # every article is > 1500 bytes: one per file, and like OutputSplitter
    assert sizes[0] == 0 and len(sizes) == 52 and min(sizes[1:]) > 1500  # wiki_00 stays empty
    m = run_extract(sample_dump_path(), tmp_path / "b", ExtractConfig(current_time=T0, bytes_per_file=5000))
    files = sorted((tmp_path / "b").glob("*/wiki_??"))
    assert len(docs(tmp_path / "b")) == 51 and m.counters["files"] == len(files) == len(m.files) > 15
    assert [f.relative_to(tmp_path / "b").as_posix() for f in files] == [output_name(k) for k in range(len(files))]
    for f, nxt in zip(files, files[1:], strict=False):
        first_next = nxt.read_bytes().split(b"</doc>\n")[0] + b"</doc>\n"
        assert f.stat().st_size <= 5000 < f.stat().st_size + len(first_next)
    assert output_name(0) == "AA/wiki_00" and output_name(99) == "AA/wiki_99"
    assert output_name(100) == "AB/wiki_00" and output_name(2600) == "BA/wiki_00"


def test_stale_outputs_of_an_earlier_run_are_removed(tmp_path):
    out = tmp_path / "s"
    (out / "ZZ").mkdir(parents=True)
    (out / "ZZ/wiki_07").write_text("old")
    (out / "notes.txt").write_text("mine")
    run_extract(sample_dump_path(), out, ExtractConfig(current_time=T0))
    assert not (out / "ZZ/wiki_07").exists() and (out / "notes.txt").exists()


def test_upstream_manifest_is_checked(tmp_path):
    dump = tmp_path / "dl" / "sample.xml.bz2"
    with StageOutput(tmp_path / "dl", "download") as st:
        with st.open("sample.xml.bz2") as f:
            f.write(sample_dump_path().read_bytes())
    up = st.manifest
    run_extract(dump, tmp_path / "ok", ExtractConfig(current_time=T0), upstream=[up])
    dump.write_bytes(dump.read_bytes()[:-1] + b"\0")
    with pytest.raises(ChecksumError, match="sample.xml.bz2"):
        run_extract(dump, tmp_path / "bad", ExtractConfig(current_time=T0), upstream=[up])
    assert not (tmp_path / "bad").exists()


def _bz2(path: Path, xml: str) -> Path:
    path.write_bytes(bz2.compress(xml.encode()))
    return path


@pytest.mark.parametrize("kind", ["truncated", "not_bz2", "not_mediawiki", "empty", "missing"])
def test_bad_dumps_raise_one_clear_error_and_write_no_manifest(kind, tmp_path):
    d = tmp_path / f"{kind}.xml.bz2"
    expect = {"truncated": "truncated", "not_bz2": "not a bz2 file", "not_mediawiki": "not a MediaWiki XML dump",
              "empty": "holds no articles", "missing": "does not exist"}[kind]
    if kind == "truncated":
        data = sample_dump_path().read_bytes()
        d.write_bytes(data[: len(data) // 2])
    elif kind == "not_bz2":
        d.write_text("<mediawiki></mediawiki>\n")
    elif kind == "not_mediawiki":
        _bz2(d, '<?xml version="1.0"?>\n<rss>\n<channel><title>news</title></channel>\n</rss>\n')
    elif kind == "empty":  # a valid dump whose only page is a redirect, plus a template
        _bz2(d, "<mediawiki>\n<siteinfo>\n<namespaces>\n<namespace key=\"10\">Template</namespace>\n</namespaces>\n"
                "</siteinfo>\n<page>\n<title>A</title>\n<ns>0</ns>\n<id>1</id>\n<redirect title=\"B\" />\n<revision>\n"
                "<text>#REDIRECT [[B]]</text>\n</revision>\n</page>\n</mediawiki>\n")
    out = tmp_path / "out"
    with pytest.raises(InputError, match=expect) as e:
        run_extract(d, out, ExtractConfig(current_time=T0))
    assert str(d) in str(e.value)
    assert not (out / MANIFEST_NAME).exists() and not list(out.glob("*/wiki_*"))


def test_unusable_output_folder_is_a_clear_error(tmp_path):
    (tmp_path / "afile").write_text("x")
    with pytest.raises(InputError, match="afile"):
        run_extract(sample_dump_path(), tmp_path / "afile" / "out", ExtractConfig(current_time=T0))


# -- multistream dumps: the workers decompress their own bz2 streams ----------------------------------
def test_multistream_dump_gives_the_same_bytes(real, real_dump, tmp_path, monkeypatch):
    import preprocessing.text.extract_streams as es
    from preprocessing.text.extract_streams import to_multistream

    if not real_dump.whole:  # the clone's 0.8 MB dump: smaller jobs, so that it too is read in several (128 KiB:
        monkeypatch.setattr(es, "_MIN_CHUNK", 128 << 10)  # 5 jobs; with 64 KiB the last is the footer alone)
    out, m1 = real
    multi = tmp_path / "multi.xml.bz2"  # as Wikimedia packs them (10 instead of 100 pages per stream)
    multi.write_bytes(to_multistream(bz2.decompress(real_dump.path.read_bytes()), 10))
    m2 = run_extract(multi, tmp_path / "m", ExtractConfig(current_time=T0, processes=2))
    assert m2.counters["bz2_chunks"] > 2
    assert [(f.name, f.md5) for f in m2.files] == [(f.name, f.md5) for f in m1.files]


@pytest.fixture
def tiny_chunks(monkeypatch):
    import preprocessing.text.extract_streams as es

    monkeypatch.setattr(es, "_MIN_CHUNK", 1)  # the sample is small: one job per stream


def _sample_xml() -> bytes:
    return bz2.decompress(sample_dump_path().read_bytes())


def test_multistream_sample_in_process_and_in_workers(tiny_chunks, tmp_path):
    from preprocessing.text.extract_streams import to_multistream

    ref = run_extract(sample_dump_path(), tmp_path / "ref", ExtractConfig(current_time=T0, multistream=False))
    multi = tmp_path / "multi.xml.bz2"
    multi.write_bytes(to_multistream(_sample_xml(), 4))
    for n in (1, 2):
        m = run_extract(multi, tmp_path / f"p{n}", ExtractConfig(current_time=T0, processes=n))
        assert m.counters["bz2_chunks"] > 4 and m.key == ref.key
        assert [(f.name, f.md5) for f in m.files] == [(f.name, f.md5) for f in ref.files]


def test_streams_that_split_pages_are_read_serially(tiny_chunks, tmp_path):
    xml = _sample_xml()  # like pbzip2: fixed-size pieces, cut anywhere
    dump = tmp_path / "pbzip2.xml.bz2"
    dump.write_bytes(b"".join(bz2.compress(xml[k:k + 20000]) for k in range(0, len(xml), 20000)))
    ref = run_extract(sample_dump_path(), tmp_path / "ref", ExtractConfig(current_time=T0))
    m = run_extract(dump, tmp_path / "p", ExtractConfig(current_time=T0, processes=2))
    assert m.counters["bz2_chunks"] == 0
    assert [(f.name, f.md5) for f in m.files] == [(f.name, f.md5) for f in ref.files]


def test_truncated_multistream_dump(tiny_chunks, tmp_path):
    from preprocessing.text.extract_streams import to_multistream

    data = to_multistream(_sample_xml(), 4)
    dump = tmp_path / "cut.xml.bz2"
    dump.write_bytes(data[: len(data) * 2 // 3])
    with pytest.raises(InputError, match="truncated") as e:
        run_extract(dump, tmp_path / "out", ExtractConfig(current_time=T0, processes=2))
    assert str(dump) in str(e.value) and not (tmp_path / "out" / MANIFEST_NAME).exists()


def test_uncompressed_xml_dump_gives_the_same_bytes(tmp_path):
    xml = tmp_path / "sample.xml"
    xml.write_bytes(_sample_xml())
    ref = run_extract(sample_dump_path(), tmp_path / "ref", ExtractConfig(current_time=T0))
    m = run_extract(xml, tmp_path / "x", ExtractConfig(current_time=T0))
    assert [(f.name, f.md5) for f in m.files] == [(f.name, f.md5) for f in ref.files]


@pytest.mark.parametrize("seed", range(6))
def test_split_writer_matches_wikiextractor_output_splitter(seed, tmp_path):
    """Same file names and bytes as the library's own OutputSplitter/NextFile for random article sizes."""
    import random

    from wikiextractor.WikiExtractor import NextFile, OutputSplitter

    from preprocessing.text.extract import _SplitWriter

    rng = random.Random(seed)
    limit = rng.choice([300, 1000, 5000])
    texts = [f"<doc id=\"{k}\">\n" + "é" * rng.randint(0, limit) + "\n</doc>\n" for k in range(rng.randint(1, 250))]
    lib = OutputSplitter(NextFile(str(tmp_path / "lib")), limit, compress=False)
    for t in texts:
        lib.write(t)
    lib.close()
    with StageOutput(tmp_path / "ours", "extract") as out, _SplitWriter(out, limit) as w:
        for t in texts:
            w.write(t)

    def tree(root: Path) -> dict[str, bytes]:
        return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.glob("*/wiki_*"))}

    assert tree(tmp_path / "ours") == tree(tmp_path / "lib") and len(tree(tmp_path / "lib")) == w.files


def test_same_bytes_as_wikiextractors_own_process_dump(real, real_dump, tmp_path, monkeypatch):
    """The stage == wikiextractor 3.1.0's CLI code path (process_dump, default flags), clock pinned alike."""
    import datetime as dt
    import logging

    import wikiextractor.WikiExtractor as wx
    from wikiextractor import extract as wxe

    when = dt.datetime.fromisoformat(T0)

    class FakeTime:  # forked worker processes inherit the patched module
        @staticmethod
        def strftime(fmt):
            return when.strftime(fmt)

    monkeypatch.setattr(wxe, "time", FakeTime)
    monkeypatch.setattr(wx, "templateNamespace", wx.templateNamespace)
    kwargs = {"keepLinks": False, "HtmlFormatting": False, "to_json": False, "to_text": False, "discard_empty": False,
              "ignored_tag_patterns": list(wxe._DEFAULT_IGNORED_TAG_PATTERNS) + [wxe.ignoreTag("a")]}
    lib = tmp_path / "lib"
    lib.mkdir()
    wx.process_dump(str(real_dump.path), None, str(lib), 1 << 20, False, 2, True, True, False,
                    extractor_kwargs=kwargs, log_level=logging.WARNING)
    out, _ = real
    ours = {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.glob("*/wiki_??"))}
    theirs = {p.relative_to(lib).as_posix(): p.read_bytes() for p in sorted(lib.glob("*/wiki_??"))}
    assert ours == theirs
