"""``kiln compare --measure``'s own loop (``kiln.compare.measure.measure``) on simulated
runs, for ``compare_noise.py``: how often it classes identical modules, and how often it
finds a 5% slowdown, looking at its samples after every round as it does.

Each run of a module is ``REPETITIONS`` repetitions from the simulator, with a level of
its own (the noise's run shift: every run is a process of its own, started seconds
after the last); A and B alternate A B, B A, ... until the loop stops (a class, a
settled within-noise, or 30 rounds). The verdict is the one ``kiln compare`` reports
from what was measured.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from pathlib import Path

from _noise_sim import Noise

from kiln.cli.compare_measure import REPETITIONS
from kiln.compare.builds import Artifact
from kiln.compare.diff import MEASURED, Pools
from kiln.compare.measure import Job, Measured, measure

DEVICE = "cpu:simulated"
_A, _B = "a" * 64, "b" * 64


@dataclass
class MeasureRow:
    """One noise: false classes of identical modules and 5% slowdowns found (counts over
    ``trials`` each), and the runs a side the loop took for the slowdowns."""

    name: str
    sigma: float
    run_shift: float
    trials: int
    false: int
    found: int
    runs_a_side: float


def once(noise: Noise, rng: random.Random, scale_b: float) -> tuple[str, int]:
    """One --measure of a module whose B is ``scale_b`` times A: its class and runs."""
    files = {Path("a"): 1.0, Path("b"): scale_b}

    def runner(file: Path, flags: list[str]) -> list[float]:
        return noise.run(rng, REPETITIONS, files[file])

    job = Job(
        "bin/m.vmfb",
        Artifact("bin/m.vmfb", "built", sha256=_A, target="vmvx", flags=[]),
        Artifact("bin/m.vmfb", "built", sha256=_B, target="vmvx", flags=[]),
        Path("a"),
        Path("b"),
    )
    pools = Pools()
    measure([job], pools, Measured(DEVICE), runner, budget_s=3600.0)
    return pools.compare(_A, _B, DEVICE, MEASURED).verdict, job.runs // 2


def judge_measure(noise: Noise, trials: int, seed: int, slowdown: float) -> MeasureRow:
    rng = random.Random(seed)
    false = sum(once(noise, rng, 1.0)[0] in ("slower", "faster") for _ in range(trials))
    slowed = [once(noise, rng, slowdown) for _ in range(trials)]
    return MeasureRow(
        noise.name,
        noise.sigma,
        noise.run_shift,
        trials,
        false,
        sum(verdict == "slower" for verdict, _ in slowed),
        statistics.fmean(runs for _, runs in slowed),
    )


def measure_table(rows: list[MeasureRow]) -> list[str]:
    trials = rows[0].trials if rows else 0
    return [
        "### kiln compare --measure's loop (simulated runs)",
        "",
        f"Runs of {REPETITIONS} repetitions, each run at its own level (run shift), one "
        "sample a run (its median), A and B interleaved, a look after every round; per 100 "
        f"over {trials} trials: false slower/faster of identical modules / 5% slowdowns "
        "found, and the runs a side it took to find them.",
        "",
        "| noise | sigma | run shift | false | found | runs a side |",
        "|---|--:|--:|--:|--:|--:|",
        *(
            f"| {r.name} | {100 * r.sigma:.1f}% | {100 * r.run_shift:.1f}% | "
            f"{100 * r.false / r.trials:.1f} | {100 * r.found / r.trials:.1f} | "
            f"{r.runs_a_side:.1f} |"
            for r in rows
        ),
        "",
    ]


def measure_targets(rows: list[MeasureRow]) -> list[str]:
    """The issue's targets for the measuring loop: at most 1 false class in 100 in every
    row; a 5% slowdown found 95 times in 100 where the noise within and between runs is
    2% or less."""
    worst = max(rows, key=lambda r: r.false / r.trials)
    tight = [r for r in rows if r.sigma <= 0.02 and r.run_shift <= 0.02]
    weak = [r.name for r in tight if 100 * r.found / r.trials < 95]
    lowest = min((100 * r.found / r.trials for r in tight), default=100.0)
    return [
        f"- --measure, identical modules, at most 1 false class in 100: "
        f"{'met' if 100 * worst.false / worst.trials <= 1 else 'NOT met'} (worst: "
        f"{worst.name}, {100 * worst.false / worst.trials:.1f} in 100)",
        f"- --measure, 5% slowdown found >= 95 in 100 where sigma and run shift <= 2%: "
        f"{'met' if not weak else 'NOT met: ' + ', '.join(weak)} ({len(tight)} such rows; "
        f"the lowest {lowest:.1f} in 100)",
    ]
