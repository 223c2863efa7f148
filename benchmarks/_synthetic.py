"""The synthetic graph scenarios (clean, no-op, change source 0) for every system,
and kiln's graph analysis alone."""

from __future__ import annotations

import json
import re
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from _graph import (
    Graph,
    change_source,
    write_doit,
    write_iree,
    write_kiln_py,
    write_kiln_sh,
    write_ninja,
    write_sources,
)
from _measure import Sample, Series, checked, run_child, say

SCENARIOS = ("clean", "no-op", "change source 0")
BIN = Path(sys.executable).parent


def _tool(name: str, *module: str) -> list[str]:
    """The console script ``name`` beside the running Python, else ``python -m``."""
    script = BIN / name
    return [str(script)] if script.exists() else [sys.executable, "-m", *module]


def _count_kiln(log: str) -> int | None:
    m = re.search(r"^kiln: \w+: (\d+) built", log, re.M)
    return int(m.group(1)) if m else None


def _count_ninja(log: str) -> int | None:
    return len(re.findall(r"^\[\d+/\d+\]", log, re.M))


def _count_doit(log: str) -> int | None:
    return sum(1 for line in log.splitlines() if line.startswith(".  "))


@dataclass(frozen=True)
class System:
    """How one build system builds the graph in its own directory ``root``."""

    name: str
    key: str
    write: Callable[[Graph, Path], Path]
    argv: Callable[[Path], list[str]]
    outputs: tuple[str, ...]  # what a clean build starts without, relative to root
    final: Callable[[Graph], str]  # a file the build must produce, relative to root
    count: Callable[[str], int | None] = lambda log: None
    timeout_s: float | None = None

    def setup(self, graph: Graph, root: Path) -> None:
        root.mkdir(parents=True, exist_ok=True)
        write_sources(graph, root)
        written = self.write(graph, root)
        if written.suffix == ".py":  # as every later run finds it; in a child, as
            # compiling a big literal would inflate this process (see _launch.py)
            subprocess.run([sys.executable, "-m", "py_compile", str(written)], check=True)

    def clear(self, root: Path) -> None:
        for rel in self.outputs:
            path = root / rel
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)


def _last(graph: Graph, prefix: str) -> str:
    return f"{prefix}n{graph.layers - 1}_{graph.width - 1}.txt"


def kiln_argv(module: str, jobs: int = 2) -> list[str]:
    """``kiln build MODULE -j JOBS`` into ``out``, run from the graph's directory."""
    # --no-cache: kiln's cache would serve every clean round after the first.
    return [
        *_tool("kiln", "kiln"),
        "build",
        module,
        "-j",
        str(jobs),
        "--output-dir",
        "out",
        "--no-cache",
    ]


def _kiln(module: str) -> Callable[[Path], list[str]]:
    return lambda root: kiln_argv(module)


KILN_PY = System(
    "kiln (py)",
    "kiln_py",
    write_kiln_py,
    _kiln("gen_kiln_py.py"),
    ("out",),
    lambda g: _last(g, "out/genfiles/graph/"),
    _count_kiln,
)
KILN_SH = System(
    "kiln (sh)",
    "kiln_sh",
    write_kiln_sh,
    _kiln("gen_kiln_sh.py"),
    ("out",),
    lambda g: _last(g, "out/genfiles/graph/"),
    _count_kiln,
)
NINJA = System(
    "ninja",
    "ninja",
    write_ninja,
    lambda root: [str(BIN / "ninja"), "-j2"],
    ("out", ".ninja_log", ".ninja_deps"),
    lambda g: _last(g, "out/"),
    _count_ninja,
)
DOIT = System(
    "doit",
    "doit",
    write_doit,
    lambda root: [*_tool("doit", "doit"), "-n", "2"],
    ("out",),
    lambda g: _last(g, "out/"),
    _count_doit,
)


def iree_build(timeout_s: float) -> System:
    return System(
        "iree.build",
        "iree",
        write_iree,
        lambda root: [sys.executable, "-m", "iree.build", "gen_iree.py", "--output-dir", "out"],
        ("out",),
        lambda g: _last(g, "out/genfiles/graph/"),
        timeout_s=timeout_s,
    )


KILN_SYSTEMS = ("kiln (py)", "kiln (sh)")


@dataclass
class GraphResult:
    """Every scenario of one graph size: ``series[scenario][system]``."""

    graph: Graph
    affected: int
    series: dict[str, dict[str, Series]] = field(default_factory=dict)


def bench_graph(
    graph: Graph,
    systems: Sequence[System],
    *,
    work: Path,
    runs: int,
    scenarios: Sequence[str] = SCENARIOS,
    slow_iteration_s: float = 60.0,
    log: Callable[[str], None] = say,
) -> GraphResult:
    """Run each system ``runs`` times through ``scenarios``. Each round starts with
    a clean build; without "clean" among ``scenarios`` only the first round
    builds from scratch, untimed.

    Systems alternate within each round, so drift in the machine's load touches
    all of them. A system whose first round takes longer than
    ``slow_iteration_s`` gets at most 3 rounds.
    """
    result = GraphResult(graph, graph.affected_by_source(0))
    for scenario in scenarios:
        result.series[scenario] = {s.name: Series(s.name) for s in systems}
    planned = {s.name: runs for s in systems}
    gave_up: set[str] = set()
    version = 0
    for round_ in range(runs):
        for system in systems:
            if round_ >= planned[system.name] or system.name in gave_up:
                continue
            root = work / graph.label / system.key
            if round_ == 0:
                system.setup(graph, root)
            started = time.perf_counter()
            version += 1
            if not _round(system, graph, root, result, scenarios, round_, version, log):
                gave_up.add(system.name)
                continue
            took = time.perf_counter() - started
            if round_ == 0 and took > slow_iteration_s and runs > 3:
                planned[system.name] = 3
                for scenario in scenarios:
                    result.series[scenario][
                        system.name
                    ].note = f"{runs} runs planned; 3 run (first round took {took:.0f} s)"
    return result


