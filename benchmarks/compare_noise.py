#!/usr/bin/env python3
"""How well ``kiln compare`` classes latency changes, against asv's and Pinpoint's rules.

    benchmarks/compare_noise.py                    # from the kept samples (about 5 minutes)
    benchmarks/compare_noise.py --collect          # measure the samples again first (~15 min)
    benchmarks/compare_noise.py --record           # keep the results in benchmarks/results/

Real samples (``benchmarks/data/compare_samples.json``, written by ``_noise_samples.py``):
a few zoo models for llvm-cpu and vmvx, each timed by iree-benchmark-module in several
runs of 40 repetitions. Two judgements per module and rule, 2,000 trials each, 10
repetitions a side drawn (seeded) from the runs: identical builds (A and B from two
different runs of the same module: any "slower" or "faster" is false) and a 5%
slowdown (B's repetitions times 1.05: how often "slower" is found). The same trials
again with both sides drawn from one run: how an interleaved measurement (A B B A)
sees it. Then the seeded simulator (``_noise_sim.py``), on fixed scenarios and on
each module's noise as calibrated from its runs. Last, ``kiln compare --measure``'s own
loop on simulated runs (``_noise_measure.py``): it looks after every round, so its
false-class rate is not the statistic's.

The targets (issue 40): identical builds compared 100 times raise a false "slower"
or "faster" at most once; with at most 10 repetitions a side a 5% slowdown is found
at least 95 times in 100 wherever a module's repetitions spread by 2% or less (spread:
standard deviation over mean); elsewhere the result is "within noise" with the
smallest change it could have found. Both are rates, so they are judged per 100 over
many trials: 100 trials count a rate of 95% to within about ±4 points and a false rate
of 0.4% as anything from 0 to 3, which says more about the seed than about the rule.
Not part of the test suite.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from _noise_measure import judge_measure, measure_table, measure_targets  # noqa: E402
from _noise_rules import asv_rule, pinpoint_rule  # noqa: E402
from _noise_samples import DATA  # noqa: E402
from _noise_sim import Noise, calibrate, scenarios, spread  # noqa: E402

from kiln.compare.stats import compare_latency  # noqa: E402

Rule = Callable[[Sequence[float], Sequence[float]], str]
Draw = Callable[[random.Random], tuple[list[float], list[float]]]
SLOWDOWN = 1.05


def _kiln(a: Sequence[float], b: Sequence[float]) -> str:
    return compare_latency(a, b).verdict


RULES: dict[str, Rule] = {
    "kiln": _kiln,
    "asv": asv_rule,
    "asv --factor 1.01": lambda a, b: asv_rule(a, b, factor=1.01),
    "Pinpoint 0.01": pinpoint_rule,
    "Pinpoint 0.001": lambda a, b: pinpoint_rule(a, b, low_threshold=0.001),
}


@dataclass
class Row:
    """One module or scenario: per rule, false classes of identical builds and
    slowdowns found; kiln's typical detectable change and how it classed the rest."""

    name: str
    spread: float
    false: dict[str, int]
    found: dict[str, int]
    detectable: float
    noise_calls: int  # kiln's "within noise" answers to the slowdown


def judge(name: str, draw: Draw, trials: int, seed: int) -> Row:
    """`trials` identical-build and `trials` slowdown comparisons of `draw`'s pairs."""
    rng = random.Random(seed)
    false = dict.fromkeys(RULES, 0)
    found = dict.fromkeys(RULES, 0)
    spreads, detectable, noise_calls = [], [], 0
    for _ in range(trials):
        a, b = draw(rng)
        spreads += [spread(a), spread(b)]
        for rule, f in RULES.items():
            false[rule] += f(a, b) in ("slower", "faster")
        a, b = draw(rng)
        slow = [x * SLOWDOWN for x in b]
        for rule, f in RULES.items():
            found[rule] += f(a, slow) == "slower"
        v = compare_latency(a, slow)
        detectable.append(v.detectable)
        noise_calls += v.verdict == "within noise"
    return Row(
        name, statistics.median(spreads), false, found, statistics.median(detectable), noise_calls
    )


