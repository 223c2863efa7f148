"""Other tools' rules for "did B get slower than A", re-implemented from their
published descriptions, to judge the same samples as kiln's statistic
(``compare_noise.py``). Only the part of each rule that classes two sets of
repetitions is here. Each rule returns "slower", "faster" or "same".

asv (airspeed velocity), ``asv compare``: B is marked worse when the ratio of the
medians is above ``--factor`` (default 1.1) *and* ``asv.statistics.is_different``
holds: a two-sided Mann–Whitney U test at p < 0.002 (exact distribution up to 20
a side, else normal; ties broken the least significant way), used when the
samples are large enough for the test to reach that level; otherwise the 99%
confidence intervals of the two medians (order statistics) must not overlap.
(asv widens an unbounded median interval with a Laplace posterior; here an
unbounded interval overlaps, which only makes that fallback more cautious; the
measurements use 10 repetitions a side, where the U test applies.)

Pinpoint (Chromium), ``compare.Compare`` in performance mode: the p-value is the
smaller of a two-sample Kolmogorov–Smirnov test (asymptotic distribution) and a
Mann–Whitney U test (normal approximation, tie and continuity corrected); the
samples are DIFFERENT when it is at most the low threshold: 0.01 in the current
code, 0.001 in the earlier one the issue quotes. DIFFERENT has no direction; its
direction here is the sign of the difference of the medians.
"""

from __future__ import annotations

import bisect
import functools
import math
import statistics
from collections.abc import Sequence

SLOWER, FASTER, SAME = "slower", "faster", "same"


def asv_rule(a: Sequence[float], b: Sequence[float], factor: float = 1.1) -> str:
    """asv compare's mark: '+' (slower), '-' (faster) or none (same)."""
    t1, t2 = statistics.median(a), statistics.median(b)
    if t2 > t1 * factor and _asv_different(a, b):
        return SLOWER
    if t2 < t1 / factor and _asv_different(a, b):
        return FASTER
    return SAME


def pinpoint_rule(a: Sequence[float], b: Sequence[float], low_threshold: float = 0.01) -> str:
    """Pinpoint's DIFFERENT at ``low_threshold``, with the medians' direction."""
    p = min(_ks_p(a, b), _pinpoint_mwu_p(a, b))
    if p > low_threshold:
        return SAME
    return SLOWER if statistics.median(b) > statistics.median(a) else FASTER


# asv ---------------------------------------------------------------------------


def _asv_different(a: Sequence[float], b: Sequence[float], p_threshold: float = 0.002) -> bool:
    p_min = 1 / math.comb(len(a) + len(b), min(len(a), len(b)))
    if p_min < p_threshold:
        return _asv_mwu_p(a, b) < p_threshold
    lo_a, hi_a = _median_ci(a)
    lo_b, hi_b = _median_ci(b)
    return not (hi_a >= lo_b and lo_a <= hi_b)


def _asv_mwu_p(x: Sequence[float], y: Sequence[float]) -> float:
    m, n = len(x), len(y)
    u = sum(1 for xx in x for yy in y if xx > yy)
    ties = sum(1 for xx in x for yy in y if xx == yy)
    if u <= m * n // 2 and u + ties >= m * n // 2:
        ties = m * n // 2 - u
    ux1 = min(u, m * n - u)
    ux2 = min(u + ties, m * n - (u + ties))
    ux = ux1 if ux1 >= ux2 else ux2
    if max(m, n) <= 20:
        counts = _u_counts(m, n)
        total = math.comb(m + n, m)
        p1 = sum(counts[: ux + 1]) / total
        p2 = 1.0 - sum(counts[: m * n - ux + 1]) / total
        return p1 + p2
    z = (ux - m * n / 2) / math.sqrt(m * n * (m + n + 1) / 12)
    return 2 * 0.5 * math.erfc(-z / math.sqrt(2))


def _median_ci(x: Sequence[float], alpha: float = 0.01) -> tuple[float, float]:
    """The order-statistic interval of the median at coverage >= 99% (asv's
    ``quantile_ci``), unbounded where the sample is too small."""
    y = sorted(x)
    n = len(y)
    lo, hi, cdf = -math.inf, math.inf, 0.0
    for k, v in enumerate(y):
        cdf += math.comb(n, k) / 2**n
        if cdf <= alpha / 2:
            lo = v
        if cdf >= 1 - alpha / 2:
            hi = v
            break
    return lo, hi


@functools.lru_cache(maxsize=64)
def _u_counts(m: int, n: int) -> list[int]:
    """Orderings with U = 0..m·n (the recursion asv uses, as a table)."""
    table = [[[1] + [0] * (i * j) for j in range(n + 1)] for i in range(m + 1)]
    for i in range(1, m + 1):
        for j in range(1, n + 1):
            row = [0] * (i * j + 1)
            left, down = table[i][j - 1], table[i - 1][j]
            for u in range(i * j + 1):
                row[u] = (left[u] if u < len(left) else 0) + (down[u - j] if u >= j else 0)
            table[i][j] = row
    return table[m][n]


# Pinpoint ----------------------------------------------------------------------


def _ks_p(x: Sequence[float], y: Sequence[float]) -> float:
    n1, n2 = len(x), len(y)
    xs, ys = sorted(x), sorted(y)
    d = max(abs(bisect.bisect(xs, v) / n1 - bisect.bisect(ys, v) / n2) for v in xs + ys)
    en = math.sqrt(n1 * n2 / (n1 + n2))
    return _kolmogorov_sf((en + 0.12 + 0.11 / en) * d)


def _kolmogorov_sf(y: float) -> float:
    if y < 1.1e-16:
        return 1.0
    total, sign, r = 0.0, 1.0, 1.0
    while True:
        t = math.exp(-2.0 * y * y * r * r)
        total += sign * t
        if t == 0.0 or t / total < 1.1e-16:
            break
        r += 1.0
        sign = -sign
    return min(1.0, max(0.0, 2 * total))


def _pinpoint_mwu_p(x: Sequence[float], y: Sequence[float]) -> float:
    n1, n2 = len(x), len(y)
    ranks = _average_ranks(list(x) + list(y))
    u1 = n1 * n2 + n1 * (n1 + 1) / 2.0 - sum(ranks[:n1])
    u2 = n1 * n2 - u1
    n = n1 + n2
    tie_sum = sum(c**3 - c for c in _tie_counts(list(x) + list(y)))
    t = 1.0 - tie_sum / (n**3 - n)
    if t == 0:
        return 1.0
    sd = math.sqrt(t * n1 * n2 * (n + 1) / 12.0)
    z = (max(u1, u2) - (n1 * n2 / 2.0 + 0.5)) / sd
    return 2 * 0.5 * math.erfc(abs(z) / math.sqrt(2))


def _average_ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _tie_counts(values: list[float]) -> list[int]:
    counts: dict[float, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return list(counts.values())
