"""The README is a map and docs/ is what it points at (issue 32 item 3): the README stays short and starts with the
two commands, every relative link of README.md and docs/*.md reaches a file (and, with a #fragment, a heading
of that file), and docs/benchmarks.svg is what bench/chart.py draws from its figures."""

from __future__ import annotations

import importlib.util
import re
import unicodedata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code (links there are not links)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    return re.sub(r"`[^`\n]*`", "", text)


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (word characters, spaces and hyphens kept),
    spaces to hyphens."""
    heading = re.sub(r"`", "", heading.strip()).lower()
    kept = "".join(c for c in heading if c in " -_" or unicodedata.category(c)[0] in "LN")
    return kept.replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out = set()
    for line in re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S).splitlines():
        m = re.match(r"#{1,6} (.+)", line)
        if m:
            slug = _slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_the_readme_is_a_map_of_at_most_250_lines() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 250, f"README.md has {len(lines)} lines: move detail into docs/"


def test_the_readme_starts_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    block = re.search(r"```bash\n(.*?)```", text, re.S)
    assert block, "no ```bash block in README.md"
    commands = [line.split("#")[0].strip() for line in block.group(1).splitlines() if line.strip()]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(page: Path) -> None:
    bad = []
    for m in LINK.finditer(_prose(page.read_text(encoding="utf-8"))):
        target = m.group(1)
        if re.match(r"[a-z]+:", target):  # https:, mailto: ...
            continue
        file_part, _, fragment = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            bad.append(f"{target}: no such file")
        elif fragment and dest.suffix == ".md" and fragment not in _anchors(dest):
            bad.append(f"{target}: no heading with anchor #{fragment} in {dest.relative_to(ROOT)}")
    assert not bad, f"{page.relative_to(ROOT)}: " + "; ".join(bad)


def test_every_docs_page_is_linked_from_the_readme() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    missing = [p.name for p in PAGES[1:] if f"docs/{p.name}" not in readme]
    assert not missing, f"README.md does not point at {missing}"


def test_the_benchmark_chart_is_what_bench_chart_py_draws() -> None:
    spec = importlib.util.spec_from_file_location("bench_chart", ROOT / "bench" / "chart.py")
    chart = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(chart)
    svg = ROOT / "docs" / "benchmarks.svg"
    assert svg.read_text(encoding="utf-8") == chart.render(), "run: python bench/chart.py"
    assert "benchmarks.svg" in (ROOT / "docs" / "benchmarks.md").read_text(encoding="utf-8")
