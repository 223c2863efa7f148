"""Exact comparison of integer and boolean tensors, for ``verify``.

Integers are never compared through floating point: float64 holds integers
exactly only up to 2**53, so int64 and uint64 values above it that differ would
compare equal. Both arrays are brought to one integer type that holds every value
of both (int64 for signed and narrower unsigned ones, uint64 for unsigned ones,
bool as 0 and 1), and each element's absolute difference is computed in uint64,
where it always fits (two int64 values differ by at most 2**64 - 1) and cannot
overflow (an int8 127 against -128 differs by 255, not by -1). Only uint64 against
a signed type has differences beyond uint64: those are Python integers (slower,
and as exact).

A tolerance (zero unless the build gives one for the dtype) is a float; an element
fails when its difference exceeds it, which for an integer difference is the same
as exceeding its floor, compared exactly.
"""

from __future__ import annotations

from typing import Any

UINT64_LIMIT = 2.0**64  # the first float no uint64 difference reaches


def _common_type(a: Any, b: Any) -> Any:
    """The integer dtype holding every value of both arrays; ``object`` (Python
    integers) for uint64 against a signed type."""
    import numpy as np

    kinds = {a.dtype.kind, b.dtype.kind}
    if kinds <= {"u", "b"}:
        return np.dtype(np.uint64)
    if np.dtype(np.uint64) in (a.dtype, b.dtype):
        return np.dtype(object)
    return np.dtype(np.int64)


def _differences(a: Any, e: Any) -> Any:
    """|a - e| per element, exactly: uint64, or Python integers for ``object``."""
    import numpy as np

    if a.dtype == object:
        return np.abs(a - e)
    # In uint64 arithmetic (modulo 2**64) the larger minus the smaller is the true
    # difference, which lies in [0, 2**64 - 1].
    au, eu = a.astype(np.uint64), e.astype(np.uint64)
    with np.errstate(over="ignore"):
        return np.where(a >= e, au - eu, eu - au)


def exact_errors(actual: Any, expected: Any, rtol: float, atol: float) -> tuple[Any, Any, Any, Any]:
    """(abs differences, the failing elements, rel errors as floats, the flat
    indices worst first: the largest excess over the tolerance, then the largest
    difference) of two integer or boolean arrays of one shape."""
    import numpy as np

    common = _common_type(actual, expected)
    a, e = actual.astype(common), expected.astype(common)
    err = _differences(a, e)
    magnitude = np.abs(expected.astype(np.float64))
    tol = atol + rtol * magnitude
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        rel = np.where(err == 0, 0.0, err.astype(np.float64) / np.maximum(magnitude, 1.0))
    if common.kind == "O":
        bad = np.asarray(err > tol, dtype=bool)  # Python int against float: exact
        return err, bad, rel, np.lexsort(((-err).ravel(), (tol - err).ravel()))
    # Compared with the tolerance's floor, in uint64; none exceeds one of 2**64 or more.
    floor = np.floor(np.minimum(tol, np.nextafter(UINT64_LIMIT, 0))).astype(np.uint64)
    bad = (err > floor) & (tol < UINT64_LIMIT)
    with np.errstate(over="ignore"):
        excess = np.where(bad, err - floor, np.uint64(0))
    # ``~`` reverses uint64 order: ascending on it is descending on the value.
    return err, bad, rel, np.lexsort((~err.ravel(), ~excess.ravel()))
