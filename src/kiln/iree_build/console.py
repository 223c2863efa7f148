"""``iree.build.console``: the console progress reporter."""

from __future__ import annotations

from typing import IO

from kiln.graph.progress import ProgressReporter
from kiln.observe.summary import PlainReporter

__all__ = ["ConsoleProgressReporter"]


def ConsoleProgressReporter(  # noqa: N802 - iree.build's class name
    out: IO[str], *, rich_console: bool = True, long_display_time_threshold: float = 5
) -> ProgressReporter:
    """kiln's reporter for ``out``: the live display with ``rich_console``, else
    plain lines (iree.build's constructor, kiln's reporters)."""
    if not rich_console:
        return PlainReporter(out)
    from kiln.observe.live import RichReporter

    return RichReporter(
        out, long_threshold_s=float(long_display_time_threshold), force_terminal=True
    )
