"""Action logs: what a subprocess prints goes straight to a file, never through
kiln's memory, and a failure shows a tail of it bounded in bytes and lines.

Logs live in ``OUTPUT_DIR/.kiln/logs/<output path>.log`` (``Executor.log_path``:
one per action, named after its output, replaced each time the action runs);
``kiln.execution.command_logs`` writes them.
"""

from __future__ import annotations

import os
from pathlib import Path

from kiln.base.terminal import printable
from kiln.execution.command_logs import open_log

__all__ = ["open_log", "read_tail", "short_diagnostic"]

TAIL_BYTES = 8 << 10
TAIL_LINES = 20


def read_tail(path: Path | str, max_bytes: int = TAIL_BYTES, max_lines: int = TAIL_LINES) -> str:
    """The last ``max_lines`` lines of the log, at most ``max_bytes`` of it as the
    terminal shows it (escaped); what is left out (earlier lines, or the start of one
    huge line) is said once, in a first line."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = max(0, size - max_bytes)
            f.seek(start)
            data = f.read(max_bytes)
    except OSError as e:
        return f"[cannot read the log {path}: {e.strerror}]"
    data = data.rstrip(b"\n")
    skipped = start
    lines = data.split(b"\n")
    if start and len(lines) > 1:  # the first line read is a piece of a longer one
        skipped += len(lines[0]) + 1
        lines = lines[1:]
    if len(lines) > max_lines:
        skipped += sum(len(line) + 1 for line in lines[:-max_lines])
        lines = lines[-max_lines:]
    text, cut = _shown(b"\n".join(lines).decode(errors="replace"), max_bytes)
    skipped += cut
    if skipped:
        text = f"[... {skipped} earlier bytes not shown; the whole output is in {path}]\n{text}"
    return text


def _shown(text: str, max_bytes: int) -> tuple[str, int]:
    """``text`` as the terminal shows it (``kiln.base.terminal.printable``: a control
    character takes four bytes), cut at the front to at most ``max_bytes`` of that,
    from the start of a line where one begins; and how many bytes of ``text`` went."""
    shown = printable(text)
    if len(shown.encode()) <= max_bytes:
        return shown, 0
    used, start = 0, len(text)
    while start > 0:
        cost = len(printable(text[start - 1]).encode())
        if used + cost > max_bytes:
            break
        used, start = used + cost, start - 1
    line = text.find("\n", start, len(text) - 1)
    if line >= 0:
        start = line + 1
    return printable(text[start:]), len(text[:start].encode())


def short_diagnostic(error: BaseException | str, max_lines: int = 8, max_chars: int = 600) -> str:
    """Condense an exception or text to a few lines, so messages stay readable."""
    text = str(error).strip() or type(error).__name__
    lines = text.splitlines()
    if len(lines) > max_lines:
        lines = [*lines[:max_lines], f"... ({len(lines) - max_lines} more lines)"]
    text = "\n".join(lines)
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def shown_path(path: str) -> str:
    """``path`` as a message names it: absolute, a source file's link followed.
    Actions' programs are given paths relative to the directory they run in (the
    output directory, source files through links in ``.kiln/src``), which a reader
    of the message is not in."""
    return os.path.realpath(path)
