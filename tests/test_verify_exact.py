"""``verify`` compares integers and booleans exactly, in integers: never through
float64, which holds integers exactly only up to 2**53; the max abs error of an
integer output is the exact integer difference, computed without overflow."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import needs
import pytest

np = needs.module("numpy")
onnx = needs.module("onnx")
needs.module("iree.runtime")

from kiln.actions import _tensors  # noqa: E402

pytestmark = pytest.mark.in_process


def _compare(actual: Any, expected: Any, overrides: Any = None) -> dict[str, Any]:
    return _tensors.compare(0, actual, expected, overrides or {})


@pytest.mark.parametrize(
    ("got", "want", "dtype", "error"),
    [
        (2**53, 2**53 + 1, np.int64, 1),  # equal as float64
        (2**62 + 1, 2**62, np.int64, 1),
        (-(2**63), 2**63 - 1, np.int64, 2**64 - 1),  # the widest int64 difference
        (2**64 - 1, 2**64 - 2, np.uint64, 1),
        (2**64 - 1, 0, np.uint64, 2**64 - 1),
        (127, -128, np.int8, 255),  # in int8 arithmetic: -1
        (0, 255, np.uint8, 255),  # in uint8 arithmetic: 1
        (True, False, np.bool_, 1),
    ],
)
def test_integers_differ_exactly(got: int, want: int, dtype: Any, error: int) -> None:
    record = _compare(np.array([7, got], dtype), np.array([7, want], dtype))
    assert not record["passed"] and record["mismatches"] == 1
    assert record["worst_index"] == [1]
    assert type(record["max_abs_err"]) is int and record["max_abs_err"] == error
    assert f"max abs err {error}," in _tensors.describe(record)
    assert json.loads(json.dumps(record))["max_abs_err"] == error  # exact in the result JSON


def test_equal_integers_pass_with_an_integer_error() -> None:
    big = np.array([2**64 - 1, 2**53 + 1], np.uint64)
    same = _tensors.compare_all([big], [big.copy()], {})
    assert same["passed"] and type(same["outputs"][0]["max_abs_err"]) is int
    assert "max abs err 0)" in same["summary"]
    flags = np.array([True, False])
    assert _compare(flags, flags.copy())["passed"]


def test_integers_of_two_dtypes_compare_by_value() -> None:
    # uint64 against int64: a difference beyond uint64, exactly.
    record = _compare(np.array([2**64 - 1], np.uint64), np.array([-(2**63)], np.int64))
    assert not record["passed"] and record["max_abs_err"] == 2**64 - 1 + 2**63
    assert _compare(np.array([2**63 - 1], np.uint64), np.array([2**63 - 1], np.int64))["passed"]
    # A negative int64 is no large uint64 (two's complement: the same bits).
    assert not _compare(np.array([2**64 - 1], np.uint64), np.array([-1], np.int64))["passed"]
    assert _compare(np.array([200], np.uint8), np.array([200], np.int32))["passed"]
    record = _compare(np.array([-3], np.int8), np.array([250], np.uint8))
    assert record["max_abs_err"] == 253


def test_an_integer_tolerance_is_exact_at_its_edge() -> None:
    want = np.array([10, 2**60], np.int64)
    got = want + np.array([0, 3])  # 2**60 + 3 is 2**60 in float64
    record = _compare(got, want, {"int64": (0.0, 2.0)})
    assert not record["passed"] and record["mismatches"] == 1 and record["worst_index"] == [1]
    assert record["max_abs_err"] == 3
    assert _compare(got, want, {"int64": (0.0, 2.99)})["mismatches"] == 1
    assert _compare(got, want, {"int64": (0.0, 3.0)})["passed"]


MODULE = """
@entrypoint
def ints(expected=cl_arg("expected", default="right.npy")):
    mlir = onnx_import(name="addone.mlir", source=source_file("addone.onnx"))
    return [verify(name=f"v{i}.json", module=m, inputs=[source_file("x.npy")],
                   expected=[source_file(expected, name="y.npy")])
            for i, m in enumerate(compile(name="addone", source=mlir))]
"""


def _add_one(folder: Path) -> None:
    """addone.onnx: y = x + 1 in int64; x holds values above 2**53."""
    from onnx import TensorProto, helper, numpy_helper

    one = numpy_helper.from_array(np.array([1], np.int64), "one")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["y"])],
        "addone",
        [helper.make_tensor_value_info("x", TensorProto.INT64, [2])],
        [helper.make_tensor_value_info("y", TensorProto.INT64, [2])],
        initializer=[one],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(folder / "addone.onnx"))
    np.save(folder / "x.npy", np.array([2**53, 2**62], np.int64))
    np.save(folder / "right.npy", np.array([2**53 + 1, 2**62 + 1], np.int64))
    np.save(folder / "wrong.npy", np.array([2**53, 2**62 + 1], np.int64))


def test_verify_fails_an_int64_output_off_by_one_above_2_53(
    kiln: Callable[..., Any], write_module: Callable[..., Path], tmp_path: Path
) -> None:
    _add_one(tmp_path)
    write_module(MODULE)
    right = kiln("build", "build.py", "--target", "cpu", "--no-cache")
    assert right.returncode == 0, right.stderr
    result = json.loads((tmp_path / "kiln-out/genfiles/ints/v0.json").read_text())
    assert result["outputs"][0]["max_abs_err"] == 0
    wrong = kiln("build", "build.py", "--target", "cpu", "--no-cache", "--expected", "wrong.npy")
    assert wrong.returncode == 1, wrong.stderr
    assert "1 elements differ; max abs err 1," in wrong.stderr
    assert f"got {2**53 + 1} expected {2**53}" in wrong.stderr
