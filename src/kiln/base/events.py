"""The build's event stream: one record per fact the scheduler learns.

Every reader of a build (the live display, the plain lines, the JSON-lines log,
the Chrome trace, the files ``kiln report`` reads) gets the same ``BuildEvent``
objects from one ``EventStream``, in one order. The JSON form of an event is
documented in ``docs/events.md``; ``SCHEMA`` names its version.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Iterable
from json.encoder import encode_basestring_ascii
from time import time as _now
from typing import Any, Protocol

SCHEMA = "kiln-events/1"

BUILD_STARTED = "build_started"
PLANNED = "planned"
STARTED = "started"
UP_TO_DATE = "up_to_date"
CACHED = "cached"
FINISHED = "finished"
FAILED = "failed"
NOT_RUN = "not_run"
WOULD_RUN = "would_run"
BUILD_FINISHED = "build_finished"
NOTE = "note"  # a line for the user (``text`` in its JSON form)
KINDS = (
    BUILD_STARTED,
    PLANNED,
    STARTED,
    UP_TO_DATE,
    CACHED,
    FINISHED,
    FAILED,
    NOT_RUN,
    WOULD_RUN,
    BUILD_FINISHED,
    NOTE,
)
# Kinds that end an action's part in a build: every planned action gets exactly one.
ENDINGS = (UP_TO_DATE, CACHED, FINISHED, FAILED, NOT_RUN, WOULD_RUN)
# The wall-clock times kiln believes when it reads one back (a record, the state):
# from 1970 until 2242 (2**33 s), a range every platform's time functions format.
_LATEST_TIME = 2.0**33


def is_epoch_time(value: object) -> bool:
    """Whether ``value`` is a time (seconds since the epoch) kiln could have written
    and can show as a date: a finite number from 1970 until 2242. A time read back
    from a file is believed only then, so no damaged value can overflow a date."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return 0 <= value < _LATEST_TIME


class BuildEvent:
    """One fact about a build. ``kind`` is one of ``KINDS``; ``time`` is the wall
    clock (seconds since the epoch) when it happened. Action events name their
    action by ``action`` (its state id); fields that do not apply are None.

    ``subject`` is the graph node (or, for ``build_started``, the set of planned
    nodes) for in-process readers; it never appears in the JSON form, nor does
    ``explain`` (the build was asked to say why each action runs: a reader that
    displays shows ``reason``). Fields not
    given keep the class's None, so an event costs only what it carries (a
    no-op build of 100,000 actions makes 200,000 of them).
    """

    seq: int = 0
    action: str | None = None
    desc: str | None = None
    type: str | None = None
    target: str | None = None
    lane: str | None = None
    key: str | None = None
    reason: str | None = None
    start: float | None = None
    duration: float | None = None
    outputs: list[dict[str, Any]] | None = None
    bytes: int | None = None
    error: str | None = None
    traceback: str | None = None
    root_cause: str | None = None
    log: str | None = None
    unchanged: bool | None = None
    deps: list[str] | None = None
    data: dict[str, Any] | None = None
    subject: Any = None
    explain: bool = False

    def __init__(self, kind: str, time: float | None = None, **fields: Any):
        self.kind = kind
        self.time = _now() if time is None else time
        self.__dict__.update(fields)

    def __repr__(self) -> str:
        return f"BuildEvent({self.to_json()!r})"

    def json_text(self) -> str:
        """``to_json`` as one line of JSON text (as ``json.dumps`` writes it), made
        once however many readers write it."""
        text = self.__dict__.get("_json")
        if text is None:
            text = self._json = _encode_any(self.to_json())
        return text

    def to_json(self) -> dict[str, Any]:
        """The documented JSON object: the fields that apply, ``subject`` left out."""
        out: dict[str, Any] = {"event": self.kind, "seq": self.seq, "time": round(self.time, 6)}
        get = self.__dict__.get
        for name in _OPTIONAL:
            value = get(name)
            if value is not None:
                out[name] = value
        if self.kind == CACHED:
            out["cached"] = True
        elif self.kind in (FINISHED, FAILED):
            out["cached"] = False
        if self.data:
            out.update(self.data)
        return out


_OPTIONAL = (
    "action",
    "desc",
    "type",
    "target",
    "lane",
    "key",
    "reason",
    "start",
    "duration",
    "outputs",
    "bytes",
    "error",
    "traceback",
    "root_cause",
    "log",
    "unchanged",
    "deps",
)


_encode_any = json.JSONEncoder(default=str, check_circular=False).encode


def json_value(value: Any) -> str:
    """``value`` as ``json.dumps(value, default=str)`` writes it (fast for strings and
    numbers)."""
    kind = type(value)
    if kind is str:
        return encode_basestring_ascii(value)
    if kind is int:
        return int.__repr__(value)
    if kind is float and math.isfinite(value):
        return float.__repr__(value)
    if value is None:
        return "null"
    return _encode_any(value)  # booleans, lists, objects, what ``str`` turns into text


class EventReader(Protocol):
    """Anything that reads the stream. ``handle`` is called once per event, from the
    thread that emitted it, never from two threads at once."""

    def handle(self, event: BuildEvent) -> None: ...


class EventStream:
    """Hands each event to every reader, in emission order.

    Invariant: ``seq`` numbers the events of one stream 1, 2, 3, ... in the order
    readers receive them; emission is serialised by a lock, so readers never see
    two events at once and all see the same order.
    """

    def __init__(self, readers: Iterable[EventReader] = ()):
        self.readers: list[EventReader] = list(readers)
        self._lock = threading.Lock()
        self._seq = 0

    def add(self, reader: EventReader) -> None:
        self.readers.append(reader)

    def emit(self, event: BuildEvent) -> None:
        with self._lock:
            self._seq += 1
            event.seq = self._seq
            for reader in self.readers:
                reader.handle(event)


def target_of(output_paths: Iterable[str]) -> str | None:
    """The entrypoint an action belongs to: the first component of the graph path
    of its first output (``mnist/model.vmfb`` -> ``mnist``)."""
    for path in output_paths:
        return path.split("/", 1)[0] if "/" in path else ""
    return None
