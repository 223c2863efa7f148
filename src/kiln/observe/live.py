"""The live terminal display: an overall progress bar and the running actions, each
with the time it has been running.

Actions running longer than ``long_threshold_s`` are listed apart, under
``Waiting for long running actions:``, so a slow compile stands out from the
churn of short actions. Failures and messages print above the display.
The display is a reader of the build's event stream (``kiln.base.events``). It writes
its own escape sequences, so it writes to the terminal unescaped
(``kiln.base.terminal.raw_stream``): every text it draws is escaped first, events
through ``displayed``, messages through ``message_text``.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Iterator
from typing import IO, Any

from rich.console import Console, Group, RenderableType
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from kiln.base import events as ev
from kiln.base.terminal import message_text, printable, raw_stream
from kiln.graph import BuildDependency
from kiln.graph.progress import ProgressReporter, display_requests
from kiln.observe.summary import (
    displayed,
    elapsed,
    failure_heading,
    failure_text,
    indent,
    remote_worker,
    unchanged_line,
)

_MAX_RUNNING_SHOWN = 8
_REFRESH_S = 0.125
# Cursor up one line, then erase that line: how the display takes back a line.
_TAKE_BACK_LINE = "\x1b[A\x1b[2K"


def _fitted(text: str, rows: int) -> str:
    """``text`` (whole lines) cut to leave a row of a terminal ``rows`` tall free: a
    region as tall as the terminal scrolls its top away, and the next redraw can
    no longer take that back (a stale copy stays in the scrollback)."""
    lines = text.split("\n")[:-1]
    limit = max(1, rows - 1)
    if len(lines) <= limit:
        return text
    return "\n".join(lines[:limit]) + "\n"


class LiveRegion:
    """Lines drawn below everything else printed, redrawn in place.

    Invariant: outside ``_lock``, the cursor stands at the start of the line
    below the region, and the region is ``_height`` lines tall (0: not drawn),
    fewer than the terminal's rows; once stopped it stays erased.
    Every write to the console goes through this class while it is started.
    """

    def __init__(self, console: Console, renderable: RenderableType):
        self.console = console
        self.renderable = renderable
        self._lock = threading.RLock()
        self._height = 0
        self._drawn = ""
        self._closed = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self.draw()
        self._thread = threading.Thread(target=self._loop, name="kiln-display", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        with self._lock:
            self._closed = True
            self._erase()
            self.console.file.flush()

    def draw(self) -> None:
        with self._lock:
            if self._closed:
                return
            with self.console.capture() as capture:
                self.console.print(self.renderable)
            text = _fitted(capture.get(), self._rows())
            if self._height and text == self._drawn:
                return  # unchanged: spare the terminal (and logs) a redraw
            self._erase()
            self.console.file.write(text)
            self.console.file.flush()
            self._height = text.count("\n")
            self._drawn = text

    @contextlib.contextmanager
    def above(self) -> Iterator[None]:
        """Print above the region: take it back, let the caller print, draw it again."""
        with self._lock:
            drawn = self._height > 0
            self._erase()
            yield
            if drawn:
                self.draw()

    def _rows(self) -> int:
        """The terminal's height now (it may have been resized): asked of the
        terminal itself, as a ``LINES`` left in the environment may be stale."""
        try:
            return os.get_terminal_size(self.console.file.fileno()).lines
        except (AttributeError, OSError, ValueError):
            return self.console.size.height

    def _erase(self) -> None:
        if self._height:
            self.console.file.write("\r" + _TAKE_BACK_LINE * self._height)
            self._height = 0

    def _loop(self) -> None:
        while not self._stop.wait(_REFRESH_S):
            self.draw()


class RichReporter(ProgressReporter):
    """Live display on a terminal; failures and messages print above it."""

    def __init__(
        self,
        stream: IO[str],
        verbose: int = 0,
        long_threshold_s: float = 5.0,
        force_terminal: bool = False,
        failures: str = "full",
    ):
        self.failures = failures  # "full": a failure's details when it fails; "summary": none
        self.console = Console(
            file=raw_stream(stream), force_terminal=force_terminal or None, stderr=True
        )
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
        self._region: LiveRegion | None = None
        self._cached = 0

    def __rich__(self) -> Group:
        with self._lock:
            running = sorted(self._running.items(), key=lambda kv: kv[1])
            byte_progress = dict(self._bytes)
        now = time.monotonic()
        table = Table.grid(padding=(0, 1))
        long_table = Table.grid(padding=(0, 1))
        for dep, started in running[:_MAX_RUNNING_SHOWN]:
            took = now - started
            target = long_table if took >= self.long_threshold_s else table
            shown = f"{took:5.1f}s" if took < 60 else f"{elapsed(took):>6}"
            target.add_row(Text(shown, style="cyan"), _describe(dep, byte_progress))
        parts: list[Any] = [self._progress] + ([table] if table.row_count else [])
        if self._cached:
            parts.insert(1, Text(f"{self._cached} served from cache", style="green"))
        if long_table.row_count:
            parts += [Text("Waiting for long running actions:", style="yellow"), long_table]
        if len(running) > _MAX_RUNNING_SHOWN:
            parts.append(Text(f"... and {len(running) - _MAX_RUNNING_SHOWN} more running"))
        return Group(*parts)

    def handle(self, event: ev.BuildEvent) -> None:
        kind = event.kind
        display_requests(self, event)
        if kind == ev.UP_TO_DATE:  # the bulk of a no-op build: nothing to print
            self._progress.advance(self._task)
            return
        event = displayed(event)
        if kind == ev.STARTED:
            with self._lock:
                self._running[event.subject] = time.monotonic()
            self._redraw()  # at once: a short action is seen too
        elif kind == ev.FINISHED or kind == ev.FAILED:
            with self._lock:
                self._running.pop(event.subject, None)
                self._bytes.pop(event.subject, None)
            self._progress.advance(self._task)
            if event.unchanged:  # never started; the summary lists it
                if self.verbose:
                    self._print(unchanged_line(event.desc, event.log, event.error))
            elif kind == ev.FAILED:
                self._report_failure(event)
            elif self.verbose and event.log:
                self._print(f"  log of {event.desc}: {event.log}")
            if kind == ev.FINISHED and remote_worker(event) is not None:
                self._print(f"{event.desc}: ran on Dask worker {remote_worker(event)}")
        elif kind == ev.CACHED:
            with self._lock:
                self._cached += 1
            self._progress.advance(self._task)
            if self.verbose:
                self._print(f"cached: {event.desc}")
        elif kind == ev.BUILD_STARTED:
            total = (event.data or {}).get("actions", 0)
            self._progress.update(self._task, total=total, completed=0)
            self._region = LiveRegion(self.console, self)
            self._region.start()
        elif kind == ev.BUILD_FINISHED:
            self.end_graph()

    def _report_failure(self, event: ev.BuildEvent) -> None:
        if self.failures != "full":  # the summary lists it
            return
        with self._above():
            heading = failure_heading(event.desc or "")
            self.console.print(Text(message_text(heading), style="bold red"), soft_wrap=True)
            text = indent(failure_text(event, self.verbose))
            self.console.print(Text(message_text(text)), soft_wrap=True)

    def progress(self, dep: BuildDependency, done: int, total: int | None) -> None:
        with self._lock:
            self._bytes[dep] = (done, total)

    def explain(self, dep: BuildDependency, reason: str) -> None:
        self._print(f"{dep}: {printable(reason, one_line=True)}")

    def message(self, text: str) -> None:
        self._print(text)

    def reset_display(self) -> None:
        self._redraw()

    def end_graph(self) -> None:
        if self._region is not None:
            self._region.stop()
            self._region = None

    def _redraw(self) -> None:
        region = self._region
        if region is not None:
            region.draw()

    def _above(self) -> contextlib.AbstractContextManager[None]:
        region = self._region
        return region.above() if region is not None else contextlib.nullcontext()

    def _print(self, text: str) -> None:
        """Print ``text`` above the display, escaped (``kiln.base.terminal``)."""
        with self._above():
            self.console.print(Text(message_text(text)), soft_wrap=True)


def _describe(
    dep: BuildDependency, byte_progress: dict[BuildDependency, tuple[int, int | None]]
) -> Text:
    text = Text(str(dep))
    if dep in byte_progress:
        done, total = byte_progress[dep]
        size = f"{done / 1e6:.1f}/{total / 1e6:.1f} MB" if total else f"{done / 1e6:.1f} MB"
        text.append(f"  {size}", style="green")
    return text
