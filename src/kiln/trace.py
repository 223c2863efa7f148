"""Writers of the event stream: a JSON-lines log (``--events``), a Chrome trace
(``--profile``), and the record of the last build kept in ``.kiln/``.

The Chrome trace uses the Trace Event Format's JSON object form
(``{"traceEvents": [...]}``), which Perfetto and chrome://tracing open: one
thread lane per kiln worker (``main`` for in-line actions), one complete ("X")
slice per action that ran or came from the cache, with its id, key, reason,
cached flag, outputs and bytes as args, and two counters: running actions and
kiln's resident memory.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from kiln import events as ev
from kiln.actions._files import atomic_output
from kiln.errors import UsageError

LAST_EVENTS = "last-events.jsonl"
LAST_TRACE = "last-trace.json"
_RSS_EVERY_S = 0.02  # at most 50 memory samples a second
_FLUSH_EVERY_S = 0.5  # the buffered log of .kiln/ is flushed this often


def open_for_writing(path: Path) -> IO[str]:
    """Open ``path`` new or truncated, never following a symlink at its name."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o666)
    return os.fdopen(fd, "w", encoding="utf-8")


class EventLog:
    """Writes each event as one JSON object per line.

    With ``flush_each`` every line reaches the file before the next event, so a
    killed build leaves every event it emitted; otherwise lines are flushed at
    least every half second and at the end of the build.
    """

    wants_planned = True

    def __init__(self, stream: IO[str], flush_each: bool = True):
        self._stream = stream
        self._flush_each = flush_each
        self._flushed = time.monotonic()
        self._failed = False

    @classmethod
    def open(cls, path: Path, option: str = "--events") -> EventLog:
        """The log for a user-given path; an unwritable path is a usage error."""
        try:
            return cls(open_for_writing(path))
        except OSError as e:
            raise UsageError(f"{option} {path}: cannot write it: {e.strerror}") from e

    def handle(self, event: ev.BuildEvent) -> None:
        if self._failed:
            return
        try:
            self._stream.write(json.dumps(event.to_json(), default=str) + "\n")
            now = time.monotonic()
            end = event.kind == ev.BUILD_FINISHED
            if self._flush_each or end or now - self._flushed >= _FLUSH_EVERY_S:
                self._stream.flush()
                self._flushed = now
        except OSError:  # a full disk stops the log, never the build
            self._failed = True

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._stream.close()


