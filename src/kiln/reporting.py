"""Reporters: readers of the build's event stream, and the plain-line printer.

The scheduler emits ``kiln.events.BuildEvent``s; every reporter reads them
through ``handle`` (``kiln.progress.ProgressReporter``, the interface a user's
reporter subclasses, re-exported here). ``PlainReporter`` prints one line per
started action, with no control characters, for CI logs and pipes. The live
terminal display is in ``kiln.reporting_rich`` so that rich is imported only
when it is used. Both print events through ``displayed`` and text through
``kiln.terminal.printable``: what users and servers wrote reaches the terminal
escaped (``kiln.terminal``).
"""

from __future__ import annotations

import threading
from collections.abc import Set
from typing import IO, TYPE_CHECKING

from kiln import events as ev
from kiln.errors import error_text
from kiln.graph import BuildAction, BuildDependency
from kiln.progress import ProgressReporter, display_requests
from kiln.terminal import printable

if TYPE_CHECKING:
    from kiln.result import BuildResult

__all__ = [
    "PlainReporter",
    "ProgressReporter",
    "displayed",
    "error_text",
    "format_root_causes",
    "format_success",
    "format_summary",
    "remote_worker",
]

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
    return copy


def remote_worker(event: ev.BuildEvent) -> str | None:
    """The cluster worker that ran an action (``kiln.remote_exec``), else None."""
    lane = event.lane or ""
    return lane.removeprefix("dask ") if lane.startswith("dask ") else None


def count_actions(deps: Set[BuildDependency]) -> int:
    return sum(1 for d in deps if isinstance(d, BuildAction))


class PlainReporter(ProgressReporter):
    """``[3/12] Compiling foo`` lines on a stream; failures with their error.

    A reader of the event stream: every line comes from an event's fields.
    """

    def __init__(self, stream: IO[str], verbose: int = 0):
        self.stream = stream
        self.verbose = verbose
        self.total = 0
        self.done = 0
        self.started = 0
        self._lock = threading.Lock()

    def _write(self, line: str) -> None:
        with self._lock:
            self.stream.write(printable(line) + "\n")
            self.stream.flush()

    def handle(self, event: ev.BuildEvent) -> None:
        kind = event.kind
        display_requests(self, event)
        if kind == ev.UP_TO_DATE and not self.verbose:  # the bulk of a no-op build
            self.done += 1
            return
        event = displayed(event)
        if kind == ev.STARTED:
            self.started += 1
            self._write(f"[{min(self.done + self.started, self.total)}/{self.total}] {event.desc}")
        elif kind == ev.FINISHED or kind == ev.FAILED:
            self.done += 1
            self.started -= 1
            if kind == ev.FAILED:
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


def format_success(result: BuildResult) -> str:
    """iree.build's line after a build that succeeded (its count: the actions that
    are built now, run or not)."""
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
    parts += [f"{len(result.failed)} failed", f"{len(result.not_run)} not run"]
    if result.not_reproducible:
        actions = {d.action for d in result.not_reproducible}
        parts.append(f"{len(actions)} not reproducible")
    status = "interrupted" if result.interrupted else ("done" if result.ok else "FAILED")
    return f"kiln: {status}: {', '.join(parts)} in {result.wall_s:.2f}s"


def format_root_causes(result: BuildResult, verbose: int) -> str:
    """iree.build's words (``ERROR: Failed to build N actions. Root causes:``, one
    ``  * <desc>`` line per root cause; N counts the actions that failed and those
    not run because of them), then where each was defined and its error."""
    count = len(result.failed) + len(result.not_run)
    lines = [f"ERROR: Failed to build {count} actions. Root causes:"]
    for action in result.failed:
        lines.append(f"  * {action}")
        lines.append(f"      defined at {action.def_site}")
        lines.append(indent(error_text(result.errors.get(action), verbose), "      "))
    return "\n".join(lines)
