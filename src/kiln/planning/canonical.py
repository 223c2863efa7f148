"""Canonical forms of the values that go into an action's key.

Every parameter of an action is turned into JSON data that is equal exactly when
the values are equal *and code cannot tell them apart*, whatever the order of a
set or the seed of string hashes, so that the key is complete and stable. The
forms (``canonical``):

- ``None``, ``bool``, ``int``, ``str``, and ``float`` but NaN: themselves; lists:
  lists. The exact types only: anything else is tagged.
- tagged objects (a JSON object whose first key starts with ``!``):
  ``{"!nan": hex}`` (a NaN, by its 64 bits: sign and payload are observable),
  ``{"!tuple": [...]}`` (a tuple is not a list: code can tell them apart),
  ``{"!dict": [[key, value], ...]}`` (in its own order: iterating a dict gives its
  insertion order, so an action can depend on it; keys are canonical values, so
  ``{1: x}`` and ``{"1": x}`` differ),
  ``{"!set": [...]}`` and ``{"!frozenset": [...]}`` (sorted by their items' JSON
  text: their order is the hash's, which no code should depend on),
  ``{"!record": "mod.Class", "code": ..., "fields": [[name, value], ...]}``
  (dataclasses and named tuples, fields in their order),
  ``{"!enum": "mod.Class.NAME", "value": ..., "code": ...}``,
  ``{"!of": "mod.Class", "code": ..., "value": ..., "state": ...}`` (an instance
  of a subclass of ``str``, ``int``, ``float``, ``complex``, ``bytes``,
  ``bytearray``, ``list``, ``tuple``, ``dict``, ``set`` or ``frozenset``: the
  plain value's form, and the attributes the instance holds),
  ``{"!path": "...", "type": ...}`` (``type`` for anything but a concrete
  ``Path``), ``{"!bytes": hex or "sha256:<hex>:<length>"}``, ``{"!bytearray":
  ...}``, ``{"!memoryview": ..., "format": ..., "shape": [...]}``,
  ``{"!complex": [re, im]}``, ``{"!ndarray": dtype, "shape": [...], "data": ...}``
  (a numpy array: dtype with its byte order, shape, a digest of its bytes in C
  order, made without copying the array; a subclass adds ``type`` and ``state``),
  ``{"!npscalar": dtype, "data": ...}`` (a numpy scalar, which is not a 0-d
  array: code can tell them apart); numpy is imported only when such a value is
  met, ``{"!callable": digest}`` (functions, methods, partials, classes and
  callable objects: the digest of their code and closure values or attributes).
  ``code`` is the digest of the value's class (``code_ref``: its methods can make
  two equal-looking values behave apart), present when the caller gives a
  ``code_ref``.
- a ``BuildFile``: its graph key. Its content is in the key as an input digest when
  it is an input of the action (in its ``deps``); an output is named by its path. A
  file that is neither cannot be keyed: reading it would be an undeclared input.

The forms changed since kiln's first keys (NaN, records, subclasses, frozensets,
scalars) carry tags the earlier forms never had, so no key of an earlier kiln
equals a key of another value now: such results rebuild once. Plain values keep
their forms, and their keys.

Anything else raises ``Unkeyable``; callers turn it into a ``BuildDefinitionError``
that names the action, the attribute and the fix. Nothing is silently dropped.
"""

from __future__ import annotations

import collections
import dataclasses
import enum
import functools
import hashlib
import json
import struct
import sys
import types
from collections.abc import Callable
from pathlib import Path, PurePath
from typing import Any

from kiln.base.errors import Unkeyable
from kiln.base.modnames import stable_module_name
from kiln.graph import BuildAction, BuildFile

_SHORT_BYTES = 32
# The most bytes of a non-contiguous array copied at once to hash it.
_CHUNK_BYTES = 1 << 24

# Resolves a BuildFile to its canonical form (raises Unkeyable when it cannot).
FileRef = Callable[[BuildFile], str]
# The digest of a function, method, partial or class (``kiln.planning.code_key``).
CodeRef = Callable[[Any], str]
_CONCRETE_PATH = type(Path())  # PosixPath, or WindowsPath
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
    if kind is str or kind is int or kind is bool or value is None:
        return value
    if kind is float and value == value:  # NaN is tagged, by its bits
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


def _sequence(value: Any, file_ref: FileRef, code_ref: CodeRef | None = None) -> list[Any]:
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


def _mapping(value: Any, file_ref: FileRef, code_ref: CodeRef | None = None) -> dict[str, Any]:
    return {"!dict": _pairs(value.items(), file_ref, code_ref)}


