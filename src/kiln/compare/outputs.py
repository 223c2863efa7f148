"""The largest difference between what two builds' modules computed on the same
inputs, from the records their verifications kept (``"actual"``: each output's
dtype, shape, SHA-256 and, when small, its values: ``kiln.actions.output_record``)."""

from __future__ import annotations

import math
from typing import Any, TypeGuard

from kiln.actions.output_record import Value, recorded_values
from kiln.observe.report_data import records_at


def largest_difference(
    checks_a: list[dict[str, Any]], checks_b: list[dict[str, Any]]
) -> tuple[float | None, str]:
    """The largest ``|B - A|`` over the outputs of the checks of A and B that ran on the
    same inputs (None with why, when none can be said)."""
    pairs = [
        (ca, cb)
        for ca in checks_a
        for cb in checks_b
        if _which_inputs(ca) is not None and _which_inputs(ca) == _which_inputs(cb)
    ]
    if not pairs:
        return None, "no check on the same inputs in both"
    found: list[float] = []
    for ca, cb in pairs:
        outs_a, outs_b = records_at(ca, "actual"), records_at(cb, "actual")
        if not outs_a or not outs_b:
            return None, "outputs not recorded (older manifest)"
        if len(outs_a) != len(outs_b):
            return None, "the modules return different numbers of outputs"
        for oa, ob in zip(outs_a, outs_b, strict=True):
            diff = _difference(oa, ob)
            if isinstance(diff, str):
                return None, diff
            found.append(diff)
    return max(found), ""


def _difference(a: dict[str, Any], b: dict[str, Any]) -> float | str:
    if a.get("shape") != b.get("shape"):
        return "outputs of different shapes"
    same = isinstance(a.get("sha256"), str) and a.get("sha256") == b.get("sha256")
    if same and a.get("dtype") == b.get("dtype"):
        return 0.0
    va, vb = recorded_values(a), recorded_values(b)
    if isinstance(va, str):
        return va
    if isinstance(vb, str):
        return vb
    worst = 0.0
    for x, y in zip(va, vb, strict=True):  # the same shape: the same length
        if _finite(x) and _finite(y):
            worst = max(worst, float(abs(y - x)))  # ints subtract exactly
        elif not _alike(x, y):
            return math.inf
    return worst


def _finite(v: Value) -> TypeGuard[int | float]:
    return v is not None and math.isfinite(v)


def _alike(x: Value, y: Value) -> bool:
    """Two values of which one is not finite: both NaN (or unknown), or the same infinity."""
    if x is None or y is None:
        return x is None and y is None
    return (math.isnan(x) and math.isnan(y)) or x == y


# Where a check's inputs were read (``paths``, ``model``): places, not which inputs.
_PLACES = ("paths", "model")


def _which_inputs(check: dict[str, Any]) -> dict[str, Any] | None:
    """What says which inputs a check ran on (given files by name, or the seed and
    shapes they were generated with), without where they were read."""
    inputs = check.get("inputs")
    if not isinstance(inputs, dict):
        return None
    return {k: v for k, v in inputs.items() if k not in _PLACES}