def _round(
    system: System,
    graph: Graph,
    root: Path,
    result: GraphResult,
    scenarios: Sequence[str],
    round_: int,
    version: int,
    log: Callable[[str], None],
) -> bool:
    """One clean / no-op / change sequence; False when the system did not finish.

    Without "clean" among ``scenarios`` only the first round builds from scratch.
    """
    rebuild = "clean" in scenarios or round_ == 0
    if rebuild:
        system.clear(root)
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    for scenario in SCENARIOS:
        timed = scenario in scenarios
        if not timed and not (scenario == "clean" and rebuild):
            continue
        if scenario == "change source 0":
            change_source(root, 0, version)
        path = logs / f"{scenario.replace(' ', '_')}-{round_}.log"
        sample = run_child(system.argv(root), cwd=root, log=path, timeout_s=system.timeout_s)
        what = f"{system.name} {graph.label} {scenario}"
        why = failure(sample, system, graph, root)
        if why is not None:
            log(f"  {what}: {why} (log: {path})")
            if timed:
                series = result.series[scenario][system.name]
                series.timeout_s = system.timeout_s if sample.timed_out else None
                series.failed = not sample.timed_out
                series.note = why
                series.samples.append(sample)
            for other in scenarios:
                if other != scenario and not result.series[other][system.name].note:
                    why = "timed out" if sample.timed_out else "failed"
                    result.series[other][system.name].note = f"not run ({scenario} {why})"
            return False
        if timed:
            _record(result.series[scenario][system.name], sample, system, path)
        log(
            f"  {what}{'' if timed else ' (setup, not timed)'}: {sample.wall_s:.2f} s wall, "
            f"{sample.cpu_s:.2f} s CPU, {sample.rss_mib:.0f} MiB"
        )
    return True


def failure(sample: Sample, system: System, graph: Graph, root: Path) -> str | None:
    """Why a run does not count (timed out, failed, output missing), or None."""
    if sample.timed_out:
        return f"did not finish in {system.timeout_s:g} s"
    if not sample.ok:
        text = sample.log.read_text(errors="replace") if sample.log else ""
        lines = [ln.strip() for ln in text.splitlines() if "rror" in ln or "ailed" in ln]
        return f"failed, exit status {sample.returncode}" + (f": {lines[0]}" if lines else "")
    if not (root / system.final(graph)).is_file():
        return f"failed: {system.final(graph)} was not produced"
    return None


def _record(series: Series, sample: Sample, system: System, log_path: Path) -> None:
    series.samples.append(sample)
    count = system.count(log_path.read_text(errors="replace"))
    if count is not None:
        series.actions_run = count


# -- graph analysis alone ------------------------------------------------------


@dataclass
class AnalysisResult:
    actions: int
    phases: list[dict[str, float]] = field(default_factory=list)  # per run, seconds
    process: Series = field(default_factory=lambda: Series("kiln"))
    graph_bytes: int | None = None  # what the graph and plan hold (tracemalloc)

    def median(self, phase: str) -> float:
        return statistics.median(p[phase] for p in self.phases)


def bench_analysis(
    graph: Graph, *, work: Path, runs: int, log: Callable[[str], None] = say
) -> AnalysisResult:
    """Import the in-process build module, analyse its entrypoint and make the plan,
    in a fresh process each run (the module compiled from source each time: kiln
    writes no bytecode beside it); then once more, untimed, counting the bytes the
    graph and the plan hold."""
    root = work / graph.label / "analysis"
    KILN_PY.setup(graph, root)
    driver = Path(__file__).resolve().parent / "analyze_only.py"
    argv = [sys.executable, str(driver), "gen_kiln_py.py"]
    result = AnalysisResult(graph.actions)
    for i in range(runs):
        path = root / f"analysis-{i}.log"
        sample = checked(run_child(argv, cwd=root, log=path), f"analysis {graph.label}")
        phases = json.loads(path.read_text().strip().splitlines()[-1])
        if phases["actions"] != graph.actions:
            raise RuntimeError(f"analysis planned {phases['actions']} actions, not {graph.actions}")
        result.phases.append(phases)
        result.process.samples.append(sample)
        log(
            f"  analysis {graph.label}: {phases['total']:.2f} s in-process, "
            f"{sample.wall_s:.2f} s wall, {sample.rss_mib:.0f} MiB"
        )
    path = root / "analysis-traced.log"
    checked(
        run_child([*argv[:2], "--traced", *argv[2:]], cwd=root, log=path),
        f"analysis {graph.label} (traced)",
    )
    traced = json.loads(path.read_text().strip().splitlines()[-1])
    result.graph_bytes = traced.get("graph_bytes")
    return result
