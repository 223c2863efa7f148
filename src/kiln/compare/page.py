"""``kiln compare --html``: the comparison as one static page, in the style of ``kiln
report``'s (no network: inline CSS and SVG). Each module's latency ratio B/A and its
interval are drawn on a log scale around 1; every string from a manifest is escaped."""

from __future__ import annotations

import html
import math

from kiln.compare.builds import Build
from kiln.compare.diff import Row
from kiln.compare.table import latency_text, pct, verify_text

_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
main{max-width:1200px;margin:0 auto;padding:16px 24px}
h1{font-size:20px}h2{font-size:16px;margin-top:28px}h3{font-size:15px}
table{border-collapse:collapse;width:100%;background:#fff}
td,th{border-bottom:1px solid #e3e6ea;padding:4px 8px;text-align:left;vertical-align:top}
tr.regressed td{background:#fdecec}.why{color:#5b6475;font-size:12px}
svg text{font:12px system-ui,sans-serif;fill:#1d2330}
"""
_COLOURS = {"slower": "#c62828", "faster": "#2e7d32", "within noise": "#607d8b"}
_ROW_H, _LEFT, _PLOT_W = 22, 320, 560
_CLAMP = (1 / 8, 8.0)  # the chart's widest span of ratios


def _e(value: object) -> str:
    return html.escape(str(value), quote=True)


def render_page(a: Build, b: Build, rows: list[Row], notes: list[str]) -> str:
    parts = [
        "<!doctype html><html lang='en'><head><meta charset='utf-8'>",
        f"<title>kiln compare: {_e(a.label)} vs {_e(b.label)}</title><style>{_CSS}</style>",
        "</head><body><main>",
        "<h1>kiln compare</h1>",
        _body(a, b, rows, notes),
        "</main></body></html>\n",
    ]
    return "\n".join(parts)


def report_section(a: Build, b: Build, rows: list[Row], notes: list[str]) -> str:
    """The comparison as a section of ``kiln report``'s page (its own small style:
    the report's sets none of the rows' classes)."""
    return "\n".join(
        [
            "<section id='comparison'><h2>Compared with the build before</h2>",
            "<style>tr.regressed td{background:#fdecec}.why{color:#5b6475;font-size:12px}"
            "svg text{font:12px system-ui,sans-serif;fill:#1d2330}</style>",
            _body(a, b, rows, notes),
            "</section>",
        ]
    )


def _body(a: Build, b: Build, rows: list[Row], notes: list[str]) -> str:
    return "\n".join(
        [
            f"<p>A: {_e(a.label)} ({_e(a.manifest)})<br>B: {_e(b.label)} ({_e(b.manifest)})</p>",
            "<h3>Latency, B over A (log scale)</h3>",
            chart(rows),
            "<h3>Artifacts</h3>",
            _table(rows),
            "".join(f"<p class='why'>{_e(n)}</p>" for n in notes),
        ]
    )


def chart(rows: list[Row]) -> str:
    """An SVG with a row per module that has a latency verdict: its interval as a
    bar, its ratio as a dot, and a line at 1 (no change)."""
    shown = [r for r in rows if r.module is not None and r.module.latency is not None]
    if not shown:
        return "<p id='latency-chart' data-modules='0'>{none}</p>"
    finite = [
        v
        for r in shown
        for v in (r.module.latency.low, r.module.latency.high)  # type: ignore[union-attr]
        if math.isfinite(v) and v > 0
    ]
    lo = max(_CLAMP[0], min([*finite, 1.0]) / 1.1)
    hi = min(_CLAMP[1], max([*finite, 1.0]) * 1.1)
    span = math.log(hi) - math.log(lo)

    def x(value: float) -> float:
        value = min(max(value, lo), hi) if math.isfinite(value) and value > 0 else hi
        return _LEFT + (math.log(value) - math.log(lo)) / span * _PLOT_W

    height = _ROW_H * len(shown) + 30
    out = [
        f"<svg id='latency-chart' data-modules='{len(shown)}' xmlns='http://www.w3.org/2000/svg'"
        f" width='{_LEFT + _PLOT_W + 20}' height='{height}' role='img'>",
        f"<line x1='{x(1.0):.1f}' x2='{x(1.0):.1f}' y1='0' y2='{height - 20}' stroke='#999'/>",
    ]
    for tick in (0.5, 0.8, 0.9, 1.0, 1.1, 1.25, 2.0):
        if lo <= tick <= hi:
            out.append(
                f"<text x='{x(tick):.1f}' y='{height - 5}' text-anchor='middle'>{tick:g}</text>"
            )
    for i, row in enumerate(shown):
        v = row.module.latency  # type: ignore[union-attr]
        assert v is not None
        y = _ROW_H * i + 14
        colour = _COLOURS.get(v.verdict, "#999")
        name = row.path if len(row.path) <= 44 else "..." + row.path[-41:]
        out.append(
            f"<g class='ratio' data-path='{_e(row.path)}' data-verdict='{_e(v.verdict)}' "
            f"data-ratio='{v.ratio:.6g}'><title>{_e(row.path)}: {v.ratio:.3f} "
            f"[{v.low:.3f}, {v.high:.3f}] {_e(v.verdict)}</title>"
            f"<text x='{_LEFT - 8}' y='{y + 4}' text-anchor='end'>{_e(name)}</text>"
            f"<line x1='{x(v.low):.1f}' x2='{x(v.high):.1f}' y1='{y}' y2='{y}' "
            f"stroke='{colour}' stroke-width='4'/>"
            f"<circle cx='{x(v.ratio):.1f}' cy='{y}' r='5' fill='{colour}'/></g>"
        )
    out.append("</svg>")
    return "\n".join(out)


def _table(rows: list[Row]) -> str:
    head = (
        "<table id='rows'><tr><th>Artifact</th><th>Change</th><th>Size</th><th>Compile</th>"
        "<th>Latency B/A</th><th>Class</th><th>Verify</th><th>Max |B-A|</th></tr>"
    )
    body = []
    for row in rows:
        m = row.module
        latency, klass = latency_text(m)
        why = f"<div class='why'>{_e(row.why)}</div>" if row.why else ""
        diff = "" if m is None or m.output_diff is None else f"{m.output_diff:.3g}"
        body.append(
            f"<tr class='{'regressed' if row.flags else ''}' data-change='{_e(row.change)}'>"
            f"<td>{_e(row.path)}{why}</td><td>{_e(row.change)}</td>"
            f"<td>{_e(pct(m.size_a, m.size_b) if m else '-')}</td>"
            f"<td>{_e(pct(m.compile_a, m.compile_b) if m else '-')}</td>"
            f"<td>{_e(latency)}</td><td>{_e(klass)}</td><td>{_e(verify_text(m))}</td>"
            f"<td>{_e(diff)}</td></tr>"
        )
    return head + "".join(body) + "</table>"
