"""Reporters: readers of the build's event stream, and the plain-line printer.

The scheduler emits ``kiln.base.events.BuildEvent``s; every reporter reads them
through ``handle`` (``kiln.graph.progress.ProgressReporter``, the interface a user's
reporter subclasses, re-exported here). ``PlainReporter`` prints one line per
started action, with no control characters, for CI logs and pipes. The live
terminal display is in ``kiln.observe.live`` so that rich is imported only
when it is used. Both print events through ``displayed`` and text through
``kiln.base.terminal.printable``: what users and servers wrote reaches the terminal
escaped (``kiln.base.terminal``).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import IO, TYPE_CHECKING

from kiln.base import events as ev
from kiln.base.errors import error_text
from kiln.base.terminal import message_text, printable, shorten_arguments
from kiln.graph import BuildDependency
from kiln.graph.progress import ProgressReporter, display_requests

if TYPE_CHECKING:
    from kiln.engine.result import BuildResult

__all__ = [
    "PlainReporter",
    "ProgressReporter",
    "displayed",
    "error_line",
    "error_text",
    "format_root_causes",
    "format_success",
    "format_summary",
    "remote_worker",
    "unchanged_line",
]

# The most characters of an error shown on an unchanged failure's one line.
_ERROR_LINE_CHARS = 240
# The fields of an event that a reporter prints as (part of) one line.
_ONE_LINE_FIELDS = ("desc", "lane", "target", "log")


def displayed(event: ev.BuildEvent) -> ev.BuildEvent:
    """``event`` as a terminal shows it: its one-line fields (description, lane,
    target, log path) with newlines and other control characters escaped. The
    event itself when none has any (the usual case: nothing is copied)."""
    changed = {}
    for name in _ONE_LINE_FIELDS:
        value = getattr(event, name)
        if isinstance(value, str):
            shown = printable(value, one_line=True)
            if shown is not value:
                changed[name] = shown
    if not changed:
        return event
    copy = ev.BuildEvent(event.kind, event.time)
    copy.__dict__.update(event.__dict__)
    copy.__dict__.update(changed)
    copy.__dict__.pop("_json", None)  # the JSON text is the event's own, not the display's
    return copy


def remote_worker(event: ev.BuildEvent) -> str | None:
    """The cluster worker that ran an action (``kiln.execution.cluster``), else None."""
    lane = event.lane or ""
    return lane.removeprefix("dask ") if lane.startswith("dask ") else None


class PlainReporter(ProgressReporter):
    """``[3/12] Compiling foo`` lines on a stream; failures with their error.

    A reader of the event stream: every line comes from an event's fields. While a
    build runs, a ``Heartbeat`` prints a line for each action that has been running
    for another ``heartbeat_s`` seconds (0: never), so a long action shows life.
    """

    def __init__(
        self,
        stream: IO[str],
        verbose: int = 0,
        heartbeat_s: float = 30.0,
        failures: str = "full",
    ):
        self.stream = stream
        self.verbose = verbose
        self.failures = failures  # "full": a failure's details when it fails; "summary": none
        self.total = 0
        self.done = 0
        self.started = 0
        self._lock = threading.Lock()
        self._heartbeat = Heartbeat(heartbeat_s, self._write) if heartbeat_s > 0 else None

    def _write(self, line: str) -> None:
        with self._lock:
            self.stream.write(message_text(line) + "\n")
            self.stream.flush()

    def handle(self, event: ev.BuildEvent) -> None:
        kind = event.kind
        display_requests(self, event)
        if kind == ev.UP_TO_DATE and not self.verbose:  # the bulk of a no-op build
            self.done += 1
            return
        event = displayed(event)
        if self._heartbeat is not None:
            self._heartbeat.handle(event)
        if kind == ev.STARTED:
            self.started += 1
            self._write(f"[{min(self.done + self.started, self.total)}/{self.total}] {event.desc}")
        elif event.unchanged:  # never started; the summary lists it
            self.done += 1
            if self.verbose:
                line = unchanged_line(event.desc, event.log, event.error)
                self._write(f"[{self.done}/{self.total}] {line}")
        elif kind == ev.FINISHED or kind == ev.FAILED:
            self.done += 1
            self.started -= 1
            if kind == ev.FAILED and self.failures == "full":
                heading = failure_heading(event.desc or "")
                self._write(f"{heading}\n{indent(failure_text(event, self.verbose))}")
            elif self.verbose and event.log:
                self._write(f"  log of {event.desc}: {event.log}")
            if kind == ev.FINISHED and remote_worker(event) is not None:
                self._write(f"  {event.desc}: ran on Dask worker {remote_worker(event)}")
        elif kind == ev.UP_TO_DATE:
            self.done += 1
            if self.verbose:
                self._write(f"[{self.done}/{self.total}] up to date: {event.desc}")
        elif kind == ev.CACHED:
            self.done += 1
            self._write(f"[{self.done}/{self.total}] cached: {event.desc}")
        elif kind == ev.BUILD_STARTED:
            self.total = (event.data or {}).get("actions", 0)

    def explain(self, dep: BuildDependency, reason: str) -> None:
        self._write(f"{dep}: {printable(reason, one_line=True)}")

    def message(self, text: str) -> None:
        self._write(text)


class Heartbeat:
    """Prints ``still running (1m30s): DESC`` for each action every ``interval_s``
    seconds of its run, from a thread of its own that lives from ``build_started``
    to ``build_finished``; driven by the events alone.

    Invariant: ``_running`` holds the actions started and not yet ended, each with
    the monotonic time it started and the next time its line is due, which is
    never less than ``interval_s`` after its last line. ``_wake`` is when the
    thread's wait ends (None: until it is woken); a start wakes it only when its
    line falls due before that, so a build of many short actions does not wake it
    at every start.
    """

    def __init__(self, interval_s: float, write: Callable[[str], None]):
        self.interval_s = interval_s
        self._write = write
        self._running: dict[object, tuple[str, float, float]] = {}
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._wake: float | None = None

    def handle(self, event: ev.BuildEvent) -> None:
        kind = event.kind
        key = event.action or id(event.subject)
        with self._changed:
            if kind == ev.STARTED:
                now = time.monotonic()
                due = now + self.interval_s
                self._running[key] = (event.desc or "", now, due)
                if self._wake is None or due < self._wake:
                    self._changed.notify()
            elif kind in ev.ENDINGS:
                self._running.pop(key, None)
            elif kind == ev.BUILD_STARTED and self._thread is None:
                self._stopped, self._wake = False, None  # nothing of a build before
                self._thread = threading.Thread(target=self._beat, name="kiln-heartbeat")
                self._thread.daemon = True
                self._thread.start()
            elif kind == ev.BUILD_FINISHED:
                self._stopped = True
                self._running.clear()
                self._changed.notify()
        if kind == ev.BUILD_FINISHED and self._thread is not None:
            self._thread.join()
            self._thread = None

    def _beat(self) -> None:
        with self._changed:
            while not self._stopped:
                now = time.monotonic()
                due = sorted((v[2], v[1], k) for k, v in self._running.items() if v[2] <= now)
                for _, started, key in due:
                    desc = self._running[key][0]
                    self._write(f"still running ({elapsed(now - started)}): {desc}")
                    # From now, not from when it was due: a late pass (a blocked
                    # stream, a busy process) prints one line, not one per missed beat.
                    self._running[key] = (desc, started, time.monotonic() + self.interval_s)
                self._wake = min((v[2] for v in self._running.values()), default=None)
                wait = None if self._wake is None else max(0.0, self._wake - time.monotonic())
                self._changed.wait(wait)


def elapsed(seconds: float) -> str:
    """A duration as a person reads it at a glance: ``42s``, ``5m03s``, ``2h07m``."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole}s"
    if whole < 3600:
        return f"{whole // 60}m{whole % 60:02d}s"
    return f"{whole // 3600}h{whole % 3600 // 60:02d}m"


