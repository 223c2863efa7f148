"""Tensors for checking compiled modules: reading and writing them, generating inputs
from a model's signature, and comparing outputs with per-dtype tolerances.

Plain functions run inside worker processes; numpy and onnx are imported lazily.

Generated inputs are a pure function of (model digest, shapes): the seed is the
first 16 hex digits of the model file's SHA-256, so the IREE run, the onnxruntime
run and the benchmark of one model all see the same values without passing files.
Values: floating inputs uniform in [-1, 1), integer inputs uniform in
[0, INT_HIGH) (small, non-negative: valid as indices and counts), bool inputs
uniform. A dynamic dimension takes its size from ``shapes`` (by input name, a
whole shape, or by symbolic dimension name, one size), else ``DEFAULT_DIM``.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.actions._exact import exact_errors
from kiln.actions._logs import shown_path
from kiln.base.errors import ToolError
from kiln.output_dir.digests import hash_file
from kiln.output_dir.ownership import open_regular

if TYPE_CHECKING:
    import numpy as np

DEFAULT_DIM = 1
INT_HIGH = 4
# (rtol, atol) by dtype name; a comparison uses the looser of the two arrays' dtypes.
DEFAULT_TOLERANCES: dict[str, tuple[float, float]] = {
    "float64": (1e-6, 1e-8),
    "float32": (1e-4, 1e-5),
    "float16": (1e-2, 1e-3),
    "bfloat16": (2e-2, 1e-2),
    "complex128": (1e-6, 1e-8),
    "complex64": (1e-4, 1e-5),
}
FLOAT8_TOLERANCE = (1.25e-1, 6.25e-2)  # float8 variants (ml_dtypes names start "float8")
EXACT = (0.0, 0.0)  # integers, bool, strings
# The dtype names a ``tolerances`` key may be: numpy's numeric names and ml_dtypes'.
TOLERANCE_DTYPES = (
    *DEFAULT_TOLERANCES,
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e4m3b11fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    *(f"{sign}int{bits}" for sign in ("", "u") for bits in (8, 16, 32, 64)),
    "bool",
)


def _short(error: BaseException | str, max_chars: int = 300) -> str:
    text = str(error).strip().splitlines()
    line = " ".join(text[:2]) if text else type(error).__name__
    return line if len(line) <= max_chars else line[: max_chars - 3] + "..."


# --- reading and writing
def _load_tensor_proto(path: str, data: bytes) -> np.ndarray:
    """Read a serialized onnx.TensorProto (the ONNX test-data format; ``data``, read
    from ``path``) as an array."""
    import onnx
    from onnx import numpy_helper

    tensor = onnx.TensorProto()
    tensor.ParseFromString(data)
    if tensor.data_type == onnx.TensorProto.UNDEFINED:
        raise ValueError("not a TensorProto (no data type; a sequence, map or optional?)")
    return numpy_helper.to_array(tensor, base_dir=os.path.dirname(path))


def load_tensor(path: str) -> np.ndarray:
    """Load a tensor from an ONNX TensorProto ``.pb`` file or a numpy ``.npy`` file."""
    import numpy as np

    suffix = Path(path).suffix.lower()
    if suffix not in (".pb", ".npy"):
        raise ToolError(
            f"cannot load tensor {shown_path(path)}: unknown extension (expected .pb or .npy)"
        )
    try:
        # A regular file only (a link to one followed): a FIFO there never blocks.
        with os.fdopen(open_regular(path, follow=True), "rb") as f:
            data = f.read()
        array = (
            _load_tensor_proto(path, data)
            if suffix == ".pb"
            else np.load(io.BytesIO(data), allow_pickle=False)
        )
    except Exception as e:
        raise ToolError(f"cannot load tensor {shown_path(path)}: {_short(e)}") from e
    if not isinstance(array, np.ndarray):
        raise ToolError(f"cannot load tensor {shown_path(path)}: not a single array")
    return array


def save_bundle(path: str, arrays: Sequence[np.ndarray]) -> None:
    """Write several arrays, in order, to one ``.npz`` file (``arr_0``, ``arr_1``...)."""
    import numpy as np

    with open(path, "wb") as f:
        np.savez(f, *arrays)


def load_bundle(path: str) -> list[np.ndarray]:
    """The arrays of a file written by `save_bundle`, in order."""
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as data:
            return [data[f"arr_{i}"] for i in range(len(data.files))]
    except Exception as e:
        raise ToolError(f"cannot load tensors from {shown_path(path)}: {_short(e)}") from e


# --- generating inputs
@dataclass(frozen=True)
class InputSpec:
    """One input of a model: its name, numpy dtype name, and dims (an int, a symbolic
    name, or None for an unnamed dynamic dimension)."""

    name: str
    dtype: str
    dims: tuple[int | str | None, ...]


def normalize_shapes(shapes: Mapping[str, Any] | None) -> dict[str, Any]:
    """``shapes`` as plain JSON-able data (for keys and workers): names to a size
    (a symbolic dimension) or a list of sizes (an input)."""
    items = (shapes or {}).items()
    return {str(k): list(v) if isinstance(v, list | tuple) else v for k, v in items}


def file_seed(path: str) -> int:
    """The generation seed of a model file: its SHA-256's first 64 bits."""
    return int(hash_file(path)[:16], 16)


