"""`--extractor mlperf`: the pinned WikiExtractor.py (attardi/wikiextractor @ 3162bb6c), byte for byte.

Every comparison runs the script itself, alone (``python WikiExtractor.py DUMP -o OUT``, MLPerf's command line), on
Python 3.7 where the machine has one (the Python MLPerf's data was made with), else on this Python through
bertpipe's compatibility layer; its clock is pinned by replacing ``time.strftime`` for the run. Inputs: the shared
real dumps (../shared/data), the built-in sample, and dumps generated here (templates, parser functions, nested
tables, redirects, other namespaces, odd Unicode, many bz2 streams, tens of output files).
"""

from __future__ import annotations

import bz2
import glob
import hashlib
import os
import random
import re
import subprocess
import sys
from pathlib import Path
from xml.sax.saxutils import escape

import pytest

from core.errors import InputError
from preprocessing.text import extract_streams
from preprocessing.text import mlperf_extractor as mx
from preprocessing.text.extract import ExtractConfig, default_extractor, run_extract
from tests.conftest import REAL_DUMP, SHARED

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = SHARED / "reference" / "wikiextractor-3162bb6c" / "WikiExtractor.py"
GENSIM = SHARED / "data" / REAL_DUMP
T0 = "2026-11-27T12:00:00"  # the golden text chain's clock (its two "2026" are {{CURRENTYEAR}})

# The script is not in the project (nor may it be): where ../shared is absent these tests are not run, one skip line
# says so (tests/conftest.py). Those that read the whole gensim dump need it from ../shared/data too.
needs_script = pytest.mark.needs_shared("reference/wikiextractor-3162bb6c/WikiExtractor.py")
needs_gensim = pytest.mark.needs_shared(f"data/{REAL_DUMP}")

# The pinned clock for the script run alone: time.strftime() without a time reads this one (test harness only).
_RUNNER = r"""
import sys, time, runpy, datetime
iso, script = sys.argv[1], sys.argv[2]
t = datetime.datetime.strptime(iso, "%Y-%m-%dT%H:%M:%S").timetuple()
_strftime = time.strftime
time.strftime = lambda fmt, tt=None: _strftime(fmt, t if tt is None else tt)
sys.argv = [script] + sys.argv[3:]
if sys.version_info >= (3, 11):  # the compatibility layer (the script refuses to compile its regexes there)
    sys.path.insert(0, sys.argv.pop())
    from preprocessing.text.mlperf_extractor import load_script
    load_script(__import__("pathlib").Path(script), iso).main()
else:
    runpy.run_path(script, run_name="__main__")
"""


def python37() -> str | None:
    """A working Python 3.7 (pyenv shims answer only where a version is selected: try them from here)."""
    cands = [os.environ.get("BERTPIPE_PYTHON37"), *sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.7*/bin/python3.7"))),
             "python3.7"]
    for c in filter(None, cands):
        try:
            r = subprocess.run([c, "-c", "import sys; print(sys.version_info[:2])"], capture_output=True, text=True,
                               timeout=30, cwd=ROOT)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if r.returncode == 0 and r.stdout.strip() == "(3, 7)":
            return c
    return None


PY37 = python37()


def run_script_alone(dump: Path, out: Path, when: str = T0, extra: tuple[str, ...] = ()) -> dict[str, bytes]:
    """``WikiExtractor.py DUMP -o OUT`` (MLPerf's command line) with the clock at ``when``: its files' bytes."""
    py = PY37 or sys.executable
    args = [py, "-c", _RUNNER, when, str(SCRIPT), str(dump), "-o", str(out), "-q", "--processes", "2", *extra]
    if not PY37:
        args.append(str(ROOT))
    r = subprocess.run(args, capture_output=True, text=True, timeout=900, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-2000:]
    return files_of(out)


def files_of(out: Path) -> dict[str, bytes]:
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in sorted(out.glob("[A-Z][A-Z]/wiki_[0-9][0-9]"))}