def rss_bytes() -> int:
    """kiln's resident memory now (Linux), else its peak."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class ChromeTrace:
    """Collects the trace of one build; ``write`` saves it.

    Invariant: ``_lanes`` gives each lane name one thread id, in order of first
    use; every slice lies within its lane, and a lane runs one action at a time.
    The running-actions counter is made from the slices' own start and end times
    when the trace is written: events arrive in the order the scheduler learns
    of them, and a worker may start its next action before its last one's end is
    processed.
    """

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._t0: float | None = None
        self._pid = os.getpid()
        self._lanes: dict[str, int] = {}
        self._spans: list[tuple[float, float]] = []
        self._open: dict[str | None, float] = {}
        self._sampled = 0.0
        self._other: dict[str, Any] = {"schema": ev.SCHEMA}

    def _us(self, t: float) -> float:
        return round((t - (self._t0 or t)) * 1e6, 1)

    def _tid(self, lane: str) -> int:
        tid = self._lanes.get(lane)
        if tid is None:
            tid = self._lanes[lane] = len(self._lanes) + 1
            self.events.append({"ph": "M", "name": "thread_name", "pid": self._pid, "tid": tid,
                                "args": {"name": lane}})  # fmt: skip
            self.events.append({"ph": "M", "name": "thread_sort_index", "pid": self._pid,
                                "tid": tid, "args": {"sort_index": tid}})  # fmt: skip
        return tid

    def handle(self, event: ev.BuildEvent) -> None:
        kind = event.kind
        if kind == ev.STARTED:
            self._tid(event.lane or "main")
            self._open[event.action] = event.time
            self._memory(event.time)
        elif kind in (ev.FINISHED, ev.FAILED, ev.CACHED):
            self._slice(event)
            start = self._open.pop(event.action, None)
            if start is not None:
                self._spans.append((start, start + (event.duration or 0.0)))
            self._memory(event.time)
        elif kind == ev.BUILD_STARTED:
            self._start(event)
        elif kind == ev.BUILD_FINISHED:
            self._memory(event.time, force=True)
            self.events.append({"ph": "i", "s": "g", "name": "build finished", "pid": self._pid,
                                "tid": 0, "ts": self._us(event.time)})  # fmt: skip
            self._other.update(event.data or {})

    def _start(self, event: ev.BuildEvent) -> None:
        self._t0 = event.time
        data = event.data or {}
        self._pid = data.get("pid", self._pid)
        targets = " ".join(data.get("targets", []))
        self.events.append({"ph": "M", "name": "process_name", "pid": self._pid, "tid": 0,
                            "args": {"name": f"kiln build {targets}".strip()}})  # fmt: skip
        self._other.update(started=event.time, actions=data.get("actions"), jobs=data.get("jobs"))
        self._memory(event.time, force=True)

    def _slice(self, event: ev.BuildEvent) -> None:
        start = event.start if event.start is not None else event.time
        args: dict[str, Any] = {
            "action": event.action, "key": event.key, "reason": event.reason,
            "cached": event.kind == ev.CACHED, "target": event.target, "type": event.type,
            "outputs": [o["path"] for o in event.outputs or []], "bytes": event.bytes or 0,
            "status": event.kind,
        }  # fmt: skip
        if event.error:
            args["error"] = event.error
        self.events.append({
            "ph": "X", "name": event.desc, "cat": "cached" if event.kind == ev.CACHED else "action",
            "pid": self._pid, "tid": self._tid(event.lane or "main"), "ts": self._us(start),
            "dur": round((event.duration or 0.0) * 1e6, 1), "args": args,
        })  # fmt: skip

    def _running_counter(self) -> list[dict[str, Any]]:
        """The running-actions counter, from the start and end of every action
        (those never ended count as running to the end of the trace)."""
        points = [(start, 1) for start, _ in self._spans]
        points += [(end, -1) for _, end in self._spans]
        points += [(start, 1) for start in self._open.values()]
        points.sort(key=lambda p: (p[0], p[1]))  # at a tie an end comes first
        counter, running = [], 0
        for t, delta in points:
            running += delta
            counter.append({"ph": "C", "name": "running actions", "pid": self._pid,
                            "ts": self._us(t), "args": {"running": running}})  # fmt: skip
        return counter

    def _memory(self, t: float, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._sampled < _RSS_EVERY_S:
            return
        self._sampled = now
        self.events.append({"ph": "C", "name": "kiln memory", "pid": self._pid, "ts": self._us(t),
                            "args": {"rss_mb": round(rss_bytes() / 2**20, 1)}})  # fmt: skip

    def document(self) -> dict[str, Any]:
        return {"traceEvents": self.events + self._running_counter(), "displayTimeUnit": "ms",
                "otherData": self._other}  # fmt: skip

    def write(self, path: Path) -> None:
        with atomic_output(path) as tmp:
            tmp.write_text(json.dumps(self.document(), default=str))


class TraceFile:
    """``--profile FILE``: the build's Chrome trace, written when the build ends."""

    def __init__(self, path: Path, warn: Callable[[str], None]):
        if not path.parent.is_dir():
            raise UsageError(f"--profile {path}: no directory {path.parent} to write it in")
        self.path = path
        self.trace = ChromeTrace()
        self._warn = warn

    def handle(self, event: ev.BuildEvent) -> None:
        self.trace.handle(event)
        if event.kind == ev.BUILD_FINISHED:
            try:
                self.trace.write(self.path)
            except OSError as e:
                self._warn(f"kiln: --profile {self.path}: cannot write it: {e.strerror}")


class LastBuild:
    """Keeps the last build's events and trace in ``.kiln/`` for ``kiln report``.

    The events file holds the stream without ``planned`` and ``up_to_date``
    events (those are counted in ``build_finished``; what ran names its deps in
    its ``started`` event), so a no-op build of many actions writes a few lines.
    The previous build's trace is removed when a build
    starts, so the two files never describe different builds; a build killed
    outright keeps its events up to the last flush and no trace.
    """

    def __init__(self, state_dir: Path, warn: Callable[[str], None]):
        self.dir = state_dir
        self._warn = warn
        self.trace = ChromeTrace()
        self._log: EventLog | None = None
        try:
            state_dir.mkdir(parents=True, exist_ok=True)
            (state_dir / LAST_TRACE).unlink(missing_ok=True)
            self._log = EventLog(open_for_writing(state_dir / LAST_EVENTS), flush_each=False)
        except OSError as e:
            warn(f"warning: cannot keep this build's events in {state_dir}: {e.strerror}")

    def handle(self, event: ev.BuildEvent) -> None:
        if self._log is None:
            return
        if event.kind == ev.UP_TO_DATE or event.kind == ev.PLANNED:
            return
        self._log.handle(event)
        self.trace.handle(event)
        if event.kind == ev.BUILD_FINISHED:
            try:
                self.trace.write(self.dir / LAST_TRACE)
            except OSError as e:
                self._warn(f"warning: cannot write {self.dir / LAST_TRACE}: {e.strerror}")

    def close(self) -> None:
        if self._log is not None:
            self._log.close()