def failure_heading(dep: BuildDependency | str) -> str:
    """The first line of a failed action's report (iree.build's wording, which
    scripts and ported tests look for)."""
    return f"ERROR: Building '{dep}' failed:"


def failure_text(event: ev.BuildEvent, verbose: int) -> str:
    """How a ``failed`` event reads on the console: with ``-v`` the traceback."""
    if verbose and event.traceback:
        return event.traceback
    return event.error or ""


def indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def format_success(result: BuildResult) -> str | None:
    """iree.build's line after a build that succeeded (its count: the actions that
    are built now, run or not); None after a build that ran and restored nothing,
    whose one summary is kiln's ``0 built, N up to date``."""
    if not result.built and not result.cached:
        return None
    return (
        f"Successfully built {len(result.built) + len(result.cached) + len(result.skipped)} actions"
    )


def format_summary(result: BuildResult) -> str:
    parts = [f"{len(result.built)} built"]
    if result.cached:
        parts.append(f"{len(result.cached)} cached")
    parts.append(f"{len(result.skipped)} up to date")
    if result.would_run:
        parts.append(f"{len(result.would_run)} would run")
    unchanged = len(result.unchanged())
    parts.append(f"{len(result.failed) - unchanged} failed")
    if unchanged:
        parts.append(f"{unchanged} failed (unchanged)")
    parts.append(f"{len(result.not_run)} not run")
    if result.not_reproducible:
        actions = {d.action for d in result.not_reproducible}
        parts.append(f"{len(actions)} not reproducible")
    status = "interrupted" if result.interrupted else ("done" if result.ok else "FAILED")
    return f"kiln: {status}: {', '.join(parts)} in {result.wall_s:.2f}s"


