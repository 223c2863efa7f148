"""HTTP requests whose connection can be cut from outside: a deadline for the whole
download and a stall limit, enforced while a read is blocked.

A socket timeout bounds one read only, so a server that drips a byte a second
(body or headers) would never trip it. ``Watchdog`` instead watches the bytes
that arrive and shuts the connection's socket down when the deadline passes or
when fewer than ``MIN_PROGRESS`` bytes arrived in a whole stall window; the
blocked read then returns at once and the caller asks the watchdog why.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.client
import socket
import threading
import time
import urllib.parse
import urllib.request
from types import TracebackType
from typing import Any

MIN_PROGRESS = 1024  # bytes that must arrive in every stall window


class Watchdog:
    """Cuts the connections attached to it when ``deadline`` (monotonic seconds, or
    None) passes or a ``stall_s`` window brings fewer than ``MIN_PROGRESS`` bytes.

    Invariant: its thread runs only inside the ``with`` block; ``reason`` is None
    until it cuts, then ``"deadline"`` or ``"stall"`` and never changes again.
    """

    def __init__(self, stall_s: float, deadline: float | None):
        self.stall_s = stall_s
        self.deadline = deadline
        self.received = 0
        self.reason: str | None = None
        self._lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="kiln-download-watch", daemon=True)

    def attach(self, sock: socket.socket) -> None:
        with self._lock:
            self._sockets.append(sock)
            cut = self.reason is not None
        if cut:
            _shut(sock)

    def note(self, count: int) -> None:
        with self._lock:
            self.received += count

    def _watch(self) -> None:
        window_start, at_start = time.monotonic(), 0
        while True:
            wake = window_start + self.stall_s
            if self.deadline is not None:
                wake = min(wake, self.deadline)
            if self._stop.wait(max(0.0, wake - time.monotonic())):
                return
            now = time.monotonic()
            if self.deadline is not None and now >= self.deadline:
                self._cut("deadline")
                return
            if now >= window_start + self.stall_s:
                if self.received - at_start < MIN_PROGRESS:
                    self._cut("stall")
                    return
                window_start, at_start = now, self.received

    def _cut(self, reason: str) -> None:
        with self._lock:
            self.reason = reason
            sockets = list(self._sockets)
        for sock in sockets:
            _shut(sock)

    def __enter__(self) -> Watchdog:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join()


def _shut(sock: socket.socket) -> None:
    """Shut the TCP connection down (under TLS too) so a blocked read returns."""
    with contextlib.suppress(OSError):
        socket.socket.shutdown(sock, socket.SHUT_RDWR)


class _Watched(http.client.HTTPConnection):
    """A connection whose socket the watchdog can cut once it is connected."""

    def __init__(self, *args: Any, watchdog: Watchdog, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._watchdog = watchdog

    def connect(self) -> None:
        super().connect()
        self._watchdog.attach(self.sock)


class _WatchedHTTPConnection(_Watched):
    pass


class _WatchedHTTPSConnection(_Watched, http.client.HTTPSConnection):
    pass


class _HTTPHandler(urllib.request.HTTPHandler):
    def __init__(self, watchdog: Watchdog):
        super().__init__()
        self._watchdog = watchdog

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        factory = functools.partial(_WatchedHTTPConnection, watchdog=self._watchdog)
        return self.do_open(factory, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, watchdog: Watchdog):
        super().__init__()
        self._watchdog = watchdog

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        factory = functools.partial(_WatchedHTTPSConnection, watchdog=self._watchdog)
        return self.do_open(factory, req)


def opener(watchdog: Watchdog) -> urllib.request.OpenerDirector:
    """urllib's usual opener (proxies, redirects), its connections watched."""
    return urllib.request.build_opener(_HTTPHandler(watchdog), _HTTPSHandler(watchdog))


def make_request(url: str, headers: dict[str, str]) -> urllib.request.Request:
    """A GET of ``url``; credentials in its user information become a Basic
    ``Authorization`` header that is not sent on to a redirect's target."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return urllib.request.Request(url, headers=headers)
    userinfo, _, host = parts.netloc.rpartition("@")
    user, _, password = userinfo.partition(":")
    bare = urllib.parse.urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))
    request = urllib.request.Request(bare, headers=headers)
    pair = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}"
    token = base64.b64encode(pair.encode()).decode("ascii")
    request.add_unredirected_header("Authorization", f"Basic {token}")
    return request
