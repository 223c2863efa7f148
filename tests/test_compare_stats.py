"""kiln.compare.stats: the latency statistic of ``kiln compare`` (docs/compare.md,
"The statistic"): its classes, its interval, and what it refuses."""

from __future__ import annotations

import math
import random
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.compare.stats import (
    MIN_EFFECT,
    LatencyVerdict,
    compare_latency,
    settled,
    stop_measuring,
)

latency = st.floats(min_value=1e-3, max_value=1e6, allow_nan=False, allow_infinity=False)
side = st.lists(latency, min_size=1, max_size=30)


def lognormal(seed: int, n: int, sigma: float, scale: float = 1.0) -> list[float]:
    rng = random.Random(seed)
    return [1000.0 * scale * math.exp(rng.gauss(0.0, sigma)) for _ in range(n)]


def test_a_clear_slowdown_is_slower_and_a_speedup_faster() -> None:
    a = lognormal(1, 10, 0.02)
    b = lognormal(2, 10, 0.02, scale=1.10)
    v = compare_latency(a, b)
    assert v.verdict == "slower"
    assert v.low > 1.0 and v.low <= v.ratio <= v.high
    assert 1.05 < v.ratio < 1.15
    assert (v.n_a, v.n_b) == (10, 10)
    assert compare_latency(b, a).verdict == "faster"
    assert settled(v)


def test_five_percent_at_two_percent_spread_is_found() -> None:
    found = sum(
        compare_latency(lognormal(s, 10, 0.02), lognormal(1000 + s, 10, 0.02, 1.05)).verdict
        == "slower"
        for s in range(40)
    )
    # about 96%, near the limit of 10 a side (docs/compare.md); a 99.8% interval finds 35
    assert found >= 36


def test_identical_distributions_are_within_noise() -> None:
    calls = [
        compare_latency(lognormal(s, 10, 0.05), lognormal(500 + s, 10, 0.05)).verdict
        for s in range(60)
    ]
    assert calls.count("within noise") >= 59


def test_within_noise_states_what_it_could_have_found() -> None:
    a, b = lognormal(3, 10, 0.30), lognormal(4, 10, 0.30, scale=1.05)
    v = compare_latency(a, b)
    assert v.verdict == "within noise"
    # the interval holds 1, and detectable reaches from the ratio to its far end
    assert v.low <= 1.0 <= v.high
    far = max(v.high / v.ratio, v.ratio / v.low) - 1
    assert v.detectable == pytest.approx(far)
    assert v.detectable > 0.05
    assert not settled(v)


def test_identical_samples() -> None:
    a = lognormal(5, 12, 0.01)
    v = compare_latency(a, list(a))
    assert v.verdict == "within noise"
    assert v.ratio == pytest.approx(1.0)
    assert v.low < 1.0 < v.high


def test_constant_samples() -> None:
    v = compare_latency([10.0] * 10, [10.0] * 10)
    assert (v.verdict, v.ratio, v.low, v.high) == ("within noise", 1.0, 1.0, 1.0)
    assert v.detectable == pytest.approx(MIN_EFFECT)  # the minimum effect, never 0
    assert settled(v)
    slower = compare_latency([10.0] * 10, [11.0] * 10)
    assert slower.verdict == "slower" and slower.ratio == pytest.approx(1.1)
    # a change under the minimum effect is not classed, however sure
    assert compare_latency([10.0] * 10, [10.15] * 10).verdict == "within noise"


@pytest.mark.parametrize(("n_a", "n_b"), [(0, 10), (10, 0), (1, 1), (5, 5), (4, 6), (3, 8)])
def test_too_few_samples(n_a: int, n_b: int) -> None:
    a, b = [1.0 + i / 100 for i in range(n_a)], [2.0 + i / 100 for i in range(n_b)]
    v = compare_latency(a, b)
    assert v.verdict == "too few samples"
    assert (v.n_a, v.n_b) == (n_a, n_b)
    assert not settled(v)


def test_six_against_five_is_enough_for_a_clear_change() -> None:
    """The smallest samples a 99.5% interval can class: 5 and 6 (1 ordering in 462)."""
    a = [1.0 + i / 1000 for i in range(5)]
    b = [2.0 + i / 1000 for i in range(6)]
    assert compare_latency(a, b).verdict == "slower"
    assert compare_latency(b, a).verdict == "faster"


def test_six_a_side_is_enough_for_a_clear_change() -> None:
    a = [1.0 + i / 1000 for i in range(6)]
    assert compare_latency(a, [x * 2 for x in a]).verdict == "slower"


