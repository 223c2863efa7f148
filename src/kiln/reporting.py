"""Build events and the plain-line printer.

``ProgressReporter`` is the interface the scheduler talks to (the seed's
methods plus ``skip_dep``, ``explain``, ``progress`` and ``message``).
``PlainReporter`` prints one line per started action, with no control
characters, for CI logs and pipes. The live terminal display is in
``kiln.reporting_rich`` so that rich is imported only when it is used.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Set
from typing import IO, TYPE_CHECKING

from kiln.graph import BuildAction, BuildDependency

if TYPE_CHECKING:
    from kiln.scheduler import BuildResult


class ProgressReporter:
    """Receives build events; every method may be called from any thread."""

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


def count_actions(deps: Set[BuildDependency]) -> int:
    return sum(1 for d in deps if isinstance(d, BuildAction))


class PlainReporter(ProgressReporter):
    """``[3/12] Compiling foo`` lines on a stream; failures with their error."""

    def __init__(self, stream: IO[str], verbose: int = 0):
        self.stream = stream
        self.verbose = verbose
        self.total = 0
        self.done = 0
        self.started = 0
        self._lock = threading.Lock()

    def _write(self, line: str) -> None:
        with self._lock:
            self.stream.write(line + "\n")
            self.stream.flush()

    def start_graph(self, all_deps: Set[BuildDependency]) -> None:
        self.total = count_actions(all_deps)

    def start_dep(self, dep: BuildDependency) -> None:
        with self._lock:
            self.started += 1
            n = self.done + self.started
        self._write(f"[{min(n, self.total)}/{self.total}] {dep}")

    def skip_dep(self, dep: BuildDependency) -> None:
        with self._lock:
            self.done += 1
        if self.verbose:
            self._write(f"[{self.done}/{self.total}] up to date: {dep}")

    def finish_dep(self, dep: BuildDependency) -> None:
        with self._lock:
            self.done += 1
            self.started -= 1
        log = log_line(dep, self.verbose)
        if log:
            self._write(log)

    def report_failure(self, dep: BuildDependency) -> None:
        self._write(f"{failure_heading(dep)}\n{indent(error_text(dep.failure, self.verbose))}")

    def explain(self, dep: BuildDependency, reason: str) -> None:
        self._write(f"{dep}: {reason}")

    def message(self, text: str) -> None:
        self._write(text)


def failure_heading(dep: BuildDependency) -> str:
    """The first line of a failed action's report (iree.build's wording, which
    scripts and ported tests look for)."""
    return f"ERROR: Building '{dep}' failed:"


def error_text(error: BaseException | None, verbose: int = 0) -> str:
    """How a failure reads: kiln's own errors by message, others with a traceback."""
    if error is None:
        return ""
    from kiln.errors import KilnError

    remote = getattr(error, "remote_traceback", None)
    if remote is not None:  # raised in a worker process: the exception, or its traceback
        if verbose:
            return str(remote).rstrip()
        if isinstance(error, KilnError):
            return str(error)
        return f"{type(error).__name__}: {error}"
    if isinstance(error, KilnError) and not verbose:
        return str(error)
    return "".join(traceback.format_exception(error)).rstrip()


def log_line(dep: BuildDependency, verbose: int) -> str | None:
    """With ``-v``, where a successful action that keeps a log (a compile) wrote it."""
    path = getattr(dep, "log_path", None)
    if verbose and path and dep.failure is None:
        return f"  log of {dep}: {path}"
    return None


def indent(text: str, prefix: str = "  ") -> str:
    return "\n".join(prefix + line for line in text.splitlines())


def format_summary(result: BuildResult) -> str:
    parts = [f"{len(result.built)} built", f"{len(result.skipped)} up to date"]
    if result.would_run:
        parts.append(f"{len(result.would_run)} would run")
    parts += [f"{len(result.failed)} failed", f"{len(result.not_run)} not run"]
    status = "interrupted" if result.interrupted else ("done" if result.ok else "FAILED")
    return f"kiln: {status}: {', '.join(parts)} in {result.wall_s:.2f}s"


def format_root_causes(result: BuildResult, verbose: int) -> str:
    """One ``  * <desc>`` line per root cause (as iree.build prints them), then
    where the action was defined and its error."""
    lines = [f"{len(result.failed)} action(s) failed. Root causes:"]
    for action in result.failed:
        lines.append(f"  * {action}")
        lines.append(f"      defined at {action.def_site}")
        lines.append(indent(error_text(action.failure, verbose), "      "))
    return "\n".join(lines)
