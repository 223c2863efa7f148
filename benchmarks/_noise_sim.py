"""A seeded simulator of benchmark repetitions, calibrated from real samples
(``compare_noise.py``).

A repetition's latency is ``base · exp(σ·ε + drift·t + jump + shift)``: ε standard
normal (lognormal noise of spread σ), ``t`` the repetition's place in its run from
0 to 1 (a slow drift over the run), ``jump`` a second mode that a share of the
repetitions fall into (a slower core, a frequency step: bimodal), ``shift`` the
level of the whole run, drawn once per run (what changes between two runs minutes
apart on a shared machine). ``calibrate`` estimates each of those from a module's
real runs.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Noise:
    """How one module's repetitions vary (all in log units: 0.02 ~ 2%)."""

    name: str
    sigma: float  # lognormal spread within a run
    drift: float = 0.0  # change of level from a run's first repetition to its last
    mode_share: float = 0.0  # share of repetitions in the second mode
    mode_jump: float = 0.0  # how much slower the second mode is
    run_shift: float = 0.0  # standard deviation of a whole run's level

    def run(self, rng: random.Random, n: int, scale: float = 1.0) -> list[float]:
        """One run of `n` repetitions (base latency 1000 us, times `scale`)."""
        shift = rng.gauss(0.0, self.run_shift) if self.run_shift else 0.0
        out = []
        for i in range(n):
            t = i / (n - 1) if n > 1 else 0.0
            jump = self.mode_jump if rng.random() < self.mode_share else 0.0
            out.append(
                1000.0
                * scale
                * math.exp(rng.gauss(0.0, self.sigma) + self.drift * t + jump + shift)
            )
        return out


def spread(samples: Sequence[float]) -> float:
    """What the targets call a module's spread: standard deviation over mean of its
    repetitions (a coefficient of variation; 0.02 = 2%)."""
    return statistics.stdev(samples) / statistics.fmean(samples)


def calibrate(name: str, runs: Sequence[Sequence[float]]) -> Noise:
    """The noise of a module's real runs: robust spread within runs, the drift over
    a run (median fitted slope), the second mode (repetitions more than 4 spreads
    above the median: their share and typical excess), and the spread of the runs'
    levels beyond what their own noise explains."""
    logs = [[math.log(x) for x in run] for run in runs]
    sigmas, drifts, medians = [], [], []
    above: list[float] = []
    total = 0
    for run in logs:
        med = statistics.median(run)
        sigma = 1.4826 * statistics.median(abs(x - med) for x in run)
        sigmas.append(sigma)
        drifts.append(_slope(run) * (len(run) - 1))
        medians.append(med)
        above += [x - med for x in run if x - med > 4 * max(sigma, 1e-4)]
        total += len(run)
    sigma = statistics.median(sigmas)
    n = statistics.median(len(r) for r in logs)
    level_var = statistics.variance(medians) if len(medians) > 1 else 0.0
    own = (1.2533 * sigma) ** 2 / n
    return Noise(
        name=name,
        sigma=sigma,
        drift=statistics.median(drifts),
        mode_share=len(above) / total,
        mode_jump=statistics.median(above) if above else 0.0,
        run_shift=math.sqrt(max(0.0, level_var - own)),
    )


def _slope(ys: Sequence[float]) -> float:
    n = len(ys)
    if n < 2:
        return 0.0
    mx, my = (n - 1) / 2, statistics.fmean(ys)
    sxx = sum((i - mx) ** 2 for i in range(n))
    return sum((i - mx) * (y - my) for i, y in enumerate(ys)) / sxx


def scenarios() -> list[Noise]:
    """The simulator's fixed scenarios: lognormal spreads from 0.5% to 30%, and at
    spreads of 2% or less a bimodal, a drifting and a run-to-run shifting variant."""
    grid = [Noise(f"lognormal {s:g}%", s / 100) for s in (0.5, 1, 1.5, 2, 3, 5, 8, 10, 20, 30)]
    return grid + [
        Noise("bimodal: 1%, 10% of reps +4%", 0.01, mode_share=0.1, mode_jump=0.04),
        Noise("outliers: 1%, 3% of reps x2", 0.01, mode_share=0.03, mode_jump=math.log(2)),
        Noise("drift: 1.5%, +2% over a run", 0.015, drift=0.02),
        Noise("run shift: 1%, runs move 0.5%", 0.01, run_shift=0.005),
        Noise("run shift: 1%, runs move 2%", 0.01, run_shift=0.02),
    ]
