"""Canonical forms of the values that go into an action's key.

Every parameter of an action is turned into JSON data that is equal exactly when
the values are equal, whatever the order of a set or a dict, so that the key is
complete and stable. The forms (``canonical``):

- ``None``, ``bool``, ``int``, ``float``, ``str``: themselves; lists: lists.
- tagged objects (a JSON object whose first key starts with ``!``):
  ``{"!tuple": [...]}`` (a tuple is not a list: code can tell them apart),
  ``{"!dict": [[key, value], ...]}`` (dicts and their subclasses, in their own
  order: iterating a dict gives its insertion order, so an action can depend on
  it; keys are canonical values, so ``{1: x}`` and ``{"1": x}`` differ),
  ``{"!set": [...]}`` (sets and frozensets, sorted by their items' JSON text:
  their order is the hash's, which no code should depend on),
  ``{"!type": "mod.Class", field: ...}`` (dataclasses and named tuples),
  ``{"!enum": "mod.Class.NAME", "value": ...}``,
  ``{"!path": "..."}``, ``{"!bytes": hex or "sha256:<hex>:<length>"}``,
  ``{"!complex": [re, im]}``, ``{"!ndarray": dtype, "shape": [...], "data": ...}``
  (numpy arrays and scalars; numpy is imported only when such a value is met),
  ``{"!callable": digest}`` (functions, methods, partials, classes and callable
  objects, when the caller gives a ``code_ref``: the digest of their code and
  closure values or attributes).
- a ``BuildFile``: its graph key. Its content is in the key as an input digest when
  it is an input of the action (in its ``deps``); an output is named by its path. A
  file that is neither cannot be keyed: reading it would be an undeclared input.

Anything else raises ``Unkeyable``; callers turn it into a ``BuildDefinitionError``
that names the action, the attribute and the fix. Nothing is silently dropped.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import sys
import types
from collections.abc import Callable
from pathlib import PurePath
from typing import Any

from kiln.errors import Unkeyable
from kiln.graph import BuildAction, BuildFile
from kiln.modnames import stable_module_name

_SHORT_BYTES = 32

# Resolves a BuildFile to its canonical form (raises Unkeyable when it cannot).
FileRef = Callable[[BuildFile], str]
# The digest of a function, method, partial or class (``kiln.codekey``).
CodeRef = Callable[[Any], str]
_CODE_TYPES = (
    types.FunctionType,
    types.MethodType,
    types.BuiltinFunctionType,
    functools.partial,
    type,
)


def qualname(kind: type) -> str:
    """``module.Class``, a build module spelled the same in every checkout."""
    return f"{stable_module_name(kind.__module__)}.{kind.__qualname__}"


def dumps(value: Any) -> str:
    """The one JSON text of a canonical value (keys sorted, no spaces)."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def canonical(value: Any, file_ref: FileRef, code_ref: CodeRef | None = None) -> Any:
    """``value`` in canonical form (see the module docstring); ``file_ref`` names files.
    The common types are tested first and by exact type: every no-op build keys
    every action."""
    kind = type(value)
    if kind is str or kind is int or kind is float or kind is bool or value is None:
        return value
    if kind is BuildFile:
        return file_ref(value)
    if kind is list:
        return _sequence(value, file_ref, code_ref)
    if kind is tuple:
        return {"!tuple": _sequence(value, file_ref, code_ref)}
    if kind is dict:
        return _mapping(value, file_ref, code_ref)
    return _other(value, kind, file_ref, code_ref)


def _sequence(
    value: list[Any] | tuple[Any, ...], file_ref: FileRef, code_ref: CodeRef | None = None
) -> list[Any]:
    try:  # files are the most common items (an action's inputs): tested in-line
        return [
            file_ref(item) if type(item) is BuildFile else canonical(item, file_ref, code_ref)
            for item in value
        ]
    except Unkeyable as e:  # find where, for the message
        for i, item in enumerate(value):
            try:
                canonical(item, file_ref, code_ref)
            except Unkeyable:
                raise e.inside(f"[{i}]") from None
        raise


