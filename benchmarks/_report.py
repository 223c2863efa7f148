"""The results as markdown: the machine, one table per benchmark, the targets."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
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


def git_commit() -> str:
    """kiln's commit (the full hash), marked when tracked files differ from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
        # What is measured: kiln's code and the benchmarks' (not earlier results, README).
        dirty = subprocess.run(
            [
                "git",
                "status",
                "--porcelain",
                "--untracked-files=no",
                "--",
                "src",
                "benchmarks",
                ":(exclude)benchmarks/results",
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + (" (with uncommitted changes)" if dirty else "")


def versions() -> dict[str, str]:
    """Column headings naming each peer's version."""
    short = {
        p: ".".join(_version(p).split(".")[:2]) for p in ("ninja", "doit", "iree-base-compiler")
    }
    return {
        "ninja": f"Ninja {short['ninja']}",
        "doit": f"doit {short['doit']}",
        "iree.build": f"iree.build {short['iree-base-compiler']}",
    }


def machine_summary(work: Path) -> str:
    """One line: cores, CPU model and the work directory's filesystem, for the README."""
    fs = filesystem(work).split(" ", 1)[0]
    return f"{os.cpu_count()} cores, {_first_line('/proc/cpuinfo', 'model name')}, outputs on {fs}"


def filesystem(path: Path) -> str:
    """The filesystem ``path`` lies on, from /proc/self/mountinfo: type, source and
    mount point (the longest mount point above it)."""
    real = os.path.realpath(path)
    best = ("", "unknown", "unknown")
    try:
        with open("/proc/self/mountinfo", encoding="utf-8") as f:
            for line in f:
                fields = line.split()
                point = fields[4].replace("\\040", " ")
                rest = fields[fields.index("-") + 1 :]
                inside = real == point or real.startswith(point.rstrip("/") + "/")
                if inside and len(point) >= len(best[0]):
                    best = (point, rest[0], rest[1])
    except (OSError, ValueError, IndexError):
        pass
    return f"{best[1]} ({best[2]}, mounted at {best[0] or '?'})"


def create_cost_us(work: Path, files: int = 10_000) -> float:
    """Microseconds to create one empty file in ``work`` right after as many were
    deleted: what every build system here pays per output on this filesystem
    (ext4 without a journal scans recently deleted inodes on each creation)."""
    d = work / "create-probe"
    d.mkdir(parents=True, exist_ok=True)
    names = [str(d / f"f{i}") for i in range(files)]

    def create() -> float:
        t0 = time.perf_counter()
        for n in names:
            os.close(os.open(n, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644))
        return time.perf_counter() - t0

    create()
    for n in names:
        os.unlink(n)
    spent = create()
    for n in names:
        os.unlink(n)
    d.rmdir()
    return spent / files * 1e6


def machine(work: Path) -> list[str]:
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
        f"- packages: {packages}; kiln at git {git_commit()}",
        f"- load average when the run started: {load} (a shared machine: compare ratios)",
        f"- work directory on {filesystem(work)}: creating each of 10,000 empty files "
        f"right after 10,000 were deleted costs {create_cost_us(work):.0f} µs there",
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
        "| import kiln s | whole process wall s | peak RSS MiB | peak RSS once loaded MiB "
        "| graph + plan bytes per action |",
        "|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|",
    ]
    for a in results:
        p = a.process
        lines.append(
            f"| {a.actions:,} | {len(a.phases)} | {a.median('load_module'):.3f} "
            f"| {a.median('analyze'):.3f} | {a.median('plan'):.3f} | {a.median('total'):.3f} "
            f"| {a.median('import_kiln'):.3f} | {p.wall_s:.3f} | {p.rss_mib:.0f} "
            f"| {a.median('peak_loaded_mib'):.0f} "
            f"| {'—' if a.graph_bytes is None else f'{a.graph_bytes / a.actions:,.0f}'} |"
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
