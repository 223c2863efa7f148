"""What a check keeps of a module's outputs (``kiln.actions.output_record``), and
reading it back from a manifest that may be damaged or hostile."""

from __future__ import annotations

import base64
import json
import math
from typing import Any

import pytest
from conftest import needs
from hypothesis import given, settings
from hypothesis import strategies as st

np = needs.module("numpy")

from kiln.actions.output_record import (  # noqa: E402
    KEPT_BYTES,
    KEPT_VALUES,
    element_count,
    fingerprint,
    recorded_values,
)
from kiln.compare.outputs import largest_difference  # noqa: E402

DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
          "float16", "float32", "float64"]  # fmt: skip


def _through_json(record: dict[str, Any]) -> dict[str, Any]:
    """The record as a manifest holds it (strict JSON: no NaN literal)."""
    loaded: dict[str, Any] = json.loads(json.dumps(record, allow_nan=False))
    return loaded


def _same(kept: list[Any], array: Any) -> None:
    want = array.ravel().tolist()
    assert len(kept) == len(want)
    for k, w in zip(kept, want, strict=True):
        if isinstance(w, float) and not math.isfinite(w):
            assert (math.isnan(k) and math.isnan(w)) or k == w
        else:
            assert k == w and type(k) is not bool


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size", [0, 1, KEPT_VALUES, KEPT_VALUES + 1, 4000])
def test_every_kept_dtype_reads_back_exactly(dtype: str, size: int) -> None:
    rng = np.random.default_rng(size)
    if dtype == "bool":
        a = rng.integers(0, 2, size).astype(bool)
    elif dtype.startswith("float"):
        a = rng.normal(0, 1e3, size).astype(dtype)
    else:
        info = np.iinfo(dtype)
        a = rng.integers(info.min, info.max, size, dtype=dtype, endpoint=True)
    record = _through_json(fingerprint(a))
    assert ("values" in record) == (size <= KEPT_VALUES)
    kept = recorded_values(record)
    assert not isinstance(kept, str), kept
    _same(kept, a)


def test_int64_above_two_to_the_53_stays_exact() -> None:
    a = np.array([2**62 + 1, 2**62], dtype=np.int64)
    b = np.array([2**62 + 2, 2**62], dtype=np.int64)
    checks_a = [{"inputs": {"source": "given"}, "actual": [_through_json(fingerprint(a))]}]
    checks_b = [{"inputs": {"source": "given"}, "actual": [_through_json(fingerprint(b))]}]
    assert largest_difference(checks_a, checks_b) == (1.0, "")


def test_nan_and_infinity_in_kept_bytes() -> None:
    base = np.arange(300, dtype=np.float32)
    a, b = base.copy(), base.copy()
    a[5] = b[5] = np.nan
    a[7] = b[7] = np.inf
    b[9] += 2
    check = {"inputs": {"source": "generated", "seed": 0}}
    pair = ([{**check, "actual": [fingerprint(a)]}], [{**check, "actual": [fingerprint(b)]}])
    assert largest_difference(*pair) == (2.0, "")
    b[7] = -np.inf  # one infinity for the other: no finite bound
    pair = ([{**check, "actual": [fingerprint(a)]}], [{**check, "actual": [fingerprint(b)]}])
    assert largest_difference(*pair) == (math.inf, "")


def test_an_output_over_the_limit_keeps_no_values() -> None:
    a = np.zeros(KEPT_BYTES // 4 + 1, dtype=np.float32)
    record = fingerprint(a)
    assert "values" not in record and "data" not in record
    assert recorded_values(record) == "outputs differ; too large to keep their values"
    assert "values" not in fingerprint(np.array(["x"]))  # strings: nothing kept


GOOD = fingerprint(np.arange(300, dtype=np.float32))


@pytest.mark.parametrize(
    "damage",
    [
        {"shape": None},
        {"shape": [300.0]},
        {"shape": [True] * 3},
        {"shape": [-300]},
        {"shape": [10**9, 10**9]},
        {"shape": [10**9] * 200_000},  # a product that would take minutes: refused at once
        {"shape": [301]},
        {"dtype": "float128"},
        {"dtype": ["float32"]},
        {"data": "not base64 !"},
        {"data": GOOD["data"][:-8]},
        {"data": 12},
        {"data": "A" * (KEPT_BYTES * 2)},
        {"values": ["1"] * 200, "shape": [200], "data": None},
        {"values": [True] * 200, "shape": [200], "data": None},
        {"values": [1.0] * 299, "data": None},
        {"values": [1.0] * 1000, "shape": [1000], "data": None},
    ],
)
def test_a_damaged_record_says_why_and_never_raises(damage: dict[str, Any]) -> None:
    record = {**GOOD, **damage}
    found = recorded_values(record)
    assert isinstance(found, str) and found, found


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(allow_nan=True, allow_infinity=True, width=32), max_size=700),
    st.sampled_from(["float32", "float64"]),
)
def test_any_floats_read_back(values: list[float], dtype: str) -> None:
    a = np.array(values, dtype=dtype)
    kept = recorded_values(_through_json(fingerprint(a)))
    assert not isinstance(kept, str)
    _same(kept, a)


