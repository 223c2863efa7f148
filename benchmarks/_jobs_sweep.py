"""kiln with more and more jobs: the no-op must not depend on ``-j``, and in-process
actions must not get slower as ``-j`` grows.

kiln (py) builds the layered-diamonds graph (``_synthetic.KILN_PY``) in the
directory ``bench_graph`` uses for it (so a graph it already built is reused),
at each ``-j`` of ``jobs``: clean builds (``--no-cache``, output removed first)
and no-op rebuilds, ``runs`` rounds, the ``-j`` values in turn (reversed in every
other round, so drift in the machine's load touches them alike).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from _graph import Graph
from _measure import Series, checked, run_child, say
from _synthetic import KILN_PY, failure, kiln_argv

JOBS = (1, 2, 8, 16, 64)
MODULE = "gen_kiln_py.py"


@dataclass
class JobsResult:
    """``series[scenario][jobs]`` of kiln (py) on ``graph``."""

    graph: Graph
    series: dict[str, dict[int, Series]] = field(default_factory=dict)

    def spread(self, scenario: str) -> float | None:
        """Slowest ÷ fastest median wall time over the ``-j`` values."""
        walls = [s.wall_s for s in self.series.get(scenario, {}).values() if s.samples]
        return max(walls) / min(walls) if len(walls) > 1 else None

    def worst_slowdown(self, scenario: str) -> tuple[float, int, int] | None:
        """(ratio, -j, smaller -j): the largest wall(j) ÷ the fastest wall at any smaller -j."""
        items = [
            (j, s.wall_s) for j, s in sorted(self.series.get(scenario, {}).items()) if s.samples
        ]
        worst: tuple[float, int, int] | None = None
        for i in range(1, len(items)):
            best_j, best = min(items[:i], key=lambda x: x[1])
            ratio = items[i][1] / best
            if worst is None or ratio > worst[0]:
                worst = (ratio, items[i][0], best_j)
        return worst

    def table(self) -> list[str]:
        lines = [
            "| actions | scenario | -j | runs | wall s | CPU s | own CPU s | ÷ fastest -j |",
            "|--:|---|--:|--:|--:|--:|--:|--:|",
        ]
        for scenario, by_jobs in self.series.items():
            walls = [s.wall_s for s in by_jobs.values() if s.samples]
            for j, s in by_jobs.items():
                if not s.samples:
                    continue
                own = "—" if s.own_cpu_s is None else f"{s.own_cpu_s:.2f}"
                lines.append(
                    f"| {self.graph.actions:,} | {scenario} | {j} | {len(s.samples)} "
                    f"| {s.wall_s:.2f} | {s.cpu_s:.2f} | {own} | {s.wall_s / min(walls):.2f} |"
                )
        return lines


def _built(log: Path) -> int | None:
    m = re.search(r"^kiln: \w+: (\d+) built", log.read_text(errors="replace"), re.M)
    return int(m.group(1)) if m else None


def bench_jobs(
    graph: Graph,
    *,
    work: Path,
    runs: int,
    jobs: Sequence[int] = JOBS,
    scenarios: Sequence[str] = ("clean", "no-op"),
    log: Callable[[str], None] = say,
) -> JobsResult:
    """kiln (py) clean and/or no-op builds of ``graph`` at each ``-j`` in ``jobs``."""
    root = work / graph.label / KILN_PY.key
    if not (root / MODULE).is_file():
        KILN_PY.setup(graph, root)
    logs = root / "logs"
    logs.mkdir(exist_ok=True)
    result = JobsResult(
        graph, {s: {j: Series(f"kiln (py) -j {j}") for j in jobs} for s in scenarios}
    )
    # Up to date before the first no-op (untimed; a no-op itself if the graph is built).
    checked(run_child(kiln_argv(MODULE), cwd=root, log=logs / "jobs-setup.log"), "jobs setup")
    for round_ in range(runs):
        order = list(jobs) if round_ % 2 == 0 else list(reversed(jobs))  # drift evens out
        for scenario in scenarios:
            for j in order:
                if scenario == "clean":
                    KILN_PY.clear(root)
                path = logs / f"jobs-{scenario}-j{j}-{round_}.log"
                sample = run_child(kiln_argv(MODULE, j), cwd=root, log=path)
                what = f"kiln (py) {graph.label} {scenario} -j {j}"
                why = failure(sample, KILN_PY, graph, root)
                built = _built(path)
                expected = graph.actions if scenario == "clean" else 0
                if why is None and built != expected:
                    why = f"built {built} actions, not {expected}"
                if why is not None:
                    raise RuntimeError(f"{what}: {why} (log: {path})")
                result.series[scenario][j].samples.append(sample)
                log(f"  {what}: {sample.wall_s:.2f} s wall, {sample.cpu_s:.2f} s CPU")
    return result