def ours(dump: Path, out: Path, processes: int = 1, when: str = T0, **kw) -> dict[str, bytes]:
    run_extract(dump, out, ExtractConfig(extractor="mlperf", extractor_script=str(SCRIPT), processes=processes,
                                         current_time=when, **kw))
    return files_of(out)


# -- generated dumps -----------------------------------------------------------------------------------------
SITEINFO = """  <siteinfo>
    <sitename>Wikipedia</sitename>
    <dbname>enwiki</dbname>
    <base>https://en.wikipedia.org/wiki/Main_Page</base>
    <generator>MediaWiki 1.35.0-wmf.11</generator>
    <case>first-letter</case>
    <namespaces>
      <namespace key="-2" case="first-letter">Media</namespace>
      <namespace key="-1" case="first-letter">Special</namespace>
      <namespace key="0" case="first-letter" />
      <namespace key="1" case="first-letter">Talk</namespace>
      <namespace key="6" case="first-letter">File</namespace>
      <namespace key="10" case="first-letter">Template</namespace>
      <namespace key="14" case="first-letter">Category</namespace>
      <namespace key="828" case="first-letter">Module</namespace>
    </namespaces>
  </siteinfo>
"""

TEMPLATES = {
    "Template:Infobox thing": "{{{name|Unnamed}}} is a {{{kind|thing}}}<noinclude>[[Category:Infobox templates]]"
                              "</noinclude><includeonly> ({{{1|}}})</includeonly>",
    "Template:Lang": "{{{2}}}",
    "Template:Convert": "{{{1}}}&nbsp;{{{2}}} ({{#expr: {{{1}}} * 1000}} m)",
    "Template:Only": "before<onlyinclude>only {{{1|x}}}</onlyinclude>after",
    "Template:Nest": "[{{Lang|xx|{{{1}}}}}|{{#if:{{{2|}}}|two|none}}]",
    "Template:Old lang": "#REDIRECT [[Template:Lang]]",
    "Template:Year": "{{CURRENTYEAR}}-{{CURRENTMONTH}}-{{CURRENTDAY}}",
    "Module:Foo": "local p = {} function p.bar() return 'x' end return p",
}

WORDS = ("alpha beta gamma delta river mountain city language history science music theory empire "
         "island bridge winter summer painter engine").split()
ODD = ["naïve café ﬁligree ǅemal", "𝔘𝔫𝔦𝔠𝔬𝔡𝔢 😀 🇪🇪", "zero\u200bwidth and\u00a0nbsp", "Ελληνικά עברית العربية 中文 ㄅㄆ",
       "e\u0301 combining", "line\u2028separator", "bom\ufeffinside", "tab\tand  spaces", "ＦＵＬＬ ｗｉｄｔｈ",
       "&amp; &lt;b&gt; &mdash; &#x263A; &nbsp;"]