def resolve_shape(spec: InputSpec, shapes: Mapping[str, Any]) -> list[int]:
    """The concrete shape of ``spec``: ``shapes[name]`` whole, else each dynamic
    dimension from ``shapes[<symbolic name>]`` or `DEFAULT_DIM`."""
    if spec.name in shapes:
        given = shapes[spec.name]
        if not isinstance(given, list | tuple) or len(given) != len(spec.dims):
            raise ToolError(
                f"shapes[{spec.name!r}] = {given!r}: input {spec.name!r} has "
                f"{len(spec.dims)} dimensions {list(spec.dims)}"
            )
        return [int(d) for d in given]
    out = []
    for dim in spec.dims:
        if isinstance(dim, int) and dim >= 0:
            out.append(dim)
        elif isinstance(dim, str) and dim in shapes:
            out.append(int(shapes[dim]))
        else:
            out.append(DEFAULT_DIM)
    return out


def generate_inputs(
    specs: Sequence[InputSpec], seed: int, shapes: Mapping[str, Any]
) -> tuple[list[np.ndarray], dict[str, list[int]]]:
    """Deterministic inputs for ``specs`` (see the module docstring); returns the
    arrays and the shape chosen for each input."""
    import numpy as np

    rng = np.random.default_rng(seed)
    arrays, chosen = [], {}
    for spec in specs:
        shape = resolve_shape(spec, shapes)
        chosen[spec.name] = shape
        dtype = _numpy_dtype(spec.dtype)
        if dtype.kind == "b":
            array = rng.integers(0, 2, size=shape).astype(bool)
        elif dtype.kind in "iu":
            array = rng.integers(0, INT_HIGH, size=shape).astype(dtype)
        elif dtype.kind == "c":
            array = (rng.uniform(-1, 1, shape) + 1j * rng.uniform(-1, 1, shape)).astype(dtype)
        elif dtype.kind == "f" or spec.dtype in ("bfloat16",) or spec.dtype.startswith("float8"):
            array = rng.uniform(-1.0, 1.0, size=shape).astype(dtype)
        else:
            raise ToolError(f"cannot generate values for input {spec.name!r} of type {spec.dtype}")
        arrays.append(np.asarray(array))
    return arrays, chosen


def _numpy_dtype(name: str) -> np.dtype[Any]:
    """The numpy dtype for ``name``, including ml_dtypes' bfloat16 and float8s."""
    import numpy as np

    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes

        found: np.dtype[Any] = np.dtype(getattr(ml_dtypes, name))
        return found


# --- comparing
def tolerance_for(dtype: Any, overrides: Mapping[str, Sequence[float]]) -> tuple[float, float]:
    """(rtol, atol) for one dtype: ``overrides`` by dtype name (``"*"``: any dtype),
    else the default."""
    name = str(dtype)
    key = name if name in overrides else "*" if "*" in overrides else None
    if key is not None:
        rtol, atol = (float(v) for v in overrides[key])
        if not (0 <= rtol < math.inf and 0 <= atol < math.inf):  # NaN fails both
            raise ToolError(f"tolerance for {name} is not a finite number >= 0: {rtol}, {atol}")
        return rtol, atol
    if name in DEFAULT_TOLERANCES:
        return DEFAULT_TOLERANCES[name]
    return FLOAT8_TOLERANCE if name.startswith("float8") else EXACT


