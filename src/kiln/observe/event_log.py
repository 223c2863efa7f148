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
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from kiln.base import events as ev
from kiln.base.errors import NotRegularFile, StateError, UsageError
from kiln.output_dir.ownership import open_own_file, open_regular
from kiln.output_dir.writing import atomic_output

LAST_EVENTS = "last-events.jsonl"
LAST_TRACE = "last-trace.json"
KEPT_BUILDS = 5  # the events of the last build and of the 4 before it stay in .kiln/


def kept_events(n: int) -> str:
    """The name, in ``.kiln/``, of the events of the build ``n`` builds before the
    last (0: the last build)."""
    return LAST_EVENTS if n == 0 else f"previous-{n}-events.jsonl"


def is_kept_events(name: str) -> bool:
    """Whether ``name`` (in ``.kiln/``) is one of the kept builds' events files."""
    return any(name == kept_events(n) for n in range(KEPT_BUILDS))


def _keep_previous(state_dir: Path) -> None:
    """Shift the kept builds' events one place back, the oldest dropped, so that a
    new build's events can start. Only regular files move, each renamed within
    ``.kiln/`` (nothing is followed; anything else planted there stays where it is,
    and opening the new events file over it fails with a warning); one that cannot
    move is left for the next build to drop."""
    for n in range(KEPT_BUILDS - 1, 0, -1):
        source = state_dir / kept_events(n - 1)
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(source).st_mode):
                os.replace(source, state_dir / kept_events(n))


_RSS_EVERY_S = 0.02  # at most 50 memory samples a second
_FLUSH_EVERY_S = 0.5  # the buffered log of .kiln/ is flushed this often


