"""Write the built-in sample dump ``sample-wiki.xml.bz2`` (deterministic bytes).

    python -m preprocessing.sample.make_sample            # rewrite the packaged file
    python -m preprocessing.sample.make_sample --check    # exit 1 if the packaged file is not what this writes

Every article is original text written for bertpipe (the leads in ``articles.py``) plus body paragraphs
generated here from hand-written sentence patterns with a fixed seed. The dump exercises what the extractor
and the text stages meet in real dumps: templates (incl. ``{{CURRENTYEAR}}`` and parser functions), links,
``<ref>``s, tables, lists, categories, files, comments, entities, redirects, pages outside the main namespace,
and odd Unicode (CJK, accents, Greek final sigma, emoji, RTL scripts, combining marks).
About 50 articles, ~150 KB of wikitext.
"""

from __future__ import annotations

import argparse
import bz2
import hashlib
import random
import sys
from pathlib import Path
from xml.sax.saxutils import escape

from preprocessing.sample import SAMPLE_NAME
from preprocessing.sample.articles import ARTICLES

SEED = 20261122
TIMESTAMP = "2026-01-01T00:00:00Z"

PLACES = ["Lisbon", "Kyoto", "Valparaíso", "Tromsø", "Marrakesh", "Kraków", "Hanoi", "Zanzibar", "Reykjavík",
          "Oaxaca", "São Paulo", "Tbilisi", "Thessaloniki", "Mombasa", "Quebec City", "Chiang Mai"]
PEOPLE = ["Amara Okoye", "Lin Wei", "Jonas Eriksen", "María Fernández", "Yusuf Demir", "Ingrid Holm",
          "Kenji Satō", "Léa Dubois", "Tomasz Nowak", "Priya Raman", "Sione Tupou", "Oksana Bondar"]
ADJ = ["practical", "fragile", "elegant", "noisy", "cheap", "ingenious", "slow", "reliable", "costly", "humble"]
QUALITY = ["durability", "simplicity", "beauty", "low cost", "long history", "usefulness in bad weather"]
SEASONS = ["spring", "summer", "autumn", "winter"]
CENTURIES = ["12th", "14th", "15th", "16th", "17th", "18th", "19th"]
COMMUNITY = ["craftspeople", "farmers", "students", "fishing families", "enthusiasts", "retired engineers"]

# Body sentence patterns: {t} thing, {m} made, {u} use, {mean} meaning, plus the random slots below.
HISTORY = [
    "Records from the {c} century describe the {t} as {a1} but {a2}.",
    "In [[{p1}]], local workshops improved the {t} by changing how {m} were prepared.",
    "A survey published in {y1} counted roughly {n1} examples in regular use.",
    "Dr. {who} argued in {y2} that the {t} had \"changed how ordinary people thought about {u}.\"",
    "The idea spread along trade routes, e.g. through ports such as {p2}, and was known in {p1} by {y1}.",
    "Its name comes from an older word meaning \"{mean}\".",
    "For a long time the {t} was linked with {u}, and guilds guarded the methods closely.",
    "Not everyone welcomed it: some writers called it {a1}, others merely {a2}.",
]
DESCRIPTION = [
    "A typical {t} is made of {m}.",
    "Sizes vary a great deal; one common pattern measures about {{{{convert|{n2}|cm|in}}}} across.",
    "Makers test each piece by hand, because small flaws in the {m} grow with use.",
    "The most important parts are simple, which is why repairs are usually possible with basic tools.",
    "Older examples are often {a1}, whereas newer ones tend to be {a2}.",
    "Its main advantage is its {q}; its main drawback is that it takes skill to use well.",
    "According to {who}, a well-kept {t} can last for {n3} years or more.<ref>{{{{cite journal|last={last}|title=Notes on the {t}|year={y2}}}}}</ref>",
]
CULTURE = [
    "Each {s}, {folk} in {p2} gather to show their work and swap advice.",
    "The {t} appears in songs, proverbs and children's books.",
    "Museums in {p1} and {p2} keep collections that visitors can see for free on the first Sunday of the month.",
    "Some people collect old examples; a rare one sold for ${n4} at auction in {y1}.",
    "Schools use the {t} to teach about {u}, which pupils usually enjoy.",
    "Is the {t} still relevant? Many {folk} think so, and they point to its {q}.",
]


