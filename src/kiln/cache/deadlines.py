"""Total deadlines for network requests: a request that is not over by its deadline
has its connection cut, whatever the server sends meanwhile.

A socket timeout bounds one read only: a server that drips a byte a second, in
its headers or its body, never trips it. ``Deadlines`` holds the requests in
flight and one thread that, when the earliest deadline passes, shuts the
request's socket down (under TLS too); the blocked read returns at once and the
request's ``expired`` flag says why. One thread serves every request of a client,
started on the first and kept while requests come.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import socket
import threading
import time
from collections.abc import Iterator

# The watcher thread ends after this long without a request in flight.
_IDLE_S = 5.0


class Request:
    """One request in flight. ``expired`` is set (once, never cleared) when its
    deadline passed before it ended; then its socket, if any, is shut down."""

    def __init__(self, deadline: float):
        self.deadline = deadline
        self.expired = False
        self.done = False
        self._sock: socket.socket | None = None
        self._lock = threading.Lock()

    def attach(self, sock: socket.socket | None) -> None:
        """The connection's socket, once it exists (cut at once if already expired)."""
        with self._lock:
            self._sock = sock
            cut = self.expired
        if cut:
            _shut(sock)

    def extend(self, seconds: float) -> None:
        """Move the deadline ``seconds`` later (a reply announced how much it brings)."""
        with self._lock:
            if not self.expired:
                self.deadline += seconds

    def left(self) -> float:
        """Seconds until the deadline (at least a millisecond: a socket timeout of 0
        would mean non-blocking)."""
        return max(0.001, self.deadline - time.monotonic())

    def _expire(self) -> None:
        with self._lock:
            if self.done:
                return
            self.expired = True
            sock = self._sock
        _shut(sock)


class Deadlines:
    """The requests of one client in flight, and the thread that cuts them at their
    deadlines. Invariant: every request in ``_heap`` that is not ``done`` is watched
    by a running thread (``_thread``), which ends only when the heap is empty."""

    def __init__(self, name: str = "kiln-deadlines"):
        self._name = name
        self._heap: list[tuple[float, int, Request]] = []
        self._order = itertools.count()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None

    @contextlib.contextmanager
    def bound(self, seconds: float) -> Iterator[Request]:
        """A request that must be over within ``seconds``: the block's network calls
        attach their socket to it; past the deadline it is cut."""
        request = Request(time.monotonic() + seconds)
        with self._cond:
            heapq.heappush(self._heap, (request.deadline, next(self._order), request))
            if self._thread is None:
                self._thread = threading.Thread(target=self._watch, name=self._name, daemon=True)
                self._thread.start()
            self._cond.notify()
        try:
            yield request
        finally:
            with request._lock:
                request.done = True

    def _watch(self) -> None:
        with self._cond:
            idle_since = time.monotonic()
            while True:
                while self._heap and self._heap[0][2].done:
                    heapq.heappop(self._heap)
                now = time.monotonic()
                if not self._heap:
                    if now - idle_since >= _IDLE_S:
                        self._thread = None
                        return
                    self._cond.wait(_IDLE_S)
                    continue
                idle_since = now
                deadline, _, request = self._heap[0]
                if deadline > now:
                    self._cond.wait(deadline - now)
                    continue
                heapq.heappop(self._heap)
                if request.deadline > deadline:  # extended meanwhile: watched anew
                    heapq.heappush(self._heap, (request.deadline, next(self._order), request))
                    continue
                request._expire()


def _shut(sock: socket.socket | None) -> None:
    """Shut the TCP connection down so that a blocked read or write returns."""
    if sock is not None:
        with contextlib.suppress(OSError):
            socket.socket.shutdown(sock, socket.SHUT_RDWR)
