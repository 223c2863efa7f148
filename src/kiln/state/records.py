"""An action's record in the build state: the key it was built with, its keyed
parameters, its inputs' and its outputs' digests (``kiln.state`` stores it).

Rows read from the database keep their JSON text until a field is first used,
and a field that does not decode to its documented shape marks the record
damaged: its action runs again.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, cast

from kiln.base.events import is_epoch_time
from kiln.state.integrity import BAD, decode_field

# A JSON string literal as ``json.dumps`` writes it (ASCII only).
_JSON_STR: Callable[[str], str] = json.encoder.encode_basestring_ascii


class ActionRecord:
    """What an action produced the last time it succeeded.

    Rows read from the database keep their JSON text until a field is first used:
    a no-op build compares keys and output digests only.
    """

    __slots__ = ("key", "damaged", "_values", "_raw")

    # What an undecodable field reads as: its action runs again.
    _DAMAGED: tuple[Any, Any, Any] = (None, {}, {})

    def __init__(self, key: str, params: Any, inputs: Any, outputs: Any, raw: bool = False):
        # A key that is not a SHA-256 digest (a hand-edited row) matches no action's key.
        self.damaged = raw and not (isinstance(key, str) and len(key) == 64)
        self.key = key if isinstance(key, str) else ""
        self._values: list[Any] = [params, inputs, outputs]
        self._raw = [raw, raw, raw]

    def _field(self, index: int) -> Any:
        if self._raw[index]:
            value = decode_field(index, self._values[index])
            if value is BAD:
                self.damaged = True
                value = self._DAMAGED[index]
            self._values[index] = value
            self._raw[index] = False
        return self._values[index]

    def looks_intact(self) -> bool:
        """Cheaply, without decoding params and inputs: whether each field has its
        type (outputs are decoded already: an up-to-date check reads them)."""
        raw, values = self._raw, self._values
        params, inputs = values[0], values[1]
        if raw[0] and not (
            type(params) is str
            and (params == "null" or (params.startswith("{") and params.endswith("}")))
        ):
            self.damaged = True
        if raw[1] and not (type(inputs) is str and inputs.startswith("{") and inputs.endswith("}")):
            self.damaged = True
        return not self.damaged

    def has_output(self, key: str, digest: str) -> bool:
        """Whether the record gives output ``key`` the digest ``digest``. A row not yet
        decoded whose text is what kiln writes for ``{key: digest}`` (``json.dumps``)
        says so without being parsed (equal JSON text is an equal value: most rows
        of a no-op build); any other text is decoded and looked up."""
        if self._raw[2]:
            text = self._values[2]
            if type(text) is str and text == f"{{{_JSON_STR(key)}: {_JSON_STR(digest)}}}":
                return True
        return bool(self._field(2).get(key) == digest)

    def _fields(self) -> tuple[Any, Any, Any]:
        return (self._field(0), self._field(1), self._field(2))

    def run_deps(self) -> dict[str, str]:
        """The run-time dependencies among its inputs (keys that start with ``!``:
        ``kiln.planning.run_deps``). A row not yet decoded that holds no such key (no JSON
        string in it starts with ``!``) is not decoded."""
        if self._raw[1]:
            text = self._values[1]
            if type(text) is str and '"!' not in text and "\\u0021" not in text:
                return {}
        inputs = self._field(1)
        return {k: v for k, v in inputs.items() if k[:1] == "!" and type(v) is str}

    @property
    def params(self) -> dict[str, Any] | None:
        return cast("dict[str, Any] | None", self._field(0))

    @property
    def inputs(self) -> dict[str, str]:
        return cast("dict[str, str]", self._field(1))

    @property
    def outputs(self) -> dict[str, str]:
        return cast("dict[str, str]", self._field(2))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ActionRecord):
            return NotImplemented
        return (self.key, *self._fields()) == (other.key, *other._fields())

    def __repr__(self) -> str:
        return f"ActionRecord({self.key!r}, {self.params!r}, {self.inputs!r}, {self.outputs!r})"


class FailureRecord:
    """How an action failed the last time it ran: the key, the keyed parameters and
    inputs (as ``ActionRecord``'s, JSON text until used, to say what changed since),
    the error as the console showed it and, when ``-v`` showed more (a traceback),
    that as ``detail``, the path of that run's log, the JSON result the failure
    carried (a verification's), when it failed (epoch seconds), whether it is
    ``remembered`` (it fails again with the same key: ``kiln.engine.failures``)
    and ``why`` (or why not).

    Invariant: ``key`` is a SHA-256 digest; ``error`` and ``why`` are text;
    ``remembered`` is a bool (0 or 1 in the row); ``time`` is one a clock shows
    (``kiln.base.events.is_epoch_time``). A row read with anything else is dropped, and
    its action runs again."""

    __slots__ = (
        *("key", "params", "inputs", "error", "detail", "log", "result", "time"),
        *("why", "remembered"),
    )

    def __init__(
        self,
        key: str,
        params: str,
        inputs: str,
        error: str,
        detail: str | None,
        log: str | None,
        result: str | None,
        time: float,
        why: str,
        remembered: bool,
    ):
        self.key = key
        self.params = params  # JSON text, as in the ``actions`` table
        self.inputs = inputs
        self.error = error
        self.detail = detail
        self.log = log
        self.result = result
        self.time = time
        self.why = why
        self.remembered = remembered

    @classmethod
    def from_row(cls, row: tuple[Any, ...]) -> FailureRecord | None:
        """The record of a row read from ``failures`` (without its id), or None when
        a field does not have the type kiln writes."""
        key, params, inputs, error, detail, log, result, time, why, remembered = row
        if not (type(key) is str and len(key) == 64):
            return None
        if not all(type(text) is str for text in (params, inputs, error, why)):
            return None
        if not (type(remembered) is int and remembered in (0, 1)):
            return None
        if not all(text is None or type(text) is str for text in (detail, log, result)):
            return None
        if not is_epoch_time(time):  # also what kiln explain shows as a date
            return None
        return cls(
            key, params, inputs, error, detail, log, result, float(time), why, remembered == 1
        )

    def row(self, action_id: str) -> tuple[Any, ...]:
        """The row of ``failures`` for the action ``action_id``."""
        fields = [getattr(self, name) for name in self.__slots__]
        fields[-1] = int(self.remembered)
        return (action_id, *fields)

    def as_record(self) -> ActionRecord:
        """Its key, parameters and inputs as a record (no outputs), to compare with
        an action's key now (``kiln.engine.incremental``)."""
        return ActionRecord(self.key, self.params, self.inputs, "{}", raw=True)

    def carried(self) -> dict[str, Any] | None:
        """The JSON result the failure carried, or None (also when it is damaged)."""
        if self.result is None:
            return None
        try:
            value = json.loads(self.result)
        except ValueError:
            return None
        return value if isinstance(value, dict) else None