def _fill(rng: random.Random, pattern: str, facts: dict[str, str]) -> str:
    p1, p2 = rng.sample(PLACES, 2)
    a1, a2 = rng.sample(ADJ, 2)
    who = rng.choice(PEOPLE)
    return pattern.format(
        t=facts["thing"], m=facts["made"], u=facts["use"], mean=facts["meaning"], p1=p1, p2=p2, a1=a1, a2=a2,
        who=who, last=who.split()[-1], c=rng.choice(CENTURIES), y1=rng.randint(1850, 1990),
        y2=rng.randint(1900, 2020), n1=f"{rng.randint(2, 90) * 1000:,}", n2=rng.randint(5, 400),
        n3=rng.randint(20, 300), n4=f"{rng.randint(3, 95) * 100:,}", q=rng.choice(QUALITY),
        s=rng.choice(SEASONS), folk=rng.choice(COMMUNITY))


def _paragraph(rng: random.Random, patterns: list[str], facts: dict[str, str], n: int) -> str:
    return " ".join(_fill(rng, p, facts) for p in rng.sample(patterns, n))


def _extras(rng: random.Random, i: int, title: str, facts: dict[str, str]) -> list[str]:
    """Markup that varies from article to article: tables, lists, files, templates, comments."""
    out = []
    if i % 3 == 0:
        out.append("{| class=\"wikitable\"\n|+ Some figures\n! Year !! Count\n|-\n| %d || %d\n|-\n| %d || %d\n|}"  # noqa: UP031
                   % (rng.randint(1900, 1950), rng.randint(10, 99), rng.randint(1960, 2010), rng.randint(100, 999)))
    if i % 4 == 1:
        out.append(f"Uses of the {facts['thing']} include:\n* {facts['use']}\n* teaching\n* decoration\n"
                   "# first, prepare the materials\n# second, check the result")
    if i % 5 == 2:
        out.append(f"[[File:{title.replace(' ', '_')}_example.jpg|thumb|right|A {facts['thing']} in use]]"
                   f"<!-- photo to be replaced --> See also the {{{{lang|fr|{facts['thing']}}}}} "
                   f"in French sources, and [https://example.org/{i} an external page].")
    if i % 6 == 3:
        out.append(f"{{{{#if: {facts['made']} | The {facts['thing']} is made of {facts['made']}. | }}}} "
                   "Prices are quoted in euros&nbsp;(€) and in pounds (&pound;).")
    if i % 7 == 4:
        out.append("{{Infobox thing\n| name = %s\n| made = %s\n}}" % (title, facts["made"]))  # noqa: UP031
    return out


def article_text(i: int, title: str, lead: str, facts: dict[str, str]) -> str:
    rng = random.Random(SEED + i)
    parts = [lead]
    parts += _extras(rng, i, title, facts)
    parts.append("== History ==\n" + _paragraph(rng, HISTORY, facts, 5))
    parts.append(_paragraph(rng, HISTORY, facts, 3))
    parts.append("== Description ==\n" + _paragraph(rng, DESCRIPTION, facts, 5))
    parts.append("=== In culture ===\n" + _paragraph(rng, CULTURE, facts, 4))
    parts.append("== References ==\n{{reflist}}\n\n[[Category:%s]]\n[[Category:Sample articles]]" % facts["cat"])  # noqa: UP031
    return "\n\n".join(parts)


SPECIAL_PAGES = [  # (title, ns, text, redirect target)
    ("Template:Nowrap", 10, "<span style=\"white-space:nowrap\">{{{1}}}</span><noinclude>Keeps text on one line.</noinclude>", None),
    ("Template:Lang", 10, "<span lang=\"{{{1}}}\">''{{{2}}}''</span>", None),
    ("Template:Convert", 10, "{{{1}}}&nbsp;{{{2}}}", None),
    ("Template:Reflist", 10, "<references />", None),
    ("Template:Cite book", 10, "''{{{title}}}'' ({{{year|n.d.}}})", None),
    ("Template:Cite journal", 10, "{{{last}}}, \"{{{title}}}\" ({{{year}}})", None),
    ("Template:Infobox thing", 10, "{| class=\"infobox\"\n! {{{name}}}\n|-\n| Made of || {{{made}}}\n|}", None),
    ("Template:Sample footer", 10, "This sample article was written for bertpipe in {{CURRENTYEAR}}.", None),
    ("Category:Sample articles", 14, "Articles of the bertpipe built-in sample.", None),
    ("Talk:Lighthouse", 1, "Should we add more about keepers? ~~~~", None),
    ("User:Sample editor", 2, "I write sample articles.", None),
    ("File:Lighthouse_example.jpg", 6, "A drawing of a lighthouse.", None),
    ("Lighthouses", 0, "#REDIRECT [[Lighthouse]]", "Lighthouse"),
    ("Bike", 0, "#REDIRECT [[Bicycle]]", "Bicycle"),
    ("Greek letters", 0, "#REDIRECT [[Greek alphabet]]", "Greek alphabet"),
]


