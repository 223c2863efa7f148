"""The results as markdown: the machine, one table per benchmark, the targets."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from _measure import Series, run_child
from _synthetic import KILN_SYSTEMS, AnalysisResult, GraphResult
from _zoo import ZooResult

ROOT = Path(__file__).resolve().parent.parent


def _first_line(path: str, prefix: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                if line.startswith(prefix):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _git() -> str:
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT,
                              capture_output=True, text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"],
                               cwd=ROOT, capture_output=True, text=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" (with uncommitted changes)" if dirty else "")  # fmt: skip


def machine() -> list[str]:
    mem_kib = _first_line("/proc/meminfo", "MemTotal").split()[0]
    ram = f"{int(mem_kib) / 1024**2:.1f} GiB" if mem_kib.isdigit() else "unknown"
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    packages = ", ".join(
        f"{p} {_version(p)}" for p in ("kiln", "ninja", "doit", "iree-base-compiler")
    )
    floor = run_child(["true"]).rss_mib
    return [
        f"- CPU: {_first_line('/proc/cpuinfo', 'model name')}, {os.cpu_count()} cores; "
        f"RAM {ram}; {platform.platform()}",
        f"- Python {platform.python_version()} ({sys.executable})",
        f"- packages: {packages}; kiln at git {_git()}",
        f"- load average when the run started: {load} (a shared machine: compare ratios)",
        f"- peak RSS is measured from a small launcher; `true` reads as {floor:.1f} MiB, the "
        "floor of that column",
    ]


def _cell(series: Series | None, attr: str, digits: int = 2) -> str:
    if series is None or not series.samples:
        return "—"
    if series.timeout_s is not None:
        return f"> {series.timeout_s:g}" if attr == "wall_s" else "—"
    if series.failed:
        return "failed" if attr == "wall_s" else "—"
    return f"{getattr(series, attr):.{digits}f}"


def _ratio(kiln: Series | None, peer: Series) -> str:
    if kiln is None or not kiln.samples or not peer.samples or peer.failed:
        return "—"
    if kiln.timeout_s is not None or kiln.failed:
        return "—"
    if peer.timeout_s is not None:
        return f"< {kiln.wall_s / peer.timeout_s:.3f}"
    return f"{kiln.wall_s / peer.wall_s:.2f}"


def graph_table(results: Sequence[GraphResult]) -> list[str]:
    lines = [
        "| graph | scenario | system | runs | wall s | CPU s | peak RSS MiB | actions run "
        "| kiln (py) ÷ this | kiln (sh) ÷ this | note |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|---|",
    ]
    for r in results:
        for scenario, by_system in r.series.items():
            kiln_py, kiln_sh = (by_system.get(k) for k in KILN_SYSTEMS)
            for name, s in by_system.items():
                is_kiln = name in KILN_SYSTEMS
                ratios = ("", "") if is_kiln else (_ratio(kiln_py, s), _ratio(kiln_sh, s))
                actions = "" if s.actions_run is None else str(s.actions_run)
                lines.append(
                    f"| {r.graph.label} ({r.graph.actions:,}) | {scenario} | {name} "
                    f"| {len(s.samples)} | {_cell(s, 'wall_s')} | {_cell(s, 'cpu_s')} "
                    f"| {_cell(s, 'rss_mib', 0)} | {actions} | {ratios[0]} | {ratios[1]} "
                    f"| {s.note} |"
                )
    return lines


def analysis_table(results: Sequence[AnalysisResult]) -> list[str]:
    lines = [
        "| actions | runs | load module s | analyze s | plan s | definition + plan s "
        "| import kiln s | whole process wall s | peak RSS MiB |",
        "|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for a in results:
        p = a.process
        lines.append(
            f"| {a.actions:,} | {len(a.phases)} | {a.median('load_module'):.3f} "
            f"| {a.median('analyze'):.3f} | {a.median('plan'):.3f} | {a.median('total'):.3f} "
            f"| {a.median('import_kiln'):.3f} | {p.wall_s:.3f} | {p.rss_mib:.0f} |"
        )
    return lines


def zoo_table(result: ZooResult) -> list[str]:
    n = len(result.models)
    lines = [
        "| models | scenario | system | runs | wall s | CPU s | peak RSS MiB | .vmfb present "
        "| kiln ÷ iree.build | note |",
        "|--:|---|---|--:|--:|--:|--:|--:|--:|---|",
    ]
    for scenario, by_system in result.series.items():
        kiln, upstream = by_system["kiln"], by_system["iree.build"]
        for name, s in by_system.items():
            ratio = _ratio(kiln, upstream) if name == "iree.build" else ""
            lines.append(
                f"| {n} | {scenario} | {name} | {len(s.samples)} | {_cell(s, 'wall_s')} "
                f"| {_cell(s, 'cpu_s')} | {_cell(s, 'rss_mib', 0)} | {s.actions_run}/{n} "
                f"| {ratio} | {s.note} |"
            )
    return lines


@dataclass
class Target:
    name: str
    measured: str
    goal: str
    met: bool | None  # None: not measured
    margin: str

    def row(self) -> str:
        verdict = {True: "met", False: "**missed**", None: "not measured"}[self.met]
        return f"| {self.name} | {self.measured} | {self.goal} | {verdict} | {self.margin} |"


def _get(results: Sequence[GraphResult], actions: int, scenario: str, system: str) -> Series | None:
    for r in results:
        if r.graph.actions == actions:
            s = r.series.get(scenario, {}).get(system)
            if s is not None and s.samples and s.timeout_s is None and not s.failed:
                return s
    return None


def _upper(name: str, value: float | None, limit: float, unit: str = " s") -> Target:
    if value is None:
        return Target(name, "—", f"≤ {limit:g}{unit}", None, "")
    margin = f"{value / limit:.2f}× the limit"
    return Target(name, f"{value:.3f}{unit}", f"≤ {limit:g}{unit}", value <= limit, margin)


def targets(
    graphs: Sequence[GraphResult],
    analysis: Sequence[AnalysisResult],
    zoo: ZooResult | None,
    proportional_tolerance: float = 1.25,
) -> list[str]:
    rows: list[Target] = []
    noop = _get(graphs, 10_000, "no-op", "kiln (py)")
    clean = _get(graphs, 10_000, "clean", "kiln (py)")
    rows.append(_upper("10k no-op, kiln (py)", noop.wall_s if noop else None, 0.3))
    noop_sh = _get(graphs, 10_000, "no-op", "kiln (sh)")
    if noop_sh is not None:
        rows.append(_upper("10k no-op, kiln (sh)", noop_sh.wall_s, 0.3))
    rows.append(_upper("10k clean, in-process actions", clean.wall_s if clean else None, 2.0))
    sh, ninja = _get(graphs, 10_000, "clean", "kiln (sh)"), _get(graphs, 10_000, "clean", "ninja")
    if sh is not None and ninja is not None:
        r = sh.wall_s / ninja.wall_s
        rows.append(Target("10k clean, subprocess actions vs Ninja", f"{sh.wall_s:.2f} s vs "
                           f"{ninja.wall_s:.2f} s", "≤ Ninja", r <= 1.0, f"{r:.2f}× Ninja"))
    else:
        rows.append(Target("10k clean, subprocess actions vs Ninja", "—", "≤ Ninja", None, ""))
    for system in KILN_SYSTEMS:
        rows.append(_proportional(graphs, system, proportional_tolerance))
    by_size = {a.actions: a for a in analysis}
    big, small = by_size.get(100_000), by_size.get(10_000)
    rows.append(_upper("100k analysis (definition + plan)",
                       big.median("total") if big else None, 3.0))  # fmt: skip
    if big and small:
        r = big.median("total") / small.median("total")
        rows.append(Target("analysis linear: 100k ÷ 10k time", f"{r:.1f}×", "≤ 12×", r <= 12,
                           f"{r / 12:.2f}× the limit"))  # fmt: skip
    else:
        rows.append(Target("analysis linear: 100k ÷ 10k time", "—", "≤ 12×", None, ""))
    rows += _zoo_targets(zoo)
    return [
        "| target | measured | goal | verdict | margin |",
        "|---|---|---|---|---|",
        *(t.row() for t in rows),
    ]


def _proportional(graphs: Sequence[GraphResult], system: str, tolerance: float) -> Target:
    name = f"10k change source 0 ∝ affected actions, {system}"
    r = next((g for g in graphs if g.graph.actions == 10_000), None)
    clean, noop, change = (_get(graphs, 10_000, s, system) for s in
                           ("clean", "no-op", "change source 0"))  # fmt: skip
    if r is None or clean is None or noop is None or change is None:
        return Target(name, "—", "", None, "")
    share = r.affected / r.graph.actions
    expected = noop.wall_s + (clean.wall_s - noop.wall_s) * share
    ratio = change.wall_s / expected
    return Target(
        name,
        f"{change.wall_s:.2f} s for {r.affected:,} affected",
        f"≈ no-op + clean work × {share:.3f} = {expected:.2f} s (±{tolerance - 1:.0%})",
        ratio <= tolerance,
        f"{ratio:.2f}× expected",
    )


def _zoo_targets(zoo: ZooResult | None) -> list[Target]:
    if zoo is None:
        return [Target("zoo clean ≤ 0.8× iree.build", "—", "", None, ""),
                Target("zoo no-op ≤ 1/30 iree.build", "—", "", None, "")]  # fmt: skip
    n = len(zoo.models)
    kc, uc = zoo.series["clean"]["kiln"], zoo.series["clean"]["iree.build"]
    kn, un = zoo.series["no-op"]["kiln"], zoo.series["no-op"]["iree.build"]
    rc, rn = kc.wall_s / uc.wall_s, kn.wall_s / un.wall_s
    return [
        Target(f"zoo ({n} models) clean vs iree.build", f"{kc.wall_s:.2f} s vs {uc.wall_s:.2f} s",
               "≤ 0.8×", rc <= 0.8, f"{rc:.2f}× upstream"),
        Target(f"zoo ({n} models) no-op vs iree.build", f"{kn.wall_s:.2f} s vs {un.wall_s:.2f} s",
               "≤ 1/30 (0.033×)", rn <= 1 / 30, f"{rn:.3f}× upstream"),
    ]  # fmt: skip