def _pairs(items: Any, file_ref: FileRef, code_ref: CodeRef | None) -> list[list[Any]]:
    pairs = []
    for key, item in items:
        try:
            name = canonical(key, file_ref, code_ref)
        except Unkeyable as e:
            raise e.inside(f" (a key {key!r})") from None
        try:
            pairs.append(
                [name, _UNSET_FORM if item is _UNSET else canonical(item, file_ref, code_ref)]
            )
        except Unkeyable as e:
            raise e.inside(f"[{key!r}]") from None
    return pairs


def _other(value: Any, kind: type, file_ref: FileRef, code_ref: CodeRef | None = None) -> Any:
    """Everything but the exact common types, most specific first."""
    if kind is float:
        return {"!nan": struct.pack(">d", value).hex()}
    np = sys.modules.get("numpy")  # numpy's scalars subclass float, complex, str, bytes
    if np is not None and isinstance(value, np.ndarray | np.generic):
        return _numpy(value, kind, file_ref, code_ref)
    if isinstance(value, enum.Enum):
        form = {
            "!enum": f"{qualname(kind)}.{value.name}",
            "value": canonical(value.value, file_ref, code_ref),
        }
        return _with_code(form, kind, code_ref)
    if isinstance(value, BuildFile):
        return file_ref(value)
    if isinstance(value, PurePath):
        return _path(value, kind, file_ref, code_ref)
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return _record(kind, zip(value._fields, value, strict=True), file_ref, code_ref)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
        return _record(kind, fields, file_ref, code_ref)
    plain = _PLAIN.get(kind)
    if plain is not None:
        return plain(value, file_ref, code_ref)
    base = next((b for b in _PLAIN if isinstance(value, b)), None)
    if base is not None:
        return _subclass(value, kind, base, file_ref, code_ref)
    if code_ref is not None and (isinstance(value, _CODE_TYPES) or callable(value)):
        return {"!callable": code_ref(value)}
    raise Unkeyable(qualname(kind))


def _with_code(form: dict[str, Any], kind: type, code_ref: CodeRef | None) -> dict[str, Any]:
    """``form`` with the digest of the code of ``kind`` (when the caller keys code)."""
    if code_ref is not None:
        form["code"] = code_ref(kind)
    return form


def _base_value(value: str | int | float) -> Any:
    """The plain str, int or float of a subclass's instance (the base class's own
    conversion: a subclass's ``__str__`` or ``__int__`` is not asked)."""
    if isinstance(value, str):
        return str.__str__(value)
    if isinstance(value, int):
        return int.__int__(value)
    return float.__float__(value)


def _set_items(value: Any, file_ref: FileRef, code_ref: CodeRef | None) -> list[Any]:
    return sorted((canonical(v, file_ref, code_ref) for v in value), key=dumps)


# The exact types with a form of their own (beyond ``canonical``'s), and the base
# classes whose subclasses are keyed as ``!of`` (the base's form of the value).
_PLAIN: dict[type, Callable[[Any, FileRef, CodeRef | None], Any]] = {
    str: lambda v, f, c: canonical(_base_value(v), f, c),
    int: lambda v, f, c: canonical(_base_value(v), f, c),
    float: lambda v, f, c: canonical(_base_value(v), f, c),
    bytes: lambda v, f, c: {"!bytes": _bytes_text(v)},
    bytearray: lambda v, f, c: {"!bytearray": _bytes_text(v)},
    memoryview: lambda v, f, c: {
        "!memoryview": _bytes_text(v),
        "format": v.format,
        "shape": list(v.shape or ()),
    },
    complex: lambda v, f, c: {"!complex": [canonical(v.real, f, c), canonical(v.imag, f, c)]},
    list: _sequence,
    tuple: lambda v, f, c: {"!tuple": _sequence(v, f, c)},
    dict: _mapping,
    set: lambda v, f, c: {"!set": _set_items(v, f, c)},
    frozenset: lambda v, f, c: {"!frozenset": _set_items(v, f, c)},
}


def _subclass(
    value: Any, kind: type, base: type, file_ref: FileRef, code_ref: CodeRef | None
) -> dict[str, Any]:
    """An instance of a subclass of a plain type: the class, its code, the plain
    value's form and what else the instance holds."""
    form = {"!of": qualname(kind), "value": _PLAIN[base](value, file_ref, code_ref)}
    state = _state(value, kind)
    if isinstance(value, collections.defaultdict):
        state.insert(0, ("default_factory", value.default_factory))
    if state:
        form["state"] = _pairs(state, file_ref, code_ref)
    return _with_code(form, kind, code_ref)