def _page(title: str, ns: int, page_id: int, text: str, redirect: str | None) -> str:
    red = f'    <redirect title="{escape(redirect, {chr(34): "&quot;"})}" />\n' if redirect else ""
    return (f"  <page>\n    <title>{escape(title)}</title>\n    <ns>{ns}</ns>\n    <id>{page_id}</id>\n{red}"
            f"    <revision>\n      <id>{1000 + page_id}</id>\n      <timestamp>{TIMESTAMP}</timestamp>\n"
            "      <contributor>\n        <username>bertpipe</username>\n        <id>1</id>\n      </contributor>\n"
            "      <model>wikitext</model>\n      <format>text/x-wiki</format>\n"
            f"      <text xml:space=\"preserve\">{escape(text, {chr(34): '&quot;'})}</text>\n"
            "    </revision>\n  </page>\n")


SITEINFO = """<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/" version="0.10" xml:lang="en">
  <siteinfo>
    <sitename>bertpipe sample</sitename>
    <dbname>samplewiki</dbname>
    <base>https://sample.bertpipe.invalid/wiki/Main_Page</base>
    <generator>bertpipe make_sample.py</generator>
    <case>first-letter</case>
    <namespaces>
      <namespace key="0" case="first-letter" />
      <namespace key="1" case="first-letter">Talk</namespace>
      <namespace key="2" case="first-letter">User</namespace>
      <namespace key="6" case="first-letter">File</namespace>
      <namespace key="10" case="first-letter">Template</namespace>
      <namespace key="14" case="first-letter">Category</namespace>
      <namespace key="828" case="first-letter">Module</namespace>
    </namespaces>
  </siteinfo>
"""


def sample_xml() -> str:
    """The whole dump as text: templates and other namespaces first, articles interleaved with redirects."""
    pages = []
    specials = iter(SPECIAL_PAGES)
    for title, ns, text, redirect in SPECIAL_PAGES[:8]:
        pages.append(_page(title, ns, 10 + len(pages), text, redirect))
        next(specials)
    for i, (title, lead, facts) in enumerate(ARTICLES):
        text = article_text(i, title, lead, facts)
        if i % 10 == 7:
            text += "\n\n{{Sample footer}}"
        pages.append(_page(title, 0, 100 + i, text, None))
        if i % 7 == 6 and (extra := next(specials, None)):
            pages.append(_page(extra[0], extra[1], 10 + len(pages), extra[2], extra[3]))
    for title, ns, text, redirect in specials:
        pages.append(_page(title, ns, 10 + len(pages), text, redirect))
    return SITEINFO + "".join(pages) + "</mediawiki>\n"


def sample_bytes() -> bytes:
    """The compressed dump (bz2 output depends only on its input and level: same bytes everywhere)."""
    return bz2.compress(sample_xml().encode("utf-8"), compresslevel=9)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--check", action="store_true", help="only compare with the packaged file")
    p.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / SAMPLE_NAME)
    args = p.parse_args(argv)
    data = sample_bytes()
    if args.check:
        same = args.out.is_file() and args.out.read_bytes() == data
        print(f"{args.out}: {'up to date' if same else 'DIFFERS from make_sample.py output'}")
        return 0 if same else 1
    args.out.write_bytes(data)
    print(f"md5 {hashlib.md5(data).hexdigest()}: put it in SAMPLE_MD5 (preprocessing/sample/__init__.py)")
    print(f"wrote {args.out}: {len(data)} bytes ({len(sample_xml().encode()):,} bytes of XML, {len(ARTICLES)} articles)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