def real_draws(runs: list[list[float]], n: int) -> tuple[Draw, Draw]:
    """Pairs from two different runs, and pairs from one run (disjoint subsets)."""
    pairs = [(i, j) for i in range(len(runs)) for j in range(len(runs)) if i != j]

    def separate(rng: random.Random) -> tuple[list[float], list[float]]:
        i, j = rng.choice(pairs)
        return rng.sample(runs[i], n), rng.sample(runs[j], n)

    def same(rng: random.Random) -> tuple[list[float], list[float]]:
        both = rng.sample(rng.choice(runs), 2 * n)
        return both[:n], both[n:]

    return separate, same


def sim_draw(noise: Noise, n: int) -> Draw:
    return lambda rng: (noise.run(rng, n), noise.run(rng, n))


def speed(seed: int) -> float:
    """Seconds for one compare of 100 modules of 40 repetitions a side."""
    rng = random.Random(seed)
    sides = [([rng.lognormvariate(0, 0.1) for _ in range(40)],) * 2 for _ in range(100)]
    started = time.perf_counter()
    for a, b in sides:
        compare_latency(a, b)
    return time.perf_counter() - started


def _per100(count: int, trials: int) -> str:
    return f"{100 * count / trials:.{0 if trials <= 100 else 1}f}"


def _cells(row: Row, trials: int) -> str:
    pairs = " | ".join(
        f"{_per100(row.false[r], trials)} / {_per100(row.found[r], trials)}" for r in RULES
    )
    return (
        f"| {row.name} | {100 * row.spread:.1f}% | {pairs} | "
        f"{100 * row.detectable:.1f}% | {_per100(row.noise_calls, trials)} |"
    )


def table(title: str, rows: list[Row], trials: int) -> list[str]:
    head = " | ".join(RULES)
    return [
        f"### {title}",
        "",
        f"Each cell, per 100 over {trials} trials: false slower/faster of identical builds "
        "/ 5% slowdowns found.",
        "",
        f"| module | spread | {head} | kiln detectable | kiln within noise |",
        "|---|--:|" + "--:|" * len(RULES) + "--:|--:|",
        *(_cells(r, trials) for r in rows),
        "",
    ]