def _mapping(
    value: dict[Any, Any], file_ref: FileRef, code_ref: CodeRef | None = None
) -> dict[str, Any]:
    pairs = []
    for key, item in value.items():
        try:
            name = canonical(key, file_ref, code_ref)
        except Unkeyable as e:
            raise e.inside(f" (a key {key!r})") from None
        try:
            pairs.append([name, canonical(item, file_ref, code_ref)])
        except Unkeyable as e:
            raise e.inside(f"[{key!r}]") from None
    return {"!dict": pairs}


def _other(value: Any, kind: type, file_ref: FileRef, code_ref: CodeRef | None = None) -> Any:
    """Everything but the exact common types, most specific first."""
    if isinstance(value, enum.Enum):
        return {
            "!enum": f"{qualname(kind)}.{value.name}",
            "value": canonical(value.value, file_ref, code_ref),
        }
    if isinstance(value, str | int | float):  # subclasses: bool and int are exact above
        return _base_value(value)
    if isinstance(value, BuildFile):
        return file_ref(value)
    if isinstance(value, PurePath):
        return {"!path": str(value)}
    if isinstance(value, bytes | bytearray | memoryview):
        return {"!bytes": _bytes_text(bytes(value))}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return _record(kind, zip(value._fields, value, strict=True), file_ref, code_ref)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
        return _record(kind, fields, file_ref, code_ref)
    if isinstance(value, list):
        return _sequence(value, file_ref, code_ref)
    if isinstance(value, tuple):
        return {"!tuple": _sequence(value, file_ref, code_ref)}
    if isinstance(value, dict):
        return _mapping(value, file_ref, code_ref)
    if isinstance(value, set | frozenset):
        return {"!set": sorted((canonical(v, file_ref, code_ref) for v in value), key=dumps)}
    if isinstance(value, complex):
        return {"!complex": [value.real, value.imag]}
    if code_ref is not None and (isinstance(value, _CODE_TYPES) or callable(value)):
        return {"!callable": code_ref(value)}
    if kind.__module__.split(".", 1)[0] == "numpy":
        return _numpy(value, kind, file_ref, code_ref)
    raise Unkeyable(qualname(kind))


def _base_value(value: str | int | float) -> str | int | float:
    """The plain str, int or float of a subclass's instance (the base class's own
    conversion: a subclass's ``__str__`` or ``__int__`` is not asked)."""
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    return float.__float__(value)


def _record(
    kind: type, fields: Any, file_ref: FileRef, code_ref: CodeRef | None = None
) -> dict[str, Any]:
    out: dict[str, Any] = {"!type": qualname(kind)}
    for name, item in fields:
        try:
            out[name] = canonical(item, file_ref, code_ref)
        except Unkeyable as e:
            raise e.inside(f".{name}") from None
    return out


def _bytes_text(data: bytes) -> str:
    if len(data) <= _SHORT_BYTES:
        return data.hex()
    return f"sha256:{hashlib.sha256(data).hexdigest()}:{len(data)}"


def _numpy(value: Any, kind: type, file_ref: FileRef, code_ref: CodeRef | None = None) -> Any:
    """A numpy array or scalar: dtype, shape and a digest of its bytes (object
    arrays by their items, whose bytes are pointers)."""
    np = sys.modules["numpy"]
    if not isinstance(value, np.ndarray | np.generic):
        raise Unkeyable(qualname(kind))
    array = np.asarray(value)
    dtype = array.dtype
    name = dtype.str if dtype.fields is None else repr(dtype.descr)
    out: dict[str, Any] = {"!ndarray": name, "shape": list(array.shape)}
    if dtype.hasobject:
        out["items"] = canonical(array.tolist(), file_ref, code_ref)
    else:
        out["data"] = _bytes_text(np.ascontiguousarray(array).tobytes())
    return out


def file_ref_for(action: BuildAction) -> FileRef:
    """How files held by ``action`` are keyed: an input or an output by its graph key;
    any other file is an undeclared input, which cannot be keyed."""

    def ref(f: BuildFile) -> str:
        if f in action.deps or action in f.deps:
            return f.key
        raise Unkeyable(
            f"BuildFile '{f.path}'",
            hint=(
                f"the file '{f.path}' is neither an input (in deps) nor an output of the "
                "action, so a change to it would go unnoticed; declare it as an input "
                "(pass it in deps=)"
            ),
        )

    return ref
