"""The latency statistic of ``kiln compare``: is B faster than A, slower, or within noise?

The samples are latencies of one module on one device, A's and B's: a build's
benchmark keeps one per repetition; ``kiln compare --measure`` takes one per run, the
median of its repetitions, since repetitions of one run share the run's state.
The centre is the Hodges–Lehmann estimate of the shift between the logarithms of
B's and A's latencies (the median of all n·m differences ``log b_j - log a_i``),
reported as a ratio; the interval is the distribution-free one that goes with it
(Moses' interval: the order statistics of those differences at the Mann–Whitney
critical values), at 99.5%. That interval holds its level for any shape of noise
when the repetitions are independent, with no resampling, so the result needs no
seed. docs/compare.md ("The statistic")
gives the reasons and the measured false-positive rate and power.

A change is ``slower`` (``faster``) when the whole interval is above (below) 1 and
the ratio is at least ``MIN_EFFECT`` away from 1; otherwise ``within noise``, with
``detectable`` the smallest change the samples could have found: the distance
from the ratio to the farther end of its interval, never under ``MIN_EFFECT``.
"""

from __future__ import annotations

import functools
import math
import numbers
from collections.abc import Sequence
from dataclasses import dataclass

CONFIDENCE = 0.995  # two-sided: a false "slower" at most 0.25% of the time, and "faster"
# --measure looks at its samples after every round and stops at the first class: each
# look is another chance of a false one, so it stops early on a class only at this level,
# which keeps its loop under 1 false class in 100 (measured: at most 0.8); the class it
# reports is still CONFIDENCE's (docs/compare.md, "--measure").
EARLY_CONFIDENCE = 0.9998  # needs 8 samples a side: 2 / C(16, 8) = 0.00016
MIN_EFFECT = 0.02  # changes under 2% are not classed: a shared machine moves that much
EQUIVALENCE = 0.02  # "within noise" is settled once no change over 2% fits the interval
MAX_SIDE = 200  # more repetitions a side are summarised by this many order statistics
_EXACT_PAIRS = 2500  # the exact null distribution of U up to this many pairs


def method_at(confidence: float) -> str:
    """The one-line name of the statistic at ``confidence``."""
    return f"Hodges-Lehmann ratio, {100 * confidence:g}% distribution-free (Mann-Whitney) interval"


METHOD = method_at(CONFIDENCE)

FASTER, SLOWER, NOISE, TOO_FEW = "faster", "slower", "within noise", "too few samples"


@dataclass(frozen=True)
class LatencyVerdict:
    """B's latency over A's, its interval, and the class of the change."""

    ratio: float  # centre estimate of B's latency over A's
    low: float  # lower bound of the interval of that ratio
    high: float  # upper bound
    verdict: str  # "faster" | "slower" | "within noise" | "too few samples"
    detectable: float  # smallest relative change (0.05 = 5%) these samples could have found
    n_a: int
    n_b: int
    method: str  # one-line name of the statistic


def compare_latency(
    a: Sequence[float], b: Sequence[float], confidence: float = CONFIDENCE
) -> LatencyVerdict:
    """Class B's latencies against A's (same unit) at ``confidence``. Deterministic: the
    result does not depend on the order of either side. Raises ``ValueError`` for a
    latency that is not a finite number above zero."""
    if not 0.5 <= confidence < 1.0:
        raise ValueError(f"confidence must be at least 0.5 and below 1, not {confidence!r}")
    xs, ys = _logs(a, "A"), _logs(b, "B")
    method = method_at(confidence)
    n_a, n_b = len(xs), len(ys)
    if not xs or not ys:
        return LatencyVerdict(1.0, 0.0, math.inf, TOO_FEW, math.inf, n_a, n_b, method)
    xs, ys = _thin(sorted(xs)), _thin(sorted(ys))
    diffs = sorted(y - x for x in xs for y in ys)
    centre = _median(diffs)
    k = _critical(len(xs), len(ys), confidence)
    if k == 0:  # even the most extreme ordering is not rare enough at this level
        lo, hi = diffs[0], diffs[-1]
        return _verdict(centre, lo, hi, TOO_FEW, n_a, n_b, method)
    lo, hi = diffs[k - 1], diffs[len(diffs) - k]
    if lo > 0 and centre >= math.log1p(MIN_EFFECT):
        return _verdict(centre, lo, hi, SLOWER, n_a, n_b, method)
    if hi < 0 and centre <= -math.log1p(MIN_EFFECT):
        return _verdict(centre, lo, hi, FASTER, n_a, n_b, method)
    return _verdict(centre, lo, hi, NOISE, n_a, n_b, method)