def test_data_is_little_endian_whatever_the_array() -> None:
    a = np.arange(300, dtype=">i4")  # big-endian in memory
    record = fingerprint(a)
    assert base64.b64decode(record["data"])[:8] == bytes([0, 0, 0, 0, 1, 0, 0, 0])
    assert recorded_values(record) == list(range(300))


def test_element_count_of_hostile_shapes() -> None:
    """Shapes from a record kiln does not trust: refused without computing the product
    of a million large numbers (which took minutes), and a zero dimension is zero."""
    from kiln.actions.bench import sane_shapes

    hostile = [10**9] * 1_000_000
    assert element_count(hostile, 1 << 28) is None
    assert not sane_shapes({"x": hostile})
    assert not sane_shapes({"x": [10**9] * 60})
    assert element_count([0, 10**40], 5) == 0
    assert element_count([2, 3, 4], 24) == 24
    assert element_count([2, 3, 4], 23) is None
    assert element_count([2, True], 99) is None and element_count("2x3", 99) is None
    assert sane_shapes({"x": [2, 3], "y": []})


def _checks(*arrays: Any) -> list[dict[str, Any]]:
    return [
        {"inputs": {"source": "given", "files": ["x.npy"]}, "actual": [fingerprint(a)]}
        for a in arrays
    ]


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        ([np.inf, 1.0], [-np.inf, 1.0], math.inf),
        ([np.nan, 1.0], [np.inf, 1.0], math.inf),
        ([np.nan, 1.0], [np.nan, 2.0], 1.0),
        ([np.inf, 1.0], [np.inf, 3.0], 2.0),
    ],
)
def test_a_small_output_with_nan_or_infinity_is_compared_exactly(
    a: list[float], b: list[float], want: float
) -> None:
    """JSON has no NaN: a small output holding one keeps its bytes, so an infinity
    against a NaN or the other infinity is not read as the same value."""
    record = _through_json(fingerprint(np.array(a, dtype=np.float32)))
    assert "data" in record and "values" not in record
    got = largest_difference(
        _checks(np.array(a, dtype=np.float32)), _checks(np.array(b, dtype=np.float32))
    )
    assert got == (want, "")


@pytest.mark.parametrize("big", [10**400, -(10**30), 2**64])
def test_an_integer_no_dtype_holds_is_refused_not_raised(big: int) -> None:
    from kiln.observe.report_data import number_at

    record = {"dtype": "int64", "shape": [2], "sha256": "0" * 64, "values": [big, 2]}
    found = recorded_values(record)
    assert isinstance(found, str) and "not a number of its dtype" in found
    other = {**record, "sha256": "1" * 64, "values": [1, 2]}
    checks = [{"inputs": {"source": "given"}, "actual": [record]}]
    value, why = largest_difference(checks, [{"inputs": {"source": "given"}, "actual": [other]}])
    assert value is None and why
    assert number_at({"atol": 10**400}, "atol") is None  # too large for a float: no number


def test_many_checks_on_the_same_inputs_are_compared_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A manifest of many checks on one set of inputs: one pair, not every pair (300
    checks a side of 64 KiB outputs took most of an hour)."""
    import kiln.compare.outputs as outputs

    calls = []
    real = outputs._difference
    monkeypatch.setattr(outputs, "_difference", lambda a, b: calls.append(1) or real(a, b))
    a = np.arange(16384, dtype=np.float32)
    checks_a, checks_b = _checks(*[a] * 300), _checks(*[a + 1] * 300)
    assert largest_difference(checks_a, checks_b) == (1.0, "")
    assert len(calls) == 1