def _para(rng: random.Random, k: int) -> str:
    words = " ".join(rng.choice(WORDS) for _ in range(rng.randint(20, 120)))
    pieces = [
        f"'''{words.split()[0].title()}''' is a [[{rng.choice(WORDS)}|{rng.choice(WORDS)}]] in [[Place {k}]].",
        "{{Infobox thing|name=Thing %d|kind=%s|extra}}" % (k, rng.choice(WORDS)),
        "{{Lang|fr|''bonjour''}} and {{Old lang|de|hallo}} and {{Only|%d}}" % k,
        "{{Convert|%d|km}}, {{Nest|%s|y}}" % (k % 97, rng.choice(WORDS)),
        "{{#if: %s | yes | no }} {{#ifeq: a | a | same | diff}} {{#switch: b | a=1 | b=two | #default=d}}"
        % rng.choice(["", "x"]),
        "{{#expr: 2*3+%d}} {{lc:MiXeD}} {{uc:lower}} {{ucfirst:word}} {{PAGENAME}} {{NAMESPACE}}" % k,
        "Year {{CURRENTYEAR}}, month {{CURRENTMONTH}}, day {{CURRENTDAY}}, {{Year}}, at {{CURRENTTIME}}.",
        "{{#invoke:Foo|bar}} {{Missing template|a=1}} {{{param|default}}}",
        '{| class="wikitable"\n|-\n! head !! head2\n|-\n| a || b\n|-\n|\n{|\n| inner [[link]]\n|-\n| {{Lang|x|y}}\n|}\n|}',
        "<ref>cite {{cite web|url=http://x.example/%d|title=T}}</ref> after ref<ref name=\"a\" />." % k,
        "* item [[A]]\n* item ''two''\n# numbered\n: indented\n; term : definition",
        "<math>\\alpha^2 + {{{x}}}</math> <code>x = 1</code> <nowiki>[[raw]] {{raw}}</nowiki>",
        "[http://example.com/%d Example link] and http://bare.example.org/x and [https://e.org]" % k,
        "[[File:Img%d.jpg|thumb|A caption with [[link]] inside]] [[Image:X.png]] [[:Category:Seen]]" % k,
        "<!-- a comment {{x}} --> <div>div text</div> <span style=\"x\">span</span> <small>small</small>",
        "<gallery>\nA.jpg|cap\n</gallery> <blockquote>quoted</blockquote> <br/> <sup>1</sup>",
        "== Section %d ==\n=== Sub ===\n" % k,
        rng.choice(ODD),
        "{{unclosed template [[broken link ''italic",
        "[[w:Interwiki]] [[wikt:word]] [[fr:Bonjour]] [[Special:Random]]",
    ]
    rng.shuffle(pieces)
    return words + " " + " ".join(pieces[: rng.randint(3, 10)])


def _page(title: str, ns: int, pid: int, text: str | None, redirect: str | None = None) -> str:
    red = f'    <redirect title="{escape(redirect, {chr(34): "&quot;"})}" />\n' if redirect else ""
    body = ('      <text bytes="0" xml:space="preserve" />\n' if text is None else
            f'      <text bytes="{len(text.encode())}" xml:space="preserve">{escape(text)}</text>\n')
    return (f"  <page>\n    <title>{escape(title)}</title>\n    <ns>{ns}</ns>\n    <id>{pid}</id>\n{red}"
            f"    <revision>\n      <id>{pid * 10 + 1}</id>\n      <timestamp>2019-12-01T00:00:00Z</timestamp>\n"
            f"      <contributor>\n        <username>Gen</username>\n        <id>42</id>\n      </contributor>\n"
            f"      <model>wikitext</model>\n      <format>text/x-wiki</format>\n{body}"
            f"      <sha1>0</sha1>\n    </revision>\n  </page>\n")


