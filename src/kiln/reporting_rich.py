"""The live terminal display: an overall progress bar and the running actions.

Actions running longer than ``long_threshold_s`` are listed apart as
long-running, so a slow compile stands out from the churn of short actions.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Set
from typing import IO, Any

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from kiln.graph import BuildDependency
from kiln.reporting import ProgressReporter, count_actions, error_text, indent, log_line

_MAX_RUNNING_SHOWN = 8


class RichReporter(ProgressReporter):
    """Live display on a terminal; failures and messages print above it."""

    def __init__(
        self,
        stream: IO[str],
        verbose: int = 0,
        long_threshold_s: float = 5.0,
        force_terminal: bool = False,
    ):
        self.console = Console(file=stream, force_terminal=force_terminal or None, stderr=True)
        self.verbose = verbose
        self.long_threshold_s = long_threshold_s
        self._lock = threading.Lock()
        self._running: dict[BuildDependency, float] = {}
        self._bytes: dict[BuildDependency, tuple[int, int | None]] = {}
        self._progress = Progress(
            TextColumn("[bold]kiln"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
        )
        self._task = self._progress.add_task("build", total=0)
        self._live: Live | None = None

    def __rich__(self) -> Group:
        with self._lock:
            running = sorted(self._running.items(), key=lambda kv: kv[1])
            byte_progress = dict(self._bytes)
        now = time.monotonic()
        table = Table.grid(padding=(0, 1))
        long_table = Table.grid(padding=(0, 1))
        for dep, started in running[:_MAX_RUNNING_SHOWN]:
            elapsed = now - started
            target = long_table if elapsed >= self.long_threshold_s else table
            target.add_row(Text(f"{elapsed:5.1f}s", style="cyan"), _describe(dep, byte_progress))
        parts: list[Any] = [self._progress, table]
        if long_table.row_count:
            parts += [Text("long-running:", style="yellow"), long_table]
        if len(running) > _MAX_RUNNING_SHOWN:
            parts.append(Text(f"... and {len(running) - _MAX_RUNNING_SHOWN} more running"))
        return Group(*parts)

    def start_graph(self, all_deps: Set[BuildDependency]) -> None:
        self._progress.update(self._task, total=count_actions(all_deps), completed=0)
        self._live = Live(self, console=self.console, refresh_per_second=8, transient=True)
        self._live.start()

    def start_dep(self, dep: BuildDependency) -> None:
        with self._lock:
            self._running[dep] = time.monotonic()

    def skip_dep(self, dep: BuildDependency) -> None:
        self._progress.advance(self._task)

    def finish_dep(self, dep: BuildDependency) -> None:
        with self._lock:
            self._running.pop(dep, None)
            self._bytes.pop(dep, None)
        self._progress.advance(self._task)
        log = log_line(dep, self.verbose)
        if log:
            self.console.print(Text(log))

    def progress(self, dep: BuildDependency, done: int, total: int | None) -> None:
        with self._lock:
            self._bytes[dep] = (done, total)

    def report_failure(self, dep: BuildDependency) -> None:
        self.console.print(Text(f"FAILED: {dep}", style="bold red"))
        self.console.print(Text(indent(error_text(dep.failure, self.verbose))))

    def explain(self, dep: BuildDependency, reason: str) -> None:
        self.console.print(Text(f"{dep}: {reason}"))

    def message(self, text: str) -> None:
        self.console.print(Text(text))

    def reset_display(self) -> None:
        if self._live is not None:
            self._live.refresh()

    def end_graph(self) -> None:
        if self._live is not None:
            self._live.stop()
            self._live = None


def _describe(
    dep: BuildDependency, byte_progress: dict[BuildDependency, tuple[int, int | None]]
) -> Text:
    text = Text(str(dep))
    if dep in byte_progress:
        done, total = byte_progress[dep]
        size = f"{done / 1e6:.1f}/{total / 1e6:.1f} MB" if total else f"{done / 1e6:.1f} MB"
        text.append(f"  {size}", style="green")
    return text