def kind_of(dtype: Any) -> str:
    """What a dtype holds, for telling a float output from an int reference:
    ``float`` (ml_dtypes' bfloat16 and float8s too), ``complex``, ``int``, ``bool``,
    ``text``, else the dtype's own name."""
    name, kind = str(dtype), getattr(dtype, "kind", "")
    if kind == "f" or name == "bfloat16" or name.startswith("float8"):
        return "float"
    return {"c": "complex", "i": "int", "u": "int", "b": "bool", "U": "text", "S": "text"}.get(
        kind, name
    )


def _looser(a: tuple[float, float], b: tuple[float, float]) -> tuple[float, float]:
    return max(a[0], b[0]), max(a[1], b[1])


def _errors(actual: Any, expected: Any, rtol: float, atol: float) -> tuple[Any, Any, Any]:
    """Return (abs error, tolerance, rel error) arrays; NaN matches NaN, inf only itself."""
    import numpy as np

    number = np.complex128 if np.iscomplexobj(actual) or np.iscomplexobj(expected) else np.float64
    a, e = actual.astype(number), expected.astype(number)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        err = np.where((a == e) | (np.isnan(a) & np.isnan(e)), 0.0, np.abs(a - e))
        err = np.where(np.isnan(err), np.inf, err)
        tol = np.where(np.isfinite(e), atol + rtol * np.abs(e), 0.0)
        rel = np.where(err == 0, 0.0, err / np.maximum(np.abs(e), np.finfo(np.float64).tiny))
    return err, tol, rel


def compare(
    index: int, actual: Any, expected: Any, overrides: Mapping[str, Sequence[float]]
) -> dict[str, Any]:
    """Compare one output with its expected value, with the tolerance of the looser
    of their dtypes; the record says max abs/rel error, the worst element, pass/fail.
    Integers and booleans are compared exactly in integers (`kiln.actions._exact`;
    their max abs error is an int), floating and complex values in float64."""
    import numpy as np

    rtol, atol = _looser(
        tolerance_for(actual.dtype, overrides), tolerance_for(expected.dtype, overrides)
    )
    record: dict[str, Any] = {
        "index": index,
        "shape": list(actual.shape),
        "expected_shape": list(expected.shape),
        "dtype": str(actual.dtype),
        "expected_dtype": str(expected.dtype),
        "rtol": rtol,
        "atol": atol,
        "max_abs_err": None,
        "max_rel_err": None,
        # The largest share of its tolerance an element used, |a - e| / (atol + rtol|e|)
        # over the finite ones with a tolerance (1.0: all of it): kiln compare's accuracy.
        "tolerance_used": None,
        "worst_index": None,
        "mismatches": 0,
        "passed": False,
        "worst": [],
        "nan": 0,
        "inf": 0,
        "nonfinite_mismatches": 0,
    }
    if actual.shape != expected.shape:
        return record
    if kind_of(actual.dtype) != kind_of(expected.dtype):
        record["kinds_differ"] = True  # a float32 output is never "equal" to a bool reference
        return record
    if kind_of(actual.dtype) in ("int", "bool"):  # exactly, never through floats
        err, bad, rel, order = exact_errors(actual, expected, rtol, atol)
        record["max_abs_err"] = int(err.max()) if err.size else 0
        record["max_rel_err"] = float(rel.max()) if rel.size else 0.0
    else:
        try:
            err, tol, rel = _errors(actual, expected, rtol, atol)
        except (TypeError, ValueError):  # not numbers (strings, objects): compare exactly
            record["passed"] = bool(np.array_equal(actual, expected))
            return record
        bad = err > tol
        finite_err, finite_rel = err[np.isfinite(err)], rel[np.isfinite(rel)]
        record["max_abs_err"] = float(finite_err.max()) if finite_err.size else 0.0
        record["max_rel_err"] = float(finite_rel.max()) if finite_rel.size else 0.0
        weighed = np.isfinite(err) & (tol > 0)
        if weighed.any():
            with np.errstate(over="ignore"):
                used = float((err[weighed] / tol[weighed]).max())
            record["tolerance_used"] = used if np.isfinite(used) else None
        # Worst first: the largest excess over the tolerance, then the largest error.
        order = np.lexsort((-err.ravel(), (tol - err).ravel()))
    record["mismatches"] = int(bad.sum())
    record["passed"] = not bad.any()
    if np.issubdtype(actual.dtype, np.inexact):  # what the output holds that is no number
        record["nan"] = int(np.isnan(actual).sum())
        record["inf"] = int(np.isinf(actual).sum())
        record["nonfinite_mismatches"] = int((bad & ~np.isfinite(err)).sum())
    if order.size:
        record["worst_index"] = [int(i) for i in np.unravel_index(order[0], err.shape)]
    for flat in order[: min(3, record["mismatches"])]:
        at = tuple(int(i) for i in np.unravel_index(flat, err.shape))
        record["worst"].append(
            {"index": list(at), "actual": str(actual[at]), "expected": str(expected[at])}
        )
    return record