def make_dump(pages: int, seed: int = 0, paragraphs: tuple[int, int] = (1, 6), dup_id_at: int | None = None,
              raw_cr: bool = False) -> bytes:
    """A MediaWiki dump of ``pages`` pages: articles (ns 0), redirects, talk, file, category pages, templates and a
    module (some defined after their first use), and one page with an empty <text />."""
    rng = random.Random(seed)
    out = ['<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10" xml:lang="en">\n', SITEINFO]
    templates = list(TEMPLATES.items())
    pid = 10
    for k in range(pages):
        pid += rng.randint(1, 5)
        if dup_id_at is not None and k == dup_id_at:
            pid -= 0  # (the caller makes two pages share this id below)
        r = rng.random()
        if templates and (r < 0.04 or k > pages - len(templates) - 1):
            title, text = templates.pop()
            out.append(_page(title, 828 if title.startswith("Module:") else 10, pid, text))
        elif r < 0.12:
            out.append(_page(f"Redirect {k}", 0, pid, f"#REDIRECT [[Article {k - 1}]]", redirect=f"Article {k - 1}"))
        elif r < 0.16:
            out.append(_page(f"Talk:Article {k}", 1, pid, _para(rng, k)))
        elif r < 0.18:
            out.append(_page(f"Category:Cat {k}", 14, pid, "Category text " + _para(rng, k)))
        elif r < 0.20:
            out.append(_page(f"File:Img{k}.jpg", 6, pid, "A file page."))
        elif k == 3:
            out.append(_page("Empty page", 0, pid, None))
        else:
            n = rng.randint(*paragraphs)
            title = f"Article {k}" + (" " + rng.choice(ODD).split()[0] if rng.random() < 0.1 else "")
            body = "\n\n".join(_para(rng, k * 10 + j) for j in range(n))
            if raw_cr and k % 3 == 0:  # a raw carriage return in the XML (Python 3.7 read .bz2 lines as bytes)
                body = body.replace(" and ", " and\r ", 2) + "\r\nend\rof page"
            out.append(_page(title, 0, pid, body))
        if dup_id_at is not None and k == dup_id_at:
            out.append(_page(f"Article dup {k}", 0, pid, "Same id as the page before: the script skips it."))
    out.append("</mediawiki>\n")
    return "".join(out).encode("utf-8")


@pytest.fixture(scope="module")
def gen(tmp_path_factory) -> dict[str, Path]:
    """A generated dump as plain .bz2, multistream .bz2 (5 pages a stream) and .xml, with the script's own output."""
    d = tmp_path_factory.mktemp("gen")
    xml = make_dump(400, seed=1)
    (d / "gen.xml").write_bytes(xml)
    (d / "gen.xml.bz2").write_bytes(bz2.compress(xml, 9))
    (d / "gen-multistream.xml.bz2").write_bytes(extract_streams.to_multistream(xml, pages_per_stream=5))
    return {"dir": d, "xml": d / "gen.xml", "bz2": d / "gen.xml.bz2", "multi": d / "gen-multistream.xml.bz2"}


@pytest.fixture
def tiny_chunks(monkeypatch):
    """Ranges of a few bz2 streams each, so that small dumps are cut into many ranges."""
    monkeypatch.setattr(extract_streams, "_MIN_CHUNK", 2048)


# -- the compatibility layer ---------------------------------------------------------------------------------
@pytest.mark.parametrize("pattern, expected", [
    (r"\[(((?i)http|ftp)://x)", r"(?i)\[((http|ftp)://x)"),
    (r"^a((?i)gif|png)$", r"(?i)^a(gif|png)$"),
    (r"(?i)already first", r"(?i)already first"),
    (r"no flags (?:x) (?P<n>y) (?i:scoped)", r"no flags (?:x) (?P<n>y) (?i:scoped)"),
    (r"[(?i)] in a class \(?i\)", r"[(?i)] in a class \(?i\)"),
    (r"a(?x) b (?s)c", r"(?xs)a b c"),
    (rb"x((?i)y)", rb"(?i)x(y)"),
])
def test_hoisting_moves_only_mid_pattern_global_flags(pattern, expected):
    assert mx.hoist_global_flags(pattern) == expected
    if isinstance(pattern, str) and "(?" in pattern[1:] and pattern != expected:
        with pytest.raises(re.error) if sys.version_info >= (3, 11) else pytest.warns(DeprecationWarning):
            re.compile(pattern)
    re.compile(expected)


def test_hoisted_pattern_matches_what_python37_matched():
    p = mx._CompatRe().compile(r"\[(((?i)HTTP|ftp)://x)")
    assert p.match("[Http://x") and p.match("[FTP://x")


