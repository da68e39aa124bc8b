"""Draw docs/benchmarks.svg: CPU core-hours for the full MLPerf set, by target.

The figures are those of docs/benchmarks.md: the 4-bin set from "2026-11-28, 10:10-11:20: the writeback that held
the calls" (its 10:59 run of `bench/bench_scale.py --real-part-only`: from CPU time, and from the DAG's stage seconds),
the other targets from "2026-11-28, 12:30-14:00: nvidia-2048 from the padded parts, the shuffle's buffers" (its 13:10
run of `--targets-only`); each step timed with the memory full of page cache as in a full-size run, one real-size part
projected to the full set by tokens, a lower bound, and by rows, an upper bound. The SVG is plain
text written here, with no plotting library, so the same figures always give the same bytes;
tests/test_docs.py checks that the committed file is what this script writes.

    python bench/chart.py            # writes docs/benchmarks.svg
    python bench/chart.py --check    # exit 1 if docs/benchmarks.svg differs from what it would write
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "docs" / "benchmarks.svg"

#: (label, core-hours by tokens, core-hours by rows). The 4-bin set is what every run builds; the others are what
#: each target adds on top of it.
FIGURES: tuple[tuple[str, float, float], ...] = (
    ("samsung-4bins (the default set)", 0.46, 0.50),
    ("+ nvidia-2048", 0.14, 0.23),
    ("+ nvidia-varlength", 0.15, 0.24),
    ("+ nvidia-4320", 0.17, 0.27),
    ("+ nvidia-packed", 0.26, 0.39),
    ("+ habana-packed-raw", 0.41, 0.63),
    ("+ habana-packed", 2.82, 4.44),
)
TITLE = "CPU core-hours for the full MLPerf set, by target"
SUBTITLE = ("bench_scale.py --memory full, 2026-11-28, 2 cores; 4-bin set 10:59 (CPU time to DAG seconds), targets "
            "13:10; bar: by tokens, whisker: by rows")

WIDTH, LEFT, RIGHT, TOP, ROW = 720, 230, 40, 70, 34
SCALE_MAX = 5.0  # core-hours at the right end of the axis


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _x(hours: float) -> float:
    return LEFT + (WIDTH - LEFT - RIGHT) * hours / SCALE_MAX


def render(figures: tuple[tuple[str, float, float], ...] = FIGURES) -> str:
    """The SVG document, as text."""
    height = TOP + ROW * len(figures) + 50
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{height}" '
           f'viewBox="0 0 {WIDTH} {height}" font-family="sans-serif" font-size="13">',
           f"<title>{_esc(TITLE)}</title>",
           f'<rect width="{WIDTH}" height="{height}" fill="#ffffff"/>',
           f'<text x="{WIDTH / 2:.0f}" y="24" text-anchor="middle" font-size="16" font-weight="bold">{_esc(TITLE)}</text>',
           f'<text x="{WIDTH / 2:.0f}" y="44" text-anchor="middle" font-size="11" fill="#555555">{_esc(SUBTITLE)}</text>']
    axis_y = TOP + ROW * len(figures) + 6
    for tick in range(int(SCALE_MAX) + 1):
        x = _x(tick)
        out.append(f'<line x1="{x:.1f}" y1="{TOP - 6}" x2="{x:.1f}" y2="{axis_y}" stroke="#dddddd"/>')
        out.append(f'<text x="{x:.1f}" y="{axis_y + 16}" text-anchor="middle" font-size="11">{tick}</text>')
    out.append(f'<text x="{_x(SCALE_MAX / 2):.1f}" y="{axis_y + 34}" text-anchor="middle" font-size="12">'
               "core-hours (full set: 500 parts, 156.7 M sequences)</text>")
    for i, (label, low, high) in enumerate(figures):
        y = TOP + ROW * i
        colour = "#4c72b0" if i == 0 else "#dd8452"
        out.append(f'<text x="{LEFT - 10}" y="{y + 17}" text-anchor="end">{_esc(label)}</text>')
        out.append(f'<rect x="{LEFT}" y="{y + 4}" width="{_x(low) - LEFT:.1f}" height="{ROW - 12}" fill="{colour}"/>')
        if high > low:
            mid = y + 4 + (ROW - 12) / 2
            out.append(f'<line x1="{_x(low):.1f}" y1="{mid:.1f}" x2="{_x(high):.1f}" y2="{mid:.1f}" '
                       f'stroke="{colour}" stroke-width="2"/>')
            out.append(f'<line x1="{_x(high):.1f}" y1="{y + 8}" x2="{_x(high):.1f}" y2="{y + ROW - 12}" '
                       f'stroke="{colour}" stroke-width="2"/>')
        figure = f"{low:.2f}" if high == low else f"{low:.2f}-{high:.2f}"
        out.append(f'<text x="{_x(high) + 6:.1f}" y="{y + 17}" font-size="11">{figure}</text>')
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT, help="where to write the SVG (default: docs/benchmarks.svg)")
    ap.add_argument("--check", action="store_true", help="only compare: exit 1 if the file differs")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        same = args.out.is_file() and args.out.read_text(encoding="utf-8") == text
        print(f"{args.out}: {'up to date' if same else 'differs from what bench/chart.py writes'}")
        return 0 if same else 1
    args.out.write_text(text, encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