def test_huge_outliers_do_not_move_the_class() -> None:
    a = lognormal(6, 10, 0.01)
    b = lognormal(7, 10, 0.01)
    b[3] *= 1000.0
    b[7] = 1e9
    v = compare_latency(a, b)
    assert v.verdict == "within noise"
    assert v.ratio < 1.02
    slow = [x * 1.2 for x in lognormal(8, 10, 0.01)]
    slow[0] *= 1e6  # an outlier the same way as the change
    fast_a = list(a)
    fast_a[2] = 1e-6
    assert compare_latency(fast_a, slow).verdict == "slower"
    # one outlier against the change, in 10: rank-based, it can only blur the call
    slow[1] = 1e-6
    assert compare_latency(a, slow).verdict in ("slower", "within noise")


@pytest.mark.parametrize(
    "bad", [math.nan, math.inf, -math.inf, 0.0, -0.0, -1.0, -1e-300, "fast", "12.5", None, True]
)
def test_bad_values_are_refused(bad: object) -> None:
    good = [1.0] * 10
    with pytest.raises(ValueError, match="latency 4 of B"):
        compare_latency(good, [*good[:4], bad, *good[5:]])  # type: ignore[list-item]
    with pytest.raises(ValueError, match="latency 0 of A"):
        compare_latency([bad, *good], good)  # type: ignore[list-item]


def test_ints_and_tiny_values_are_numbers() -> None:
    assert compare_latency([1] * 10, [2] * 10).verdict == "slower"
    tiny = [5e-324 * (1 + i) for i in range(10)]  # subnormal, still above zero
    assert compare_latency(tiny, tiny).verdict == "within noise"


def test_many_repetitions_are_fast_and_conservative() -> None:
    a, b = lognormal(9, 5000, 0.05), lognormal(10, 5000, 0.05, scale=1.05)
    v = compare_latency(a, b)
    assert v.verdict == "slower" and (v.n_a, v.n_b) == (5000, 5000)
    assert compare_latency(a, lognormal(11, 3000, 0.05)).verdict == "within noise"


def test_a_hundred_modules_in_well_under_a_second() -> None:
    import time

    sides = [(lognormal(s, 40, 0.1), lognormal(s + 1, 40, 0.1)) for s in range(100)]
    started = time.process_time()  # CPU time: the machine may be busy with other work
    for a, b in sides:
        compare_latency(a, b)
    assert time.process_time() - started < 0.5


def test_method_is_named() -> None:
    v = compare_latency([1.0] * 10, [1.0] * 10)
    assert "Hodges-Lehmann" in v.method and "99.5%" in v.method
    assert isinstance(v, LatencyVerdict)