@needs_script
def test_script_refuses_this_python_without_the_layer_and_loads_with_it(tmp_path):
    if sys.version_info >= (3, 11):
        r = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "global flags not at the start" in r.stderr
    mod = mx.load_script(SCRIPT, T0)
    assert mod.version == "2.75" and mod.time.strftime("%Y-%m-%d %H") == "2026-11-27 12"
    assert "re" not in [m for m in sys.modules if m.startswith("bertpipe_wikiextractor")]
    # nothing of the script is in the project
    tracked = subprocess.run(["git", "ls-files"], capture_output=True, text=True, cwd=ROOT).stdout.split()
    assert not [f for f in tracked if f.endswith("WikiExtractor.py")]
    needles = ["def pages" + "_from(input):", "def load" + "_templates(file, output_file=None):",
               "class Extract" + "or(object):"]  # (split: this file must not match itself)
    assert not [f for f in tracked if f.endswith(".py") and (ROOT / f).is_file()
                and any(n in (ROOT / f).read_text(encoding="utf-8", errors="replace") for n in needles)]


# -- where the script comes from -----------------------------------------------------------------------------
def test_wrong_or_missing_script_is_one_line_saying_where_to_get_it(real_dump, tmp_path):
    """(The pinned script with a line added where ../shared has it, else another file.)"""
    bad = tmp_path / "WikiExtractor.py"
    bad.write_bytes((SCRIPT.read_bytes() if SCRIPT.is_file() else b"print('not the pinned script')\n")
                    + b"\n# changed\n")
    for path in (bad, tmp_path / "missing.py"):
        with pytest.raises(InputError) as e:
            mx.script_path(path)
        msg = str(e.value)
        assert "\n" not in msg and mx.SCRIPT_URL in msg and mx.SCRIPT_SHA256 in msg and "--extractor-script" in msg
    out = tmp_path / "out"
    with pytest.raises(InputError):
        run_extract(real_dump.path, out, ExtractConfig(extractor="mlperf", extractor_script=str(bad)))
    assert not (out / "AA").exists()


