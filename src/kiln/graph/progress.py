"""The interface a build's observers implement: ``ProgressReporter``, the seed's
(iree.build's) reporter, which a user's reporter may subclass.

A reporter reads the build's event stream (``kiln.base.events``) through ``handle``;
the default ``handle`` turns each event into the seed's methods
(``start_graph``, ``start_dep``, ``skip_dep``, ``finish_dep``,
``report_failure``, ``end_graph``), so a subclass that overrides those keeps
working, and calls ``message`` for a ``note`` event and ``explain`` for an
action's start in a build that explains (``display_requests``). ``progress`` (a
download's bytes) and ``message`` are also called by the run services for what
actions report while they run.
"""

from __future__ import annotations

from collections.abc import Set
from typing import TYPE_CHECKING

from kiln.base import events as ev

if TYPE_CHECKING:
    from kiln.graph import BuildDependency


class ProgressReporter:
    """Receives build events; every method may be called from any thread.

    ``handle`` is the one entry point of build facts; the default hands each event
    to the method of the seed's interface that stands for it.
    """

    def handle(self, event: ev.BuildEvent) -> None:
        """Read one event of the stream (the adapter to the methods below)."""
        display_requests(self, event)
        kind = event.kind
        if kind == ev.STARTED:
            self.start_dep(event.subject)
        elif kind in (ev.UP_TO_DATE, ev.CACHED):
            self.skip_dep(event.subject)
        elif kind == ev.FINISHED:
            self.finish_dep(event.subject)
        elif kind == ev.FAILED:
            if event.unchanged:  # not run again: to the seed's interface, a failed start
                self.start_dep(event.subject)
            self.report_failure(event.subject)
            self.finish_dep(event.subject)
        elif kind == ev.BUILD_STARTED:
            self.start_graph(event.subject)
        elif kind == ev.BUILD_FINISHED:
            self.end_graph()

    def reset_display(self) -> None:
        """Clear any live display so that plain text can be printed."""

    def start_graph(self, all_deps: Set[BuildDependency]) -> None:
        """A build of these nodes begins."""

    def start_dep(self, dep: BuildDependency) -> None:
        """An action starts running."""

    def skip_dep(self, dep: BuildDependency) -> None:
        """An action is up to date and will not run."""

    def finish_dep(self, dep: BuildDependency) -> None:
        """An action finished (``dep.failure`` says whether it failed)."""

    def report_failure(self, dep: BuildDependency) -> None:
        """An action failed."""

    def explain(self, dep: BuildDependency, reason: str) -> None:
        """Why an action runs (``--explain``, ``--dry-run``)."""

    def progress(self, dep: BuildDependency, done: int, total: int | None) -> None:
        """Byte progress of a running action (a download)."""

    def message(self, text: str) -> None:
        """A line for the user, printed above any live display."""

    def end_graph(self) -> None:
        """The build is over."""


def display_requests(reporter: ProgressReporter, event: ev.BuildEvent) -> None:
    """What ``event`` asks a reporter to show besides the fact itself: a note
    (``message``), and, in a build that explains, why an action runs, or why
    one that failed before does not (``explain``). Every reporter's ``handle`` calls it first."""
    if event.kind == ev.NOTE:
        reporter.message(str((event.data or {}).get("text", "")))
    elif event.explain and event.kind in _EXPLAINED:
        reporter.explain(event.subject, event.reason or "")
    elif event.explain and event.unchanged:
        reporter.explain(event.subject, f"not run: {event.reason}; --retry-failed runs it")


_EXPLAINED = (ev.STARTED, ev.CACHED, ev.WOULD_RUN)
