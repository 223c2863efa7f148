"""What kiln prints on its terminal: text from users and servers, never raw control.

Descriptions, names, paths, errors and log tails come from build modules, the
commands they run and remote servers; printed raw, an escape sequence could clear
the screen, retitle the window or forge a "kiln: done" line. One rule holds for
every line kiln prints: control characters (C0 but newline and tab, DEL, C1, and
the bidirectional overrides that reorder what a line shows) are printed escaped,
as ``\\x1b`` or ``\\u202e``. Where kiln writes them:

- ``TerminalStream`` wraps kiln's stderr: everything written through it is escaped
  (newlines kept, they are kiln's line structure), so no message path can forget it.
- One-line fields (an action's description as ``str(action)``, the fields of the
  events the reporters print, ``displayed``) escape newlines too: a description
  never starts a line of its own.
- The live display writes its own escape sequences, so it alone writes through
  ``TerminalStream.raw``; every text it draws comes from ``printable``.
"""

from __future__ import annotations

import contextlib
import io
import re
from typing import IO, Any

# Controls but tab and newline; DEL and C1; the Unicode bidirectional controls.
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_CONTROLS_AND_LINES = re.compile(
    "[\x00-\x1f\x7f-\x9f\u061c\u200e\u200f\u2028\u2029\u202a-\u202e\u2066-\u2069]"
)
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group(0)
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def printable(text: str, *, one_line: bool = False) -> str:
    """``text`` with its control characters escaped; with ``one_line`` its newlines
    (and tabs) too. Text without any comes back as it is."""
    pattern = _CONTROLS_AND_LINES if one_line else _CONTROLS
    if pattern.search(text) is None:
        return text
    return pattern.sub(_escape, text)


class PrintableOutput(io.TextIOBase):
    """kiln's stdout (listings, built paths, help, graph text): every write escaped
    (``printable``; lines and tabs kept). Unlike ``TerminalStream`` its errors reach
    the caller: a closed stdout ends kiln quietly where the command line sees it."""

    def __init__(self, stream: IO[str]):
        super().__init__()
        self._stream = stream

    def write(self, text: str) -> int:
        self._stream.write(printable(text))
        return len(text)

    def flush(self) -> None:
        self._stream.flush()

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return self._stream.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._stream, "encoding", None) or "utf-8"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class TerminalStream(io.TextIOBase):
    """kiln's stderr. Every write is escaped (``printable``) and never raises once
    the reader has gone: a progress line must not break the thread that prints
    it (the SIGPIPE of such a write stops the build instead, see ``kiln.cli.main``).
    ``raw`` is the same stream unescaped, for the live display's own sequences."""

    def __init__(self, stream: IO[str]):
        super().__init__()
        self._stream = stream
        self.raw: IO[str] = _Unescaped(stream)  # type: ignore[assignment]

    def write(self, text: str) -> int:
        with contextlib.suppress(OSError, ValueError):
            self._stream.write(printable(text))
        return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return self._stream.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._stream, "encoding", None) or "utf-8"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


class _Unescaped(TerminalStream):
    """The stream as it is: written only by the live display, whose text is escaped
    before it is drawn."""

    def __init__(self, stream: IO[str]):
        io.TextIOBase.__init__(self)
        self._stream = stream
        self.raw = self  # type: ignore[assignment]

    def write(self, text: str) -> int:
        with contextlib.suppress(OSError, ValueError):
            self._stream.write(text)
        return len(text)


def raw_stream(stream: IO[str]) -> IO[str]:
    """The unescaped side of ``stream`` when it is a ``TerminalStream``, else itself."""
    return stream.raw if isinstance(stream, TerminalStream) else stream