class _Unset:
    """The value of a slot that an instance never set (reading it raises)."""


def _state(value: Any, kind: type) -> list[tuple[str, Any]]:
    """The attributes an instance holds: its ``__dict__``, then its slots (one never
    set as ``!unset``), in order."""
    found = list(getattr(value, "__dict__", {}).items())
    for klass in kind.__mro__:
        slots = klass.__dict__.get("__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name in ("__dict__", "__weakref__"):
                continue
            if name.startswith("__") and not name.endswith("__"):  # name-mangled
                name = f"_{klass.__name__.lstrip('_')}{name}"
            found.append((name, getattr(value, name, _UNSET)))
    return found


_UNSET = _Unset()
_UNSET_FORM = {"!unset": True}


def _path(value: PurePath, kind: type, file_ref: FileRef, code_ref: CodeRef | None) -> Any:
    """A path: its text; any class but the concrete ``Path`` is named (a pure path
    cannot be opened), with its code and attributes."""
    form: dict[str, Any] = {"!path": str(value)}
    if kind is not _CONCRETE_PATH:
        form["type"] = qualname(kind)
        state = list(getattr(value, "__dict__", {}).items())
        if state:
            form["state"] = _pairs(state, file_ref, code_ref)
        _with_code(form, kind, code_ref)
    return form


def _record(
    kind: type, fields: Any, file_ref: FileRef, code_ref: CodeRef | None = None
) -> dict[str, Any]:
    """A dataclass or named tuple: its class, code and fields, in their order."""
    pairs = []
    for name, item in fields:
        try:
            pairs.append([name, canonical(item, file_ref, code_ref)])
        except Unkeyable as e:
            raise e.inside(f".{name}") from None
    return _with_code({"!record": qualname(kind), "fields": pairs}, kind, code_ref)


def _bytes_text(data: Any) -> str:
    """Bytes (anything with the buffer protocol) as hex, or as their digest and
    length when longer than 32; hashed where they are, not copied."""
    view = memoryview(data)
    try:
        view = view.cast("B") if view.c_contiguous else memoryview(view.tobytes())
    except (TypeError, ValueError, NotImplementedError):  # a format cast cannot take
        view = memoryview(view.tobytes())
    if view.nbytes <= _SHORT_BYTES:
        return view.hex()
    return f"sha256:{hashlib.sha256(view).hexdigest()}:{view.nbytes}"


def _numpy(value: Any, kind: type, file_ref: FileRef, code_ref: CodeRef | None) -> Any:
    """A numpy array or scalar: dtype (byte order included), shape and a digest of
    its bytes in C order (object arrays by their items, whose bytes are pointers).
    A scalar is not a 0-d array; a subclass of ndarray is named, with its state."""
    np = sys.modules["numpy"]
    array = np.asarray(value) if isinstance(value, np.generic) else value.view(np.ndarray)
    dtype = array.dtype
    name = dtype.str if dtype.fields is None else repr(dtype.descr)
    if isinstance(value, np.generic):
        out: dict[str, Any] = {"!npscalar": name}
    else:
        out = {"!ndarray": name, "shape": list(array.shape)}
        if kind is not np.ndarray:
            out["type"] = qualname(kind)
            state = _state(value, kind)
            if state:
                out["state"] = _pairs(state, file_ref, code_ref)
            _with_code(out, kind, code_ref)
    if dtype.hasobject:
        out["items"] = canonical(array.tolist(), file_ref, code_ref)
    elif array.nbytes <= _SHORT_BYTES:
        out["data"] = array.tobytes().hex()
    else:
        h = hashlib.sha256()
        _hash_c_order(h, array, np)
        out["data"] = f"sha256:{h.hexdigest()}:{array.nbytes}"
    return out


def _hash_c_order(h: Any, array: Any, np: Any) -> None:
    """Feed ``h`` the bytes of ``array`` in C order: a C-contiguous array where it
    lies, any other in copies of at most ``_CHUNK_BYTES`` (a row bigger than that
    row by row), so that keying an array never doubles the memory it takes."""
    if array.flags.c_contiguous:
        h.update(array.reshape(-1).view(np.uint8))
        return
    row = array.nbytes // array.shape[0]
    rows = _CHUNK_BYTES // row if row else len(array)
    if rows == 0 and array.ndim > 1:
        for part in array:
            _hash_c_order(h, part, np)
        return
    step = max(rows, 1)
    for start in range(0, len(array), step):
        block = np.ascontiguousarray(array[start : start + step])
        h.update(block.reshape(-1).view(np.uint8))


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
