"""What ``kiln compare`` prints: a table for the terminal (regressions first, as wide as
the terminal), or one JSON document (``--json``). Every string that came from a
manifest is escaped for the terminal here (``kiln.base.terminal.printable``)."""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any

from kiln.base.terminal import printable
from kiln.compare.builds import Build
from kiln.compare.diff import Module, Row

_MIN_WIDTH = 60
_MIN_PATH = 16
_HEAD = ("CHANGE", "SIZE", "COMPILE", "LATENCY B/A [interval]", "CLASS", "VERIFY", "MAX |B-A|")
_WIDTHS = (9, 8, 8, 24, 15, 10, 9)  # CLASS: "too few samples", whole


def pct(before: float | None, after: float | None) -> str:
    """``after`` against ``before`` as a signed percentage, or ``-``."""
    if before is None or after is None or before <= 0:
        return "-"
    change = (after - before) / before * 100
    return f"{change:+.1f}%" if abs(change) < 1000 else f"x{after / before:.3g}"


def latency_text(m: Module | None) -> tuple[str, str]:
    """The ratio with its interval, and its class (or why there is none)."""
    if m is None:
        return "-", ""
    v = m.latency
    if v is None:
        return "-", _short_note(m.latency_note)
    high = "inf" if math.isinf(v.high) else f"{v.high:.3f}"
    return f"{v.ratio:.3f} [{v.low:.3f}, {high}]", v.verdict


def _short_note(note: str) -> str:
    if note.startswith("measured on different devices"):
        return "other device"
    if note.startswith("not benchmarked"):
        return "no samples"
    if note.startswith("benchmarked on other inputs"):
        return "other inputs"
    return note


def verify_text(m: Module | None) -> str:
    if m is None or (m.verify_a == "none" and m.verify_b == "none"):
        return "-"
    return m.verify_b if m.verify_a == m.verify_b else f"{m.verify_a}->{m.verify_b}"


def _number(value: float | None) -> str:
    return "-" if value is None else "inf" if math.isinf(value) else f"{value:.3g}"


def render_table(a: Build, b: Build, rows: list[Row], width: int, notes: list[str]) -> str:
    """The table, each line at most ``width`` characters."""
    width = max(width, _MIN_WIDTH)
    kept = len(_WIDTHS)  # columns dropped from the right until the rest fit
    while kept > 3 and width - sum(_WIDTHS[:kept]) - kept < _MIN_PATH:
        kept -= 1
    path_width = max(_MIN_PATH, width - sum(_WIDTHS[:kept]) - kept)
    lines = [
        _fit(f"A: {printable(a.label, one_line=True)} ({a.manifest})", width),
        _fit(f"B: {printable(b.label, one_line=True)} ({b.manifest})", width),
        _fit(_line(("ARTIFACT", *_HEAD), path_width, kept), width),
    ]
    for row in rows:
        m = row.module
        latency, klass = latency_text(m)
        size = pct(m.size_a, m.size_b) if m is not None else "-"
        compile_ = pct(m.compile_a, m.compile_b) if m is not None else "-"
        change = row.change + ("!" if row.flags else "")
        cells = (
            printable(row.path, one_line=True),
            change,
            size,
            compile_,
            latency,
            klass,
            verify_text(m),
            _number(m.output_diff) if m is not None else "-",
        )
        lines.append(_fit(_line(cells, path_width, kept), width))
        for extra in _details(row):
            lines.append(_fit("    " + printable(extra, one_line=True), width))
    lines += [_fit(printable(n, one_line=True), width) for n in notes]
    counts: dict[str, int] = {}
    for row in rows:
        counts[row.change] = counts.get(row.change, 0) + 1
    regressed = sum(1 for r in rows if r.flags)
    said = ", ".join(f"{v} {k}" for k, v in counts.items()) or "no artifacts"
    lines.append(f"{said}; {regressed} with a regression (marked !)")
    return "\n".join(lines)


def _details(row: Row) -> list[str]:
    found = []
    if row.was is not None:
        found.append(f"renamed from {row.was}")
    if row.why:
        found.append(f"why: {row.why}")
    if row.flags:
        found.append("regressed: " + ", ".join(row.flags))
    m = row.module
    if m is not None and m.latency is None and _short_note(m.latency_note) != m.latency_note:
        found.append(m.latency_note)
    if m is not None and (m.err_a is not None or m.err_b is not None):
        said = f"max error against references: A {_number(m.err_a)}, B {_number(m.err_b)}"
        if m.tolerance_used_a is not None or m.tolerance_used_b is not None:
            said += (
                f" (tolerance used: A {_share(m.tolerance_used_a)}, B {_share(m.tolerance_used_b)})"
            )
        found.append(said)
    return found


def _share(used: float | None) -> str:
    return "-" if used is None else f"{100 * used:.0f}%" if used < 100 else "over 100x"


def _line(cells: tuple[str, ...], path_width: int, kept: int = len(_WIDTHS)) -> str:
    path = cells[0]
    if len(path) > path_width:
        path = "..." + path[-(path_width - 3) :]
    parts = [path.ljust(path_width)]
    parts += [c[:w].ljust(w) for c, w in zip(cells[1:], _WIDTHS[:kept], strict=False)]
    return " ".join(parts).rstrip()


def _fit(text: str, width: int) -> str:
    """``text`` on one line of at most ``width`` characters, escaped."""
    text = printable(text, one_line=True)
    return text if len(text) <= width else text[: width - 3] + "..."


def to_json(a: Build, b: Build, rows: list[Row], notes: list[str]) -> dict[str, Any]:
    """``--json``: the builds, and every row with all it holds."""

    def row_json(row: Row) -> dict[str, Any]:
        data = asdict(row)
        m = row.module
        if m is not None and m.latency is not None:
            v = m.latency
            data["module"]["latency"] = {
                **asdict(v),
                "high": None if math.isinf(v.high) else v.high,
                "detectable": None if math.isinf(v.detectable) else v.detectable,
            }
        if m is not None and m.output_diff is not None and math.isinf(m.output_diff):
            data["module"]["output_diff"] = None
            data["module"]["output_note"] = "non-finite values differ"
        return data

    return {
        "a": {"label": a.label, "manifest": str(a.manifest)},
        "b": {"label": b.label, "manifest": str(b.manifest)},
        "rows": [row_json(r) for r in rows],
        "notes": notes,
    }
