"""clean = cleanup_file.py + clean.sh: rule by rule, and against GNU grep/sed themselves."""

from __future__ import annotations

import random
import shutil
import subprocess

import pytest

from preprocessing.text.clean import clean_sh_text, cleanup_file_text


def test_cleanup_file_rules() -> None:
    raw = ('<doc id="1" url="u" title="T">\nT\n\nPara one.\nPara two.\n</doc>\n'
           '<doc id="2" url="u" title="</doc> title">\n</doc> title\n\nx\nText\r\nMore\rEnd\n</doc>\nZ')
    # <doc> -> "\n"; the title line after it is dropped whatever it holds; blank, </doc> and
    # length-1 lines ("\n", or a one-character last line) are dropped; \r and \r\n end lines
    assert cleanup_file_text(raw) == "\nPara one.\nPara two.\n\nx\nText\nMore\nEnd\n"
    assert cleanup_file_text("") == ""


@pytest.mark.parametrize(("line", "expected"), [
    ("a [[b]] c [[d|e]] f", "a b c e f"),
    ("[[[[x]]]]", "x"),  # two passes of [[x]] -> x
    # [[x]] -> x runs before the File/Media/Image rules, so only multi-part file links are removed
    ("keep [[File:a.jpg|thumb|cap]] [[:file:b.png]] [[media:c]] [[Image:d]] z", "keep  :file:b.png media:c Image:d z"),
    ("uphold[ing] [...] [a|b]", "upholding ... [a|b]"),  # single brackets around bracket-free text go
    ("[[a|b|c]]", ""),  # three parts: only rule 9 ([^][]* allows '|') applies, and deletes it
    ("alt=Photo of x", "Photo of x"),
    ("x</doc>y", "x\ry"),
    ("<chem>H2O</chem> <ins>new</ins>", ">H2O >new"),  # the kept group starts after "<chem"
    ("<ref name=a>cite</ref>ok<ref name=b/>ok<ref>z</ref>", "okok"),
    ("<, ref foo</ref>bar", "bar"),
    ("a<section begin=x />b<section end=\\x />c", "ab<section end=\\x />c"),  # [^\\]: no backslash
    ("<mapframe a=1 />m<mapframe b\\c/>", "m"),  # 2nd: [^\\/] fails on '\', then <mapframe[^>]*> takes it
    ("<div class=x>t</div><div>u</div style>", "tu"),
    ("<poem>p</poem><poem style=x>q<br>r</br><BR>", "pqr"),
    ("<su<poem>p>x", "x"),  # deletions in order: removing <poem> makes a <sup> that a later step removes
    ("<graph>{g}</graph>", ""),
])
def test_clean_sh_rules(line: str, expected: str) -> None:
    assert clean_sh_text(line + "\n") == expected + "\n"


def test_clean_sh_grep_lines() -> None:
    text = '<doc id="1">\nkeep\n[[Category:Foo]] gone\nx [[Category:a[b]] kept\n<doc a>b>\nlast'
    # whole lines go; a [ inside the category breaks the match; grep adds the final newline
    assert clean_sh_text(text) == "keep\nx [[Category:ab] kept\n<doc a>b>\nlast\n"