@settings(max_examples=200, deadline=None)
@given(side, side)
def test_swapping_sides_inverts_ratio_and_class(a: list[float], b: list[float]) -> None:
    v, w = compare_latency(a, b), compare_latency(b, a)
    assert w.ratio == pytest.approx(1 / v.ratio, rel=1e-9)
    assert w.low == pytest.approx(1 / v.high, rel=1e-9)
    assert w.high == pytest.approx(1 / v.low, rel=1e-9)
    swap = {"slower": "faster", "faster": "slower"}
    assert w.verdict == swap.get(v.verdict, v.verdict)
    assert w.detectable == pytest.approx(v.detectable, rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(side, side, st.floats(min_value=1e-3, max_value=1e3))
def test_a_common_unit_does_not_matter(a: list[float], b: list[float], k: float) -> None:
    v = compare_latency(a, b)
    w = compare_latency([x * k for x in a], [x * k for x in b])
    assert w.ratio == pytest.approx(v.ratio, rel=1e-9)
    assert w.low == pytest.approx(v.low, rel=1e-9)
    assert w.high == pytest.approx(v.high, rel=1e-9)
    centre = abs(math.log(v.ratio))
    edges = (abs(centre - math.log1p(MIN_EFFECT)), abs(math.log(v.low)), abs(math.log(v.high)))
    if min(edges) > 1e-9:  # not on a boundary of the classes, where rounding may tip it
        assert w.verdict == v.verdict


@settings(max_examples=100, deadline=None)
@given(side, side, st.randoms(use_true_random=False))
def test_deterministic_whatever_the_order(
    a: list[float], b: list[float], rng: random.Random
) -> None:
    v = compare_latency(a, b)
    assert compare_latency(a, b) == v
    shuffled_a, shuffled_b = list(a), list(b)
    rng.shuffle(shuffled_a)
    rng.shuffle(shuffled_b)
    assert compare_latency(shuffled_a, shuffled_b) == v


@settings(max_examples=200, deadline=None)
@given(side, side)
def test_interval_holds_the_ratio(a: list[float], b: list[float]) -> None:
    v = compare_latency(a, b)
    assert 0 < v.low <= v.ratio <= v.high < math.inf
    assert v.detectable >= MIN_EFFECT
    if v.verdict == "slower":
        assert v.low > 1.0 and v.ratio >= 1 + MIN_EFFECT
    if v.verdict == "faster":
        assert v.high < 1.0 and v.ratio <= 1 / (1 + MIN_EFFECT)


def test_confidence_out_of_range_is_refused() -> None:
    for bad in (0.0, 0.3, 1.0, 1.5, math.nan):
        with pytest.raises(ValueError, match="confidence"):
            compare_latency([1.0, 2.0], [1.0, 2.0], bad)
    assert "99.9%" in compare_latency([1.0], [2.0], 0.999).method


def test_measure_stops_early_on_a_class_only_at_the_stricter_level() -> None:
    """Six or seven runs a side, all of B's above all of A's, is a class at 99.5%
    (p = 0.0022, 0.0006) but not at 99.98%: looking after every round, --measure goes
    on; at eight it stops."""
    for n in (6, 7):
        a, b = [100.0 + i for i in range(n)], [150.0 + i for i in range(n)]
        assert compare_latency(a, b).verdict == "slower"
        assert not stop_measuring(a, b)
    assert stop_measuring([100.0 + i for i in range(8)], [150.0 + i for i in range(8)])
    # within noise and tight enough: stops; within noise and wide: goes on
    level = [1000.0 * (1 + i / 10000) for i in range(30)]
    assert stop_measuring(level, list(reversed(level)))
    assert not stop_measuring(lognormal(1, 8, 0.2), lognormal(2, 8, 0.2))


def _measure_with(levels: dict[str, list[list[float]]], max_rounds: int = 30) -> Any:
    """Runs kiln.compare.measure.measure on a runner that hands out `levels`' runs of
    each side in turn (A's from file "a", B's from "b")."""
    from pathlib import Path

    from kiln.compare.builds import Artifact
    from kiln.compare.diff import MEASURED, Pools
    from kiln.compare.measure import Job, Measured, measure

    runs = {side: iter(rs) for side, rs in levels.items()}
    order: list[str] = []

    def runner(file: Path, flags: list[str]) -> list[float]:
        order.append(file.name)
        return next(runs[file.name])

    art_a = Artifact("bin/m.vmfb", "built", sha256="a" * 64, target="vmvx", flags=[])
    art_b = Artifact("bin/m.vmfb", "built", sha256="b" * 64, target="vmvx", flags=[])
    job = Job("bin/m.vmfb", art_a, art_b, Path("a"), Path("b"))
    pools, measured = Pools(), Measured("cpu:test")
    measure([job], pools, measured, runner, budget_s=600.0, max_rounds=max_rounds)
    verdict = pools.compare("a" * 64, "b" * 64, "cpu:test", MEASURED)
    return job, order, verdict, pools.samples[("a" * 64, "cpu:test", MEASURED)]


def test_measure_counts_a_run_as_one_sample_its_median() -> None:
    """Repetitions of one run share the run's state: a run whose level moved by chance
    would, counted one repetition at a time, look like a change. Each run is one
    sample (its median); A and B alternate A B, B A."""
    a_runs = [[100.0 + i, 100.5 + i, 300.0] for i in range(30)]  # one outlier a run
    b_runs = [[200.0 + i, 200.5 + i, 201.0 + i] for i in range(30)]
    job, order, verdict, samples_a = _measure_with({"a": a_runs, "b": b_runs})
    assert order[:4] == ["a", "b", "b", "a"]
    assert job.done and job.runs == 16  # eight runs a side: the first that can stop early
    assert samples_a == [100.5 + i for i in range(8)]  # medians, the outliers gone
    assert verdict.verdict == "slower" and (verdict.n_a, verdict.n_b) == (8, 8)


def test_measure_is_not_fooled_by_runs_whose_level_moves() -> None:
    """A and B the same module: each run sits at its own level (a run shift of 20%)
    with repetitions 0.1% apart. Counted by repetition, two runs a side already
    'differed'; counted by run, the measurement goes on and finds no class."""
    rng = random.Random(7)

    def runs() -> list[list[float]]:
        out = []
        for _ in range(30):
            level = 1000.0 * math.exp(rng.gauss(0.0, 0.2))
            out.append([level * (1 + i / 1000) for i in range(3)])
        return out

    for _ in range(20):
        job, _, verdict, _ = _measure_with({"a": runs(), "b": runs()})
        assert verdict.verdict == "within noise" and job.runs == 60, (verdict, job.runs)


@pytest.mark.parametrize(("n_a", "n_b"), [(4, 8), (3, 12), (5, 6)])
def test_the_fewest_samples_that_can_class_a_change(n_a: int, n_b: int) -> None:
    """docs/compare.md: 5 against 6 is enough, 4 needs 8 on the other side, 3 needs 12;
    one fewer on the larger side is too few."""

    def sides(n: int, m: int) -> tuple[list[float], list[float]]:
        return [1.0 + i / 100 for i in range(n)], [2.0 + i / 100 for i in range(m)]

    assert compare_latency(*sides(n_a, n_b)).verdict == "slower"
    assert compare_latency(*sides(n_a, n_b - 1)).verdict == "too few samples"