def stop_measuring(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether ``--measure``, looking at A's and B's samples after a round, has measured
    enough: a class at ``EARLY_CONFIDENCE`` (so that looking every round adds little to
    the false classes of the one look at ``CONFIDENCE`` that ends it), or a within-noise
    verdict that is ``settled``."""
    if compare_latency(a, b, EARLY_CONFIDENCE).verdict in (FASTER, SLOWER):
        return True
    v = compare_latency(a, b)
    return v.verdict == NOISE and settled(v)


def settled(v: LatencyVerdict) -> bool:
    """Whether more repetitions would not change the class: a faster or slower one
    is settled; a within-noise one once its interval leaves no change larger than
    ``EQUIVALENCE`` either way; too few samples never."""
    if v.verdict in (FASTER, SLOWER):
        return True
    if v.verdict == NOISE:
        return v.low >= 1.0 / (1.0 + EQUIVALENCE) and v.high <= 1.0 + EQUIVALENCE
    return False


def _verdict(
    centre: float, lo: float, hi: float, verdict: str, n_a: int, n_b: int, method: str
) -> LatencyVerdict:
    half = max(centre - lo, hi - centre)
    detectable = max(_exp(half) - 1.0, MIN_EFFECT)
    return LatencyVerdict(_exp(centre), _exp(lo), _exp(hi), verdict, detectable, n_a, n_b, method)


def _exp(x: float) -> float:
    """``exp(x)``, infinite past a float's range (latencies 1e-300 against 1e300)."""
    return math.exp(x) if x < 709.0 else math.inf


def _logs(values: Sequence[float], side: str) -> list[float]:
    """The logarithms of one side's latencies; a bad value is a clear error."""
    out: list[float] = []
    for i, value in enumerate(values):
        if not isinstance(value, numbers.Real) or isinstance(value, bool):
            raise ValueError(f"latency {i} of {side} is not a number: {value!r}")
        v = float(value)
        if not math.isfinite(v) or v <= 0:
            raise ValueError(f"latency {i} of {side} must be a finite number above 0, not {v!r}")
        out.append(math.log(v))
    return out


def _thin(xs: list[float]) -> list[float]:
    """At most ``MAX_SIDE`` evenly spaced order statistics of sorted `xs` (all of them
    when fewer): keeps a pooled history of thousands of repetitions fast. Summarising
    a side by its quantiles makes it less variable than a sample, so the interval
    only gets wider (conservative)."""
    n = len(xs)
    if n <= MAX_SIDE:
        return xs
    return [xs[round(i * (n - 1) / (MAX_SIDE - 1))] for i in range(MAX_SIDE)]


def _median(sorted_values: list[float]) -> float:
    n = len(sorted_values)
    mid = n // 2
    if n % 2:
        return sorted_values[mid]
    return (sorted_values[mid - 1] + sorted_values[mid]) / 2


@functools.lru_cache(maxsize=512)
def _critical(n: int, m: int, confidence: float) -> int:
    """The number k of the smallest (and of the largest) pairwise differences that
    fall outside the interval: the largest k with P(U <= k - 1) <= (1 - confidence)/2
    under the null hypothesis, U the Mann–Whitney statistic of samples of sizes n and
    m. Exact up to ``_EXACT_PAIRS`` pairs, then the normal approximation."""
    tail = (1.0 - confidence) / 2
    if n * m <= _EXACT_PAIRS:
        counts = _u_counts(min(n, m), max(n, m))
        total = math.comb(n + m, n)
        cumulative, k = 0, 0
        while k < len(counts):
            cumulative += counts[k]
            if cumulative / total > tail:
                break
            k += 1
        return k
    z = _normal_quantile(1.0 - tail)
    mean, sd = n * m / 2, math.sqrt(n * m * (n + m + 1) / 12)
    return max(0, math.floor(mean - z * sd - 0.5) + 1)


def _u_counts(n: int, m: int) -> list[int]:
    """How many of the C(n+m, n) orderings give U = 0, 1, ..., n·m: the coefficients
    of the Gaussian binomial [n+m choose n]_q = prod_{i=1..n} (1 - q^(m+i)) / (1 - q^i)."""
    size = n * m + 1
    poly = [0] * size
    poly[0] = 1
    for i in range(1, n + 1):
        # multiply by (1 - q^(m+i)), then divide by (1 - q^i) (a running sum with step i)
        for d in range(size - 1, m + i - 1, -1):
            poly[d] -= poly[d - m - i]
        for d in range(i, size):
            poly[d] += poly[d - i]
    return poly


def _normal_quantile(p: float) -> float:
    """The standard normal quantile (stdlib: statistics.NormalDist)."""
    from statistics import NormalDist

    return NormalDist().inv_cdf(p)
