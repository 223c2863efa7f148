"""What a check keeps of each output a compiled module computed, and reading it back.

A verification's result records, per output, ``{"dtype", "shape", "sha256"}`` and,
when the output is small enough, its values: ``"values"`` (a list of finite numbers,
at most ``KEPT_VALUES`` of them, integers exact) or ``"data"`` (its bytes,
little-endian, base64, at most ``KEPT_BYTES`` of them; also a small output that holds
a NaN or an infinity, which JSON cannot spell: records of an older kiln wrote null).
``kiln compare`` reads them back from a manifest, which is untrusted input:
``recorded_values`` checks every field and returns why it cannot, never raises.
"""

from __future__ import annotations

import base64
import binascii
import math
import struct
from typing import Any

KEPT_VALUES = 256  # an output of at most this many elements keeps its values, readable
KEPT_BYTES = 64 << 10  # a larger one of at most this many bytes keeps them as its bytes
# The dtypes whose values are kept, and their struct codes (little-endian).
_CODES = {
    "bool": "?",
    "int8": "b",
    "uint8": "B",
    "int16": "h",
    "uint16": "H",
    "int32": "i",
    "uint32": "I",
    "int64": "q",
    "uint64": "Q",
    "float16": "e",
    "float32": "f",
    "float64": "d",
}
_MAX_RANK = 64  # no tensor kiln keeps has more dimensions
Value = int | float | None  # None: a NaN or an infinity, in an older record's ``values``


def _little_endian(array: Any) -> Any:
    """``array`` as a contiguous numpy array of little-endian bytes: the same bytes on
    any machine (no copy when it is one already)."""
    import numpy as np

    a = np.ascontiguousarray(array)
    return a.astype(a.dtype.newbyteorder("<"), copy=False)


def tensor_sha256(array: Any) -> str:
    """The SHA-256 of ``array``'s bytes, little-endian (a record's ``sha256``), hashed
    where they lie: a large input is not copied to be hashed."""
    import hashlib

    return hashlib.sha256(_little_endian(array).data).hexdigest()


def fingerprint(array: Any) -> dict[str, Any]:
    """The record of one output (a numpy array, or what converts to one); its SHA-256
    is of its bytes little-endian (``tensor_sha256``)."""
    import numpy as np

    a = _little_endian(array)
    found: dict[str, Any] = {
        "dtype": str(a.dtype),
        "shape": list(a.shape),
        "sha256": tensor_sha256(a),
    }
    if str(a.dtype) not in _CODES:
        return found
    readable = a.dtype.kind != "f" or bool(np.isfinite(a).all())  # JSON has no NaN
    if a.size <= KEPT_VALUES and readable:
        # Python numbers; ints exact, where floats would round an int64 above 2**53
        found["values"] = (
            a.ravel().tolist() if a.dtype.kind == "f" else [int(v) for v in a.ravel().tolist()]
        )
    elif a.nbytes <= KEPT_BYTES:
        found["data"] = base64.b64encode(a.tobytes()).decode("ascii")
    return found


def element_count(shape: Any, limit: int) -> int | None:
    """How many elements a tensor of ``shape`` (read from a record kiln does not
    trust) holds; None when ``shape`` is not a list of at most 64 whole non-negative
    dimensions, or holds more than ``limit`` elements. Bounded work: a product of a
    hostile record's millions of large numbers would take minutes."""
    if not isinstance(shape, list) or len(shape) > _MAX_RANK:
        return None
    if not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        return None
    if 0 in shape:
        return 0
    count = 1
    for d in shape:
        count *= d
        if count > limit:
            return None
    return count


def recorded_values(record: dict[str, Any]) -> list[Value] | str:
    """The values a record kept, flattened (from ``data``, a NaN or an infinity as
    itself), or why there are none (too large to keep, or a record that does not hold
    together: a wrong type, a length that does not match its shape, data that is not
    base64 of its dtype)."""
    count = element_count(record.get("shape"), KEPT_BYTES)
    if count is None:
        return "an output's record has no shape, or one too large to keep"
    values, data = record.get("values"), record.get("data")
    if isinstance(values, list):
        if len(values) != count or count > KEPT_VALUES:
            return "an output's record does not match its shape"
        if not all(_number(v) or v is None for v in values):
            return "an output's record holds a value that is not a number of its dtype"
        return values
    if isinstance(data, str):
        return _decoded(record.get("dtype"), data, count)
    return "outputs differ; too large to keep their values"


def _decoded(dtype: Any, data: str, count: int) -> list[Value] | str:
    code = _CODES.get(dtype) if isinstance(dtype, str) else None
    if code is None:
        return "an output's record has data of an unknown dtype"
    size = struct.calcsize("<" + code)
    if count * size > KEPT_BYTES or len(data) > 4 * (KEPT_BYTES // 3 + 1):  # fits 64 KiB
        return "an output's record holds more data than kiln keeps"
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        return "an output's record holds data that is not base64"
    if len(raw) != count * size:
        return "an output's record does not match its shape"
    return [v if isinstance(v, float) else int(v) for (v,) in struct.iter_unpack("<" + code, raw)]


def _number(v: Any) -> bool:
    """A finite number an output of a kept dtype can hold (no int beyond 64 bits: a
    larger one would overflow a float where it is compared)."""
    if isinstance(v, bool):
        return False
    if isinstance(v, int):
        return -(2**63) <= v < 2**64
    return isinstance(v, float) and math.isfinite(v)