def targets(rows: list[Row], trials: int) -> list[str]:
    """The issue's two targets as rates per 100, over the given rows."""
    per100 = 100 / trials
    bad_false = [r.name for r in rows if r.false["kiln"] * per100 > 1]
    tight = [r for r in rows if r.spread <= 0.02]
    weak = [r.name for r in tight if r.found["kiln"] * per100 < 95]
    worst = max(r.false["kiln"] for r in rows) / trials
    two_or_more = 1 - (1 - worst) ** 100 - 100 * worst * (1 - worst) ** 99
    lowest = min((r.found["kiln"] for r in tight), default=trials)
    return [
        f"- identical builds, at most 1 false class in 100: "
        f"{'met' if not bad_false else 'NOT met: ' + ', '.join(bad_false)} "
        f"({len(rows)} rows; the worst row {100 * worst:.2f} in 100, so one batch of 100 "
        f"comparisons raises 2 or more {100 * two_or_more:.0f}% of the time)",
        f"- 5% slowdown found >= 95 in 100 where spread <= 2%: "
        f"{'met' if not weak else 'NOT met: ' + ', '.join(weak)} ({len(tight)} such rows; "
        f"the lowest {_per100(lowest, trials)} in 100)",
    ]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--collect", action="store_true", help="measure the real samples again")
    p.add_argument("--record", action="store_true", help="write to benchmarks/results/")
    p.add_argument("--trials", type=int, default=2000, help="per cell (default 2000)")
    p.add_argument("--repetitions", type=int, default=10, help="a side (default 10)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--measure-trials",
        type=int,
        default=2000,
        help="per cell of --measure's loop (default 2000; 0 leaves it out)",
    )
    args = p.parse_args(argv)
    if args.collect:
        from _noise_samples import collect

        collect()
    started = time.monotonic()
    data = json.loads(DATA.read_text(encoding="utf-8"))
    n, trials = args.repetitions, args.trials
    real_sep, real_same, calibrated = [], [], []
    for k, (name, entry) in enumerate(sorted(data["modules"].items())):
        separate, same = real_draws(entry["runs"], n)
        real_sep.append(judge(name, separate, trials, args.seed + k))
        real_same.append(judge(name, same, trials, args.seed + k))
        calibrated.append(calibrate(name, entry["runs"]))
    sim = [judge(s.name, sim_draw(s, n), trials, args.seed) for s in scenarios()]
    cal = [judge(c.name, sim_draw(c, n), trials, args.seed) for c in calibrated]
    # interleaved (A B B A ...): both sides share the run's level, so it cancels
    shared = [dataclasses.replace(c, run_shift=0.0) for c in calibrated]
    cal_shared = [judge(c.name, sim_draw(c, n), trials, args.seed) for c in shared]
    interleaved = [r for r in sim if not r.name.startswith("run shift")]
    loads = [x for e in data["modules"].values() for x in e["load"]]
    looped = (
        [
            judge_measure(noise, args.measure_trials, args.seed + k, SLOWDOWN)
            for k, noise in enumerate([*scenarios(), *calibrated])
        ]
        if args.measure_trials
        else []
    )
    lines = [
        f"# Latency statistic: false classes and power ({datetime.date.today()})",
        "",
        f"Command: `benchmarks/compare_noise.py{' --record' if args.record else ''}`; "
        f"{n} repetitions a side, {trials} trials per cell, seed {args.seed}. Samples: "
        f"`benchmarks/data/compare_samples.json` ({data['date']}, iree-base-runtime "
        f"{data['iree_runtime']}, {data['machine']['cpus']} CPUs shared with other work: "
        f"1-minute load {min(loads):.1f}-{max(loads):.1f} during the runs; "
        f"{data['settings']['repetitions']} repetitions a run, "
        f"{len(next(iter(data['modules'].values()))['runs'])} runs a module). "
        f"Rules: kiln = `kiln.compare.stats`; asv = `asv compare` (median ratio beyond "
        "--factor, default 1.1, and Mann-Whitney p < 0.002); Pinpoint = min(KS, MWU) "
        "p-value at its low threshold (0.01 now, 0.001 earlier).",
        "",
        *table("Real samples, A and B from different runs", real_sep, trials),
        *table("Real samples, A and B from the same run (interleaved)", real_same, trials),
        *table("Simulator, fixed scenarios", sim, trials),
        *table("Simulator, calibrated from each module's runs, separate runs", cal, trials),
        *table("Simulator, calibrated, interleaved (the runs' level shared)", cal_shared, trials),
        "Calibrated noise (log units): "
        + "; ".join(
            f"{c.name}: sigma {c.sigma:.3f}, drift {c.drift:+.3f}, second mode "
            f"{c.mode_share:.2f} at +{c.mode_jump:.2f}, run shift {c.run_shift:.3f}"
            for c in calibrated
        ),
        "",
        "Targets (kiln), over the rows where A and B share the machine's state (real "
        "samples from one run, the simulator without run shifts, calibrated and interleaved):",
        *targets(interleaved + cal_shared + real_same, trials),
        "Over the rows measured in separate runs:",
        *targets(real_sep + [r for r in sim if r not in interleaved] + cal, trials),
        "",
        *(measure_table(looped) if looped else []),
        *(measure_targets(looped) if looped else []),
        "",
        f"A compare of 100 modules of 40 repetitions a side: {speed(args.seed):.3f} s. "
        f"This run: {time.monotonic() - started:.0f} s, 1-minute load "
        f"{os.getloadavg()[0]:.1f}.",
    ]
    text = "\n".join(lines) + "\n"
    print(text)
    out = HERE / "results" if args.record else HERE / "results" / "local"
    out.mkdir(exist_ok=True)
    path = out / f"{datetime.date.today()}-compare-noise.md"
    path.write_text(text, encoding="utf-8")
    print(f"written to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
