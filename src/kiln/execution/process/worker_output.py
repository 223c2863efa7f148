"""What a worker process prints reaches kiln's terminal escaped.

A worker's descriptors 1 and 2 are the template's, kiln's stderr. While it runs its
action they are a pipe instead, which a thread of the worker copies to that stderr
with its control characters escaped (``kiln.base.terminal.printable``), as kiln escapes
what user code writes in its own process: a print, warning or log line of the
action, or of a program it starts, cannot clear the screen or forge kiln's lines.
The pipe is drained before the worker replies, so what an action printed shows
before kiln reports it done.
"""

from __future__ import annotations

import codecs
import contextlib
import ctypes
import os
import select
import sys
import threading
from collections.abc import Iterator

from kiln.base.terminal import printable

_READ = 64 * 1024
# Read after ``close`` at most: a program the action left running that writes without
# a pause must not keep the worker from replying.
_DRAIN_MAX = 1 << 20


@contextlib.contextmanager
def escaped_output() -> Iterator[None]:
    """Within this block, descriptors 1 and 2 (``sys.stdout``, ``sys.stderr`` and
    what the action starts) reach the worker's stderr escaped."""
    relay = _Relay()
    try:
        yield
    finally:
        relay.close()


class _Relay:
    """Invariant: until ``close``, descriptors 1 and 2 are the pipe's write end and
    ``_terminal`` is the stderr the worker started with, which only the copying
    thread writes."""

    def __init__(self) -> None:
        self._terminal = os.dup(2)
        read, write = os.pipe()
        self._stop_r, self._stop_w = os.pipe()
        for fd in (1, 2):
            os.dup2(write, fd)
        os.close(write)
        self._thread = threading.Thread(
            target=self._copy, args=(read,), name="kiln-worker-output", daemon=True
        )
        self._thread.start()

    def close(self) -> None:
        """Put the worker's stderr back on 1 and 2; copy what the pipe holds, then stop
        (a process the action left running may still hold the pipe: what it writes
        later is dropped)."""
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        # And the C library's: on a pipe its stdout is fully buffered, and the worker
        # ends with os._exit (a printf of a native library would be lost).
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(None).fflush(None)
        for fd in (1, 2):
            os.dup2(self._terminal, fd)
        os.write(self._stop_w, b"x")
        self._thread.join()
        for fd in (self._stop_r, self._stop_w, self._terminal):
            os.close(fd)

    def _copy(self, read: int) -> None:
        decoder = codecs.getincrementaldecoder("utf-8")("backslashreplace")
        poller = select.poll()
        poller.register(read, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        stopping, drained = False, 0
        while drained < _DRAIN_MAX:
            if not stopping and self._stop_r in {fd for fd, _ in poller.poll()}:
                stopping = True
                os.set_blocking(read, False)
            try:
                data = os.read(read, _READ)
            except BlockingIOError:
                break
            if not data:
                break
            drained += len(data) if stopping else 0
            self._write(decoder.decode(data))
        self._write(decoder.decode(b"", final=True))
        os.close(read)

    def _write(self, text: str) -> None:
        data = printable(text).encode("utf-8", "backslashreplace")
        with contextlib.suppress(OSError):  # kiln's stderr is gone: nobody reads it
            while data:
                data = data[os.write(self._terminal, data) :]