def describe(record: dict[str, Any], name: str | None = None) -> str:
    """One readable line about a failing output."""
    head = f"output {record['index']}" + (f" ({name})" if name else "")
    if record["shape"] != record["expected_shape"]:
        return f"{head}: shape {record['shape']} != expected {record['expected_shape']}"
    if record.get("kinds_differ"):
        return (
            f"{head}: the output is {record['dtype']}, the reference {record['expected_dtype']}:"
            " their dtypes hold different kinds of values"
        )
    if record["max_abs_err"] is None:
        return f"{head}: {record['dtype']} values differ from expected {record['expected_dtype']}"
    worst = "; ".join(
        f"{w['index']} got {w['actual']} expected {w['expected']}" for w in record["worst"]
    )
    nonfinite = ""
    if record.get("nonfinite_mismatches"):
        nonfinite = (
            f" ({record['nonfinite_mismatches']} of them NaN or inf where the reference"
            f" differs; the output holds {_nonfinite(record)})"
        )
    rest = " over the finite ones" if nonfinite else ""
    return (
        f"{head} (shape {record['shape']}, {record['dtype']}): {record['mismatches']} elements"
        f" differ{nonfinite}; max abs err{rest} {_number(record['max_abs_err'])}, max rel err"
        f" {record['max_rel_err']:.3g} (rtol {record['rtol']:g}, atol {record['atol']:g});"
        f" worst: {worst}"
    )


def _number(value: float) -> str:
    """An error as a reader wants it: an integer's in full, a float's in 3 digits."""
    return str(value) if isinstance(value, int) else f"{value:.3g}"


def _nonfinite(record: dict[str, Any]) -> str:
    """``2 NaN, 1 inf``: the values of an output that are not numbers."""
    return ", ".join(f"{record[k]} {label}" for k, label in (("nan", "NaN"), ("inf", "inf")))


def compare_all(
    actual: Sequence[Any],
    expected: Sequence[Any],
    overrides: Mapping[str, Sequence[float]],
    names: Sequence[str] = (),
) -> dict[str, Any]:
    """Compare every output: ``{"passed", "outputs": [records], "summary"}``."""
    pairs = enumerate(zip(actual, expected, strict=False))
    records = [compare(i, a, e, overrides) for i, (a, e) in pairs]
    for record in records:
        if record["index"] < len(names):
            record["name"] = names[record["index"]]
    problems = [describe(r, r.get("name")) for r in records if not r["passed"]]
    if len(actual) != len(expected):
        problems.insert(0, f"module returned {len(actual)} outputs, expected {len(expected)}")
    worst = max((r["max_abs_err"] or 0.0 for r in records), default=0.0)
    summary = f"all {len(records)} output(s) match (max abs err {_number(worst)})"
    nonfinite = {k: sum(r.get(k, 0) for r in records) for k in ("nan", "inf")}
    if any(nonfinite.values()):  # matched the reference's own NaN and inf: said so
        summary += f"; the outputs hold {_nonfinite(nonfinite)}, as the reference does"
    return {"passed": not problems, "outputs": records, "summary": "\n".join(problems) or summary}
