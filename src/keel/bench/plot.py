"""The bench summary plot: pass rate against the suite's cost, one point per model, as an SVG.

Written by hand (no plotting library): a fixed-size chart with axes, a few ticks and a labelled
circle per model. Input is `Report.model_summary` dictionaries; nothing here reads files or runs.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from xml.sax.saxutils import escape, quoteattr

WIDTH, HEIGHT = 640, 420
LEFT, RIGHT, TOP, BOTTOM = 70, 30, 40, 60
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b")


def plot_svg(summaries: Sequence[Mapping[str, Any]]) -> str:
    """An SVG document: x is the median cost of one run of the suite (USD), y the pass rate."""
    costs = [float(s["cost_usd"]["median"]) for s in summaries]
    top = max(costs, default=0.0)
    x_max = top * 1.15 if top > 0 else 1.0
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(cost: float) -> float:
        return LEFT + plot_w * (cost / x_max)

    def y(rate: float) -> float:
        return TOP + plot_h * (1 - rate)

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
        f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
        "<title>keel bench: pass rate against cost per model</title>",
        f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
        f'<text x="{WIDTH / 2}" y="22" text-anchor="middle" font-size="15">'
        "Pass rate against cost (median run of the suite)</text>",
        f'<line x1="{LEFT}" y1="{TOP + plot_h}" x2="{LEFT + plot_w}" y2="{TOP + plot_h}" '
        'stroke="black"/>',
        f'<line x1="{LEFT}" y1="{TOP}" x2="{LEFT}" y2="{TOP + plot_h}" stroke="black"/>',
    ]
    for i in range(6):
        rate = i / 5
        parts.append(
            f'<line x1="{LEFT - 4}" y1="{y(rate):.1f}" x2="{LEFT + plot_w}" y2="{y(rate):.1f}" '
            'stroke="#ddd"/>'
        )
        parts.append(
            f'<text x="{LEFT - 8}" y="{y(rate) + 4:.1f}" text-anchor="end">{rate:.0%}</text>'
        )
        cost = x_max * i / 5
        parts.append(
            f'<text x="{x(cost):.1f}" y="{TOP + plot_h + 18}" text-anchor="middle">'
            f"${cost:.{_decimals(x_max)}f}</text>"
        )
    parts.append(
        f'<text x="{LEFT + plot_w / 2}" y="{HEIGHT - 18}" text-anchor="middle">'
        "cost of one run of the suite (USD)</text>"
    )
    parts.append(
        f'<text x="18" y="{TOP + plot_h / 2}" text-anchor="middle" '
        f'transform="rotate(-90 18 {TOP + plot_h / 2})">pass rate</text>'
    )
    parts.append('<g class="points">')
    for i, (summary, cost) in enumerate(zip(summaries, costs, strict=True)):
        rate = float(summary["pass_rate"])
        colour = COLOURS[i % len(COLOURS)]
        name = str(summary["model"])
        parts.append(
            f'<circle class="model" data-model={quoteattr(name)} cx="{x(cost):.1f}" '
            f'cy="{y(rate):.1f}" r="6" fill="{colour}"><title>{escape(name)}: {rate:.0%}, '
            f"${cost:.4f}</title></circle>"
        )
        parts.append(
            f'<text x="{x(cost) + 9:.1f}" y="{y(rate) - 8 - 13 * (i % 2):.1f}" '
            f'fill="{colour}">{escape(name)}</text>'
        )
    parts.append("</g>")
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _decimals(x_max: float) -> int:
    return 2 if x_max >= 1 else 4


__all__ = ["plot_svg"]