def open_for_writing(path: Path) -> IO[str]:
    """Open ``path`` new or truncated, never following a symlink at its name, never
    blocking on a FIFO: anything but a regular file there is NotRegularFile, and is
    left as it was (it is truncated only once it is known to be a regular file)."""
    fd = open_regular(path, flags=os.O_WRONLY | os.O_CREAT)
    os.ftruncate(fd, 0)
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
        except NotRegularFile as e:
            raise UsageError(
                f"{option} {path}: cannot write it: {e} (kiln never "
                "writes through a link, nor waits on a FIFO); name a regular file"
            ) from None
        except OSError as e:
            raise UsageError(f"{option} {path}: cannot write it: {e.strerror}") from e

    def handle(self, event: ev.BuildEvent) -> None:
        if self._failed:
            return
        try:
            self._stream.write(event.json_text() + "\n")
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
    Slices are kept as compact tuples and turned into trace events only when
    written, so a trace of many actions costs little memory while the build
    runs. The running-actions counter is made from the slices' own start and end
    times: events arrive in the order the scheduler learns of them, and a worker
    may start its next action before its last one's end is processed.
    """

    def __init__(self) -> None:
        self._t0: float | None = None
        self._pid = os.getpid()
        self._name = "kiln build"
        self._lanes: dict[str, int] = {}
        self._slices: list[tuple[Any, ...]] = []
        self._open: dict[str | None, float] = {}
        self._memory: list[tuple[float, float]] = []
        self._sampled = 0.0
        self._end: float | None = None
        self._other: dict[str, Any] = {"schema": ev.SCHEMA}

    def _us(self, t: float) -> float:
        return round((t - (self._t0 or t)) * 1e6, 1)

    def _tid(self, lane: str) -> int:
        tid = self._lanes.get(lane)
        if tid is None:
            tid = self._lanes[lane] = len(self._lanes) + 1
        return tid

    def handle(self, event: ev.BuildEvent) -> None:
        kind = event.kind
        if kind == ev.STARTED:
            self._tid(event.lane or "main")
            self._open[event.action] = event.time
            self._sample(event.time)
        elif kind in (ev.FINISHED, ev.FAILED, ev.CACHED) and not event.unchanged:
            start = event.start if event.start is not None else event.time
            outputs = tuple(o["path"] for o in event.outputs or ())
            self._slices.append(
                (
                    event.desc,
                    kind,
                    self._tid(event.lane or "main"),
                    start,
                    event.duration or 0.0,
                    event.action,
                    event.key,
                    event.reason,
                    event.target,
                    event.type,
                    outputs,
                    event.bytes or 0,
                    event.error,
                )
            )
            self._open.pop(event.action, None)
            self._sample(event.time)
        elif kind == ev.BUILD_STARTED:
            data = event.data or {}
            self._t0 = event.time
            self._pid = data.get("pid", self._pid)
            self._name = f"kiln build {' '.join(data.get('targets', []))}".strip()
            self._other.update(
                started=event.time, actions=data.get("actions"), jobs=data.get("jobs")
            )
            self._sample(event.time, force=True)
        elif kind == ev.BUILD_FINISHED:
            self._sample(event.time, force=True)
            self._end = event.time
            self._other.update(event.data or {})

    def _sample(self, t: float, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self._sampled >= _RSS_EVERY_S:
            self._sampled = now
            self._memory.append((t, round(rss_bytes() / 2**20, 1)))

    def trace_texts(self) -> Iterator[str]:
        """Every event of the trace as a line of JSON, made as it is asked for. The
        bulk, a slice per action and the counters, is written from its fields
        directly, without a dict per event."""
        pid, encode = self._pid, _encode
        yield encode(
            {"ph": "M", "name": "process_name", "pid": pid, "tid": 0, "args": {"name": self._name}}
        )
        for lane, tid in self._lanes.items():
            yield encode(
                {"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": lane}}
            )
            yield encode(
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "pid": pid,
                    "tid": tid,
                    "args": {"sort_index": tid},
                }
            )
        value, us = ev.json_value, self._us
        for (
            desc,
            kind,
            tid,
            start,
            duration,
            action,
            key,
            reason,
            target,
            type_,
            outputs,
            size,
            error,
        ) in self._slices:
            cached = kind == ev.CACHED
            args = (
                f'{{"action": {value(action)}, "key": {value(key)}, '
                f'"reason": {value(reason)}, "cached": {"true" if cached else "false"}, '
                f'"target": {value(target)}, "type": {value(type_)}, '
                f'"outputs": [{", ".join(map(value, outputs))}], "bytes": {value(size)}, '
                f'"status": {value(kind)}' + (f', "error": {value(error)}}}' if error else "}")
            )
            yield (
                f'{{"ph": "X", "name": {value(desc)}, '
                f'"cat": "{"cached" if cached else "action"}", "pid": {pid}, "tid": {tid}, '
                f'"ts": {value(us(start))}, "dur": {value(round(duration * 1e6, 1))}, '
                f'"args": {args}}}'
            )
        for t, running in self._running_counter():
            yield (
                f'{{"ph": "C", "name": "running actions", "pid": {pid}, '
                f'"ts": {value(us(t))}, "args": {{"running": {running}}}}}'
            )
        for t, mb in self._memory:
            yield (
                f'{{"ph": "C", "name": "kiln memory", "pid": {pid}, '
                f'"ts": {value(us(t))}, "args": {{"rss_mb": {value(mb)}}}}}'
            )
        if self._end is not None:
            yield encode(
                {
                    "ph": "i",
                    "s": "g",
                    "name": "build finished",
                    "pid": pid,
                    "tid": 0,
                    "ts": us(self._end),
                }
            )

    def _running_counter(self) -> Iterator[tuple[float, int]]:
        """The running-actions counter, (time, running), from the start and end of
        every action that ran (those never ended count as running to the end of the
        trace)."""
        points = [(s[3], 1) for s in self._slices if s[1] != ev.CACHED]
        points += [(s[3] + s[4], -1) for s in self._slices if s[1] != ev.CACHED]
        points += [(start, 1) for start in self._open.values()]
        points.sort()  # at a tie an end (-1) comes first
        running = 0
        for t, delta in points:
            running += delta
            yield t, running

    def write(self, path: Path) -> None:
        """Save the trace, one event at a time (never the whole text in memory)."""
        with atomic_output(path) as tmp, open(tmp, "w", encoding="utf-8") as f:
            f.write('{"traceEvents": [\n')
            f.writelines((",\n" if i else "") + text for i, text in enumerate(self.trace_texts()))
            other = json.dumps(self._other, default=str)
            f.write(f'\n], "displayTimeUnit": "ms", "otherData": {other}}}\n')


_encode = json.JSONEncoder(default=str, check_circular=False).encode


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
    """Keeps the last build's events and trace in ``.kiln/`` for ``kiln report``,
    and the events of the ``KEPT_BUILDS - 1`` builds before it (``kept_events``).

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
            _keep_previous(state_dir)
            # kiln's own file: never through a link, never blocked on a planted FIFO.
            fd = open_own_file(state_dir / LAST_EVENTS, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
            self._log = EventLog(os.fdopen(fd, "w", encoding="utf-8"), flush_each=False)
        except (OSError, StateError) as e:
            reason = e.strerror if isinstance(e, OSError) else str(e)
            warn(f"warning: cannot keep this build's events in {state_dir}: {reason}")

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