def format_root_causes(result: BuildResult, verbose: int, failures: str = "full") -> str:
    """What the build says of its failures at the end, each failure's details said
    once: iree.build's words (``ERROR: Failed to build N actions. Root causes:``,
    one ``  * <desc>`` line per root cause; N counts the actions that failed and
    those not run because of them) with where each was defined; its error only with
    ``failures="summary"`` (one line: the reporter printed none when it failed),
    since with ``full`` the reporter printed it then. The actions that failed
    unchanged (not run again) are one line, listed each only with ``-v``."""
    unchanged = result.unchanged()
    fresh = [a for a in result.failed if a not in unchanged]
    lines = []
    if fresh:
        count = len(result.failed) + len(result.not_run)
        lines.append(f"ERROR: Failed to build {count} actions. Root causes:")
    for action in fresh:
        lines.append(f"  * {action}")
        lines.append(f"      defined at {action.def_site}")
        if failures != "full":
            error = result.errors.get(action)
            log = getattr(error, "log", None)
            lines.append(f"      {error_line(error_text(error, 0))}")
            if log:
                lines.append(f"      log: {log}")
    if unchanged:
        lines.append(
            f"kiln: {len(unchanged)} action(s) failed as in an earlier build, with the same "
            "key, and were not run again (kiln build --retry-failed runs them"
            + ("" if verbose else "; -v lists them")
            + ")"
        )
    if verbose:
        for action in unchanged:
            error = result.errors[action]
            log = getattr(error, "log", None)
            lines.append(f"  * {unchanged_line(str(action), log, str(error))}")
            lines.append(indent(error_text(error, verbose), "      "))
    return "\n".join(lines)


def unchanged_line(desc: str | None, log: str | None, error: str | None) -> str:
    """How an action that failed unchanged reads on one line: with its log's path,
    or, without a log, the line of its error that names it."""
    if log and os.path.isfile(log):
        return f"{desc} failed (unchanged; log: {log})"
    gone = f"; its log {log} was removed" if log else ""
    return f"{desc} failed (unchanged{gone}): {error_line(error or '')}"


def error_line(error: str) -> str:
    """The line of an error's text that names it, shortened: a traceback's last line
    (the exception), else the first (with the next, when it ends in a colon)."""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    if not lines:
        return ""
    said = lines[-1] if lines[0].startswith("Traceback") else lines[0]
    if said is lines[0] and said.endswith(":") and len(lines) > 1:
        said = f"{said} {lines[1]}"
    said = shorten_arguments(said)  # before the cut: a flag's count stays whole
    if len(said) > _ERROR_LINE_CHARS:
        said = said[: _ERROR_LINE_CHARS - 3] + "..."
    return printable(said, one_line=True)