SEDS = r"""
s/\[\[\([^]|[]*\)\]\]/\1/g
s/\[\[\([^]|[]*\)\]\]/\1/g
s/\[\[[^]|[]*|\([^]|[]*\)\]\]/\1/g
s/\[\[[^]|[]*|\([^]|[]*\)\]\]/\1/g
s/\[\[[:]*[Ff]ile:[^][]*\]\]//g
s/\[\[[Mm]edia:[^][]*\]\]//g
s/\[\[[Ii]mage:[^][]*\]\]//g
s/\[\([^]|[]*\)\]/\1/g
s/\[\[\([^][]*\)\]\]//g
s/alt=//g
s/<\/doc>/\r/g
s/<chem\([^<]*\)<\/chem>/\1/g
s/<ins\([^<]*\)<\/ins>/\1/g
s/<\, ref \([^<]*\)<\/ref>//g
s/<includeonly\([^<]*\)<\/includeonly>//g
s/<graph\([^<]*\)<\/graph>//g
s/<section\([^\\]*\)\/>//g
s/<meta\([^\\]*\)\/>//g
s/<hr\([^\\]*\)\/>//g
s/<gallery\([^>]*\)>//g
s/<ref\([^<]*\)<\/ref>//g
s/<ref\([^>]*\)>//g
s/<http\([^>]*\)>//g
s/<Ref\([^>]*\)>//g
s/<mapframe \([^\/]*\)\/>//g
s/<mapframe\([^>]*\)>//g
""".strip().splitlines() + [f"s/{t.replace('/', chr(92) + '/')}//g" for t in (
    "</mapframe> <poem> </poem> <math> </math> <ref> </ref>".split())] + [
    r"s/<div\([^>]*\)>//g", r"s/<\/div\([^>]*\)>//g", r"s/<\/div style>//g", r"s/<\/div>//g"] + [
    f"s/{t.replace('/', chr(92) + '/')}//g" for t in (
        "<sup> </sup> <br> </br> <BR> </BR> <Br> </Br> <del> </del> <nowiki> </nowiki> <NOWIKI> </NOWIKI> "
        "<onlyinclude> </onlyinclude> <includeonly> </includeonly> <small> </small> <chem> </chem> "
        "<noinclude> </noinclude> <gallery> </gallery> <graph>{ <graph> }</graph> </graph> </references>").split()
] + [r"s/<poem \([^>]*\)>//g"]

PIECES = ["[[", "]]", "[", "]", "|", "Category:", "File:", ":file:", "Image:", "media:", "alt=", "</doc>", "<doc ",
          "<chem", "</chem>", "<ins", "</ins>", "<ref", "<ref>", "</ref>", "<, ref ", "<section", "<meta", "<hr", "/>",
          "\\", "/", "<mapframe ", "<mapframe", "</mapframe>", "<div", "</div>", "<poem", "<poem ", "<graph>{", "}</graph>",
          "<gallery", ">", "<", "<br>", "<sup>", "<small>", "<http", "<Ref", "<includeonly", "</includeonly>",
          "a", "b c", " ", "é", "—", "\t", "x.y", "{", "}", "<su", "p>", "<po", "em>", "<re", "f>", "</", "<b", "r>"]


@pytest.mark.skipif(not (shutil.which("sed") and shutil.which("grep")), reason="needs GNU sed and grep")
def test_clean_sh_equals_gnu_grep_and_sed(tmp_path) -> None:
    """Random lines built from the tokens the rules react to, through the real clean.sh pipeline."""
    version = subprocess.run(["sed", "--version"], capture_output=True, text=True).stdout
    if "GNU" not in version:
        pytest.skip("needs GNU sed")
    rng = random.Random(12345)
    lines = ["".join(rng.choice(PIECES) for _ in range(rng.randrange(0, 12))) for _ in range(30000)]
    # one tag cut open by another: catches any reordering or merging of the substitutions
    tags = [p for p in PIECES if p.startswith(("<", "[[", "</", "}")) and len(p) > 2] + [
        "<sup>", "</sup>", "<BR>", "<nowiki>", "<math>", "</poem>", "<del>", "<small>", "<mapframe a>\\b/>"]
    for _ in range(20000):
        a, b = rng.choice(tags), rng.choice(tags)
        k = rng.randrange(1, len(a))
        lines.append(rng.choice(PIECES) + a[:k] + b + a[k:] + rng.choice(PIECES))
    text = "\n".join(lines) + "\n"
    src = tmp_path / "in.1"
    src.write_bytes(text.encode("utf-8"))
    script = tmp_path / "seds"
    script.write_text("\n".join(SEDS) + "\n")
    cmd = (f"cat {src} | grep -v '^<doc [^>]*>$' | grep -vE '\\[\\[Category:[^][]*\\]\\]' "
           f"| sed -f {script}")
    for locale in ("C", "C.UTF-8"):
        ref = subprocess.run(["bash", "-c", cmd], capture_output=True, env={"LC_ALL": locale, "PATH": "/usr/bin:/bin"},
                             check=True).stdout
        assert clean_sh_text(text).encode("utf-8") == ref, locale
    assert ref.count(b"\n") > 20000 and ref != src.read_bytes()  # most lines kept, many changed