@needs_script
def test_fetched_once_into_the_user_cache_and_checked(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(mx.SCRIPT_ENV, raising=False)
    calls = []

    class Answer:
        def __init__(self, data):
            self.data = data

        def __enter__(self):
            return self

        def __exit__(self, *a):
            return False

        def read(self, n=-1):
            return self.data

    def fake_urlopen(url, timeout=None):
        calls.append(url)
        return Answer(body)

    monkeypatch.setattr(mx.urllib.request, "urlopen", fake_urlopen)
    body = b"not the script"
    with pytest.raises(InputError, match="did not give the pinned bytes"):
        mx.script_path()
    assert not mx.cache_path().exists()
    body = SCRIPT.read_bytes()
    p = mx.script_path()
    assert p == mx.cache_path() and p.read_bytes() == body and calls == [mx.SCRIPT_URL] * 2
    assert mx.script_path() == p and len(calls) == 2  # cached: no second fetch
    assert mx.SCRIPT_URL == ("https://raw.githubusercontent.com/attardi/wikiextractor/"
                             "3162bb6c3c9ebd2d15be507aa11d6fa818a454ac/WikiExtractor.py")
    assert hashlib.sha256(body).hexdigest() == mx.SCRIPT_SHA256


def test_choice_and_clock_are_in_the_stage_key():
    k31 = ExtractConfig(current_time=T0).params()
    kml = ExtractConfig(current_time=T0, extractor="mlperf", extractor_script="/x/WikiExtractor.py").params()
    assert k31["extractor"] == "wikiextractor-3.1" and kml["extractor"] == "mlperf"
    assert kml["extractor_sha256"] == mx.SCRIPT_SHA256 and kml["current_time"] == T0 and "extractor_script" not in kml
    assert ExtractConfig(current_time="2020-01-01T00:00:00", extractor="mlperf").params() != kml
    assert default_extractor("enwiki-20200101") == "mlperf"
    assert default_extractor("/d/enwiki-20200101-pages-articles-multistream.xml.bz2") == "mlperf"
    assert default_extractor("sample") == default_extractor("enwiki-latest") == "wikiextractor-3.1"
    from preprocessing.params import DataParams

    assert DataParams(source="enwiki-20200101").resolved_extractor() == "mlperf"
    assert DataParams().resolved_extractor() == "wikiextractor-3.1"
    assert DataParams(source="enwiki-20200101", extractor="wikiextractor-3.1").resolved_extractor() == "wikiextractor-3.1"
    with pytest.raises(InputError, match="extractor"):
        DataParams(extractor="wikiextractor-2")


# -- the same bytes as the script alone ----------------------------------------------------------------------
@needs_script
@needs_gensim
@pytest.mark.parametrize("processes", [1, 2])
def test_gensim_dump_gives_the_golden_extractor_output(golden, processes, tmp_path):
    got = ours(GENSIM, tmp_path / "out", processes)
    want = {f"AA/wiki_0{i}": (golden / "text_chain" / "text" / "AA" / f"wiki_0{i}").read_bytes() for i in range(3)}
    assert got == want


@needs_script
def test_shared_dumps_and_the_sample_as_the_script_alone(shared_data, tmp_path):
    from preprocessing.sample import sample_dump_path

    for dump in (sample_dump_path(),):  # (the gensim dump: its golden output is the script's, compared above)
        name = dump.name
        assert ours(dump, tmp_path / f"o-{name}", 2) == run_script_alone(dump, tmp_path / f"r-{name}")
    # the table-markup dump has no <siteinfo>: the script reads on to the end looking for it and writes nothing
    ref = run_script_alone(shared_data / "enwiki-table-markup.xml.bz2", tmp_path / "r-table")
    assert ref == {"AA/wiki_00": b""}
    with pytest.raises(InputError, match="no articles"):
        ours(shared_data / "enwiki-table-markup.xml.bz2", tmp_path / "o-table")


@needs_script
def test_generated_dump_plain_multistream_and_xml_any_worker_count(gen, tiny_chunks, tmp_path):
    want = run_script_alone(gen["bz2"], tmp_path / "ref", extra=("-b", "200K"))
    assert len(want) >= 3 and b"Article" in want["AA/wiki_00"]
    text = b"".join(want.values()).decode()
    assert "2026" in text and "bonjour" not in text  # {{CURRENTYEAR}} pinned; no --templates: templates expand to ''
    assert assert_ranges(gen["multi"]) > 5
    for name, procs in (("bz2", 1), ("bz2", 3), ("multi", 1), ("multi", 2), ("multi", 3), ("xml", 2)):
        got = ours(gen[name], tmp_path / f"o-{name}-{procs}", procs, bytes_per_file=200 * 1024)
        assert got == want, (name, procs)


def assert_ranges(dump: Path) -> int:
    return len(extract_streams.plan_chunks(dump, 2))


@needs_script
def test_gathered_templates_as_the_scripts_templates_option(gen, tiny_chunks, tmp_path):
    want = run_script_alone(gen["bz2"], tmp_path / "ref", extra=("--templates", str(tmp_path / "templates.txt")))
    assert "bonjour" in b"".join(want.values()).decode()
    for name, procs in (("bz2", 2), ("multi", 1), ("multi", 3)):
        assert ours(gen[name], tmp_path / f"o-{name}-{procs}", procs, gather_templates=True) == want, (name, procs)


@needs_script
def test_a_page_repeating_the_previous_id_across_streams_falls_back_to_one_reader(tiny_chunks, tmp_path):
    xml = make_dump(60, seed=3, dup_id_at=29)
    plain, multi = tmp_path / "d.xml.bz2", tmp_path / "d-multistream.xml.bz2"
    plain.write_bytes(bz2.compress(xml))
    multi.write_bytes(extract_streams.to_multistream(xml, pages_per_stream=30))  # the twin opens a stream
    want = run_script_alone(plain, tmp_path / "ref")
    assert b"Article dup 29" not in b"".join(want.values())
    for procs in (1, 2):
        assert ours(multi, tmp_path / f"o{procs}", procs) == want


@needs_script
def test_the_pinned_date_is_what_the_magic_words_say(gen, tmp_path):
    a = b"".join(ours(gen["bz2"], tmp_path / "a", when="2020-01-01T00:00:00").values()).decode()
    b = b"".join(ours(gen["bz2"], tmp_path / "b", when="2019-12-31T23:59:58").values()).decode()
    assert "Year 2020, month 01, day 01, , at 00:00:00." in a and "Year 2019, month 12, day 31" in b


@needs_script
@pytest.mark.slow
def test_tens_of_output_files_any_worker_count(tiny_chunks, tmp_path):
    xml = make_dump(3600, seed=7, paragraphs=(2, 8))
    plain, multi = tmp_path / "big.xml.bz2", tmp_path / "big-multistream.xml.bz2"
    plain.write_bytes(bz2.compress(xml))
    multi.write_bytes(extract_streams.to_multistream(xml, pages_per_stream=100))
    want = run_script_alone(plain, tmp_path / "ref", extra=("-b", "200K"))
    assert len(want) >= 20
    for dump, procs in ((plain, 2), (multi, 1), (multi, 2), (multi, 5)):
        assert ours(dump, tmp_path / f"o-{dump.name}-{procs}", procs, bytes_per_file=200 * 1024) == want


@needs_script
def test_every_stream_its_own_range_with_the_closing_tag_alone_stays_parallel(gen, monkeypatch, tmp_path):
    monkeypatch.setattr(extract_streams, "_MIN_CHUNK", 1)  # one range per bz2 stream; the last: </mediawiki> alone
    monkeypatch.setattr(extract_streams, "_MAX_CHUNK", 1)
    chunks = extract_streams.plan_chunks(gen["multi"], 2)
    assert bz2.decompress(Path(gen["multi"]).read_bytes()[chunks[-1][0]:]).strip() == b"</mediawiki>"
    want = run_script_alone(gen["bz2"], tmp_path / "ref")
    m = run_extract(gen["multi"], tmp_path / "o", ExtractConfig(extractor="mlperf", extractor_script=str(SCRIPT),
                                                                processes=2, current_time=T0))
    assert m.counters["bz2_chunks"] == len(chunks) > 50  # no fall-back to one reader
    assert files_of(tmp_path / "o") == want


@needs_script
@pytest.mark.skipif(PY37 is None, reason="needs Python 3.7: the reading of raw carriage returns is 3.7's")
def test_raw_carriage_returns_read_as_python37_did(tmp_path):
    xml = make_dump(80, seed=5, raw_cr=True)
    assert b"\r" in xml
    dump = tmp_path / "cr.xml.bz2"
    dump.write_bytes(bz2.compress(xml))
    want = run_script_alone(dump, tmp_path / "ref")
    assert b"\r" in b"".join(want.values())
    assert ours(dump, tmp_path / "o", 2) == want


@needs_script
@needs_gensim
def test_extract_command(golden, tmp_path, capsys):
    from bertpipe.cli import main

    out = tmp_path / "text"
    assert main(["extract", "--dump", str(GENSIM), "--out", str(out), "--extractor", "mlperf", "--extractor-script",
                 str(SCRIPT), "--current-time", T0, "--processes", "2", "-q"]) == 0
    assert "extractor mlperf" in capsys.readouterr().out
    assert files_of(out) == {f"AA/wiki_0{i}": (golden / "text_chain" / "text" / "AA" / f"wiki_0{i}").read_bytes()
                             for i in range(3)}
    bad = tmp_path / "WikiExtractor.py"
    bad.write_text("print('not it')\n")
    assert main(["extract", "--dump", str(GENSIM), "--out", str(tmp_path / "t2"), "--extractor", "mlperf",
                 "--extractor-script", str(bad), "-q"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and mx.SCRIPT_URL in err
    assert not (tmp_path / "t2" / "AA").exists()
