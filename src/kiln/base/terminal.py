"""What kiln prints on its terminal: text from users and servers, never raw control.

Descriptions, names, paths, errors and log tails come from build modules, the
commands they run and remote servers; printed raw, an escape sequence could clear
the screen, retitle the window or forge a "kiln: done" line. One rule holds for
every line kiln prints: control characters (C0 but newline and tab, DEL, C1, and
the bidirectional overrides that reorder what a line shows) are printed escaped,
as ``\\x1b`` or ``\\u202e``. Where kiln writes them:

- ``TerminalStream`` wraps kiln's stderr: everything written through it is escaped
  (newlines kept, they are kiln's line structure), so no message path can forget it.
- ``PrintableOutput`` wraps kiln's stdout (listings, built paths, help, graph text)
  the same way, but lets its errors through: a closed stdout is handled by the
  command line.
- User code writes through ``TerminalStream`` too: while kiln runs it in its own
  process, its ``sys.stdout`` and ``sys.stderr`` are streams of that kind onto kiln's
  stderr (``user_streams``), bytes written to their ``buffer`` included; what a
  worker process prints is escaped on its way (``kiln.execution.process.worker_output``).
- One-line fields (an action's description as ``str(action)``, the fields of the
  events the reporters print, ``displayed``) escape newlines too: a description
  never starts a line of its own.
- The live display writes its own escape sequences, so it alone writes through
  ``TerminalStream.raw``; every text it draws comes from ``printable``.
"""

from __future__ import annotations

import codecs
import contextlib
import io
import re
from collections.abc import Iterator
from typing import IO, Any

from kiln.base.errors import OutputLost

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


# A command-line argument longer than this is shown shortened in kiln's messages.
LONG_ARGUMENT = 100
_SHOWN_OF_LONG = 60
_LONG_FLAG = re.compile(rf"(?<!\S)-\S{{{LONG_ARGUMENT},}}")


def shorten_arguments(text: str) -> str:
    """``text`` with each flag (a word starting with ``-``) longer than
    ``LONG_ARGUMENT`` characters shown as its start and ``…(N chars)``: a
    ``--iree-llvmcpu-target-cpu-features=...`` of 2 KB reads in one glance."""
    if len(text) <= LONG_ARGUMENT:
        return text
    return _LONG_FLAG.sub(lambda m: f"{m[0][:_SHOWN_OF_LONG]}…({len(m[0])} chars)", text)


def message_text(text: str, *, one_line: bool = False) -> str:
    """How a reporter prints ``text``: long flags shortened, then escaped
    (``printable``). Every line a reporter writes goes through this."""
    return printable(shorten_arguments(text), one_line=one_line)


class PrintableOutput(io.TextIOBase):
    """kiln's stdout (listings, built paths, help, graph text): every write escaped
    (``printable``; lines and tabs kept). Unlike ``TerminalStream`` its errors reach
    the caller: a closed stdout ends kiln quietly where the command line sees it."""

    def __init__(self, stream: IO[str]):
        super().__init__()
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            self._stream.write(printable(text))
        except BrokenPipeError:  # the reader went away: kiln.cli.main ends quietly
            raise
        except (OSError, ValueError, AttributeError) as e:
            raise OutputLost(_lost(e)) from None
        return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            raise
        except (OSError, ValueError, AttributeError) as e:
            raise OutputLost(_lost(e)) from None

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return self._stream.isatty()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self._stream, "encoding", None) or "utf-8"

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


def _lost(error: Exception) -> str:
    # no strerror: no stream at all (Python's sys.stdout when descriptor 1 is closed)
    why = error.strerror if isinstance(error, OSError) and error.strerror else "it is closed"
    return f"cannot write to standard output: {why}; what kiln printed there is lost"


class TerminalStream(PrintableOutput):
    """kiln's stderr. Every write is escaped (``printable``) and never raises once
    the reader has gone: a progress line must not break the thread that prints
    it (the SIGPIPE of such a write stops the build instead, see ``kiln.cli.main``).
    ``raw`` is the same stream unescaped, for the live display's own sequences;
    ``buffer`` takes bytes, decoded (what does not decode shown as ``\\xNN``) and
    written escaped. Closing it closes neither: ``stream`` stays open."""

    def __init__(self, stream: IO[str]):
        super().__init__(stream)
        self.raw: IO[str] = _Unescaped(stream)  # type: ignore[assignment]
        self._bytes: _Bytes | None = None

    @property
    def buffer(self) -> IO[bytes]:
        if self._bytes is None:
            self._bytes = _Bytes(self)
        return self._bytes  # type: ignore[return-value]

    def twin(self) -> TerminalStream:
        """Another escaped stream onto the same terminal, to be closed on its own."""
        return TerminalStream(self._stream)

    def write(self, text: str) -> int:
        with contextlib.suppress(OSError, ValueError):
            self._stream.write(printable(text))
        return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self._stream.flush()


class _Unescaped(TerminalStream):
    """The stream as it is: written only by the live display, whose text is escaped
    before it is drawn."""

    def __init__(self, stream: IO[str]):
        io.TextIOBase.__init__(self)
        self._stream = stream
        self.raw = self  # type: ignore[assignment]
        self._bytes = None

    def write(self, text: str) -> int:
        with contextlib.suppress(OSError, ValueError):
            self._stream.write(text)
        return len(text)


def raw_stream(stream: IO[str]) -> IO[str]:
    """The unescaped side of ``stream`` when it is a ``TerminalStream``, else itself."""
    return stream.raw if isinstance(stream, TerminalStream) else stream


class _Bytes(io.RawIOBase):
    """The binary side of a ``TerminalStream`` (``sys.stdout.buffer``): written
    through it, as text."""

    def __init__(self, text: TerminalStream):
        super().__init__()
        self._text = text
        # A character whose bytes come in two writes is decoded whole.
        self._decoder = codecs.getincrementaldecoder(text.encoding)("backslashreplace")

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self._text.write(self._decoder.decode(bytes(view)))
        return len(view)

    def flush(self) -> None:
        self._text.flush()


@contextlib.contextmanager
def user_streams(stream: IO[str]) -> Iterator[None]:
    """While user code runs in kiln's process (a build module's import and
    entrypoints, thread and in-line actions): its ``sys.stdout`` and ``sys.stderr``
    write to ``stream``, kiln's stderr (stdout carries only kiln's own output),
    escaped, each through a ``TerminalStream`` of its own, so that user code that
    closes or replaces one leaves kiln's messages their stream."""
    terminal = stream if isinstance(stream, TerminalStream) else TerminalStream(stream)
    with (
        contextlib.redirect_stdout(terminal.twin()),
        contextlib.redirect_stderr(terminal.twin()),
    ):
        yield
