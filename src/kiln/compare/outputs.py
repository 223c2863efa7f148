"""The largest difference between what two builds' modules computed on the same
inputs, from the records their verifications kept (``"actual"``: each output's
dtype, shape, SHA-256 and, when small, its values: ``kiln.actions.output_record``)."""

from __future__ import annotations

import json
import math
from typing import Any, TypeGuard

from kiln.actions.output_record import Value, recorded_values
from kiln.observe.report_data import records_at


def largest_difference(
    checks_a: list[dict[str, Any]], checks_b: list[dict[str, Any]]
) -> tuple[float | None, str]:
    """The largest ``|B - A|`` over the outputs of the checks of A and B that ran on the
    same inputs (None with why, when none can be said). One check a side per set of
    inputs: a module computes the same outputs from the same inputs whichever reference
    it is checked against, and a manifest of many checks costs one pass, not a pass
    per pair."""
    in_b: dict[str, dict[str, Any]] = {}
    for cb in checks_b:
        key = inputs_key(cb)
        if key is not None:
            in_b.setdefault(key, cb)
    pairs: dict[str, tuple[dict[str, Any], dict[str, Any]]] = {}
    for ca in checks_a:
        key = inputs_key(ca)
        if key is not None and key in in_b and key not in pairs:
            pairs[key] = (ca, in_b[key])
    if not pairs:
        return None, "no check on the same inputs in both"
    found: list[float] = []
    for ca, cb in pairs.values():
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


def inputs_key(check: dict[str, Any]) -> str | None:
    """What says which inputs a check or a benchmark ran on (given files by name and
    content, or the seed and shapes they were generated with), without where they
    were read, as one text."""
    inputs = check.get("inputs")
    if not isinstance(inputs, dict):
        return None
    which = {k: v for k, v in inputs.items() if k not in _PLACES}
    try:
        return json.dumps(which, sort_keys=True)
    except (TypeError, ValueError, RecursionError):  # not what kiln writes
        return None
