"""HTTP requests to one server, each over by a total deadline, each reply bounded.

What the remote cache (``kiln.cache.remote``) sends its requests through:
connections are kept alive and reused (a pool of idle ones; a reused connection
the server closed meanwhile is retried once on a fresh one); every request has a
deadline for the whole of it, connecting, the TLS handshake, headers and body
(``kiln.cache.deadlines``: a server that drips a byte a second is cut at the
deadline); what kiln reads of a reply is bounded (``Capped``, ``skim``). The URL
is checked before anything is sent (``check_url``); it is shown only redacted.

Why not urllib3: its ``Timeout(total=...)`` bounds the connect and each socket
read, not the request. Measured with urllib3 2.8.0 against a server on
127.0.0.1 that sends its headers and then one byte of a 40-byte body every
0.25 s: ``PoolManager(timeout=Timeout(total=2.0), retries=False)`` returned the
body after 10.06 s, five times its "total". A cache that must never hang a
build needs the deadline on the whole request, which is what ``Deadlines`` does
here over ``http.client`` (the same server is cut at the deadline:
``tests/test_hostile_remote.py``); the rest (a pool of kept-alive connections,
one retry on a stale one, basic auth from the URL, the environment's proxy as
urllib honours it: ``kiln.cache.http_route``) is small, and kiln takes no
dependency for it.
"""

from __future__ import annotations

import http.client
import math
import os
import threading
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from kiln.base.errors import NotRegularFile
from kiln.base.redact import redact_url
from kiln.cache.deadlines import Deadlines, Request
from kiln.cache.http_route import route
from kiln.output_dir.digests import CHUNK
from kiln.output_dir.ownership import open_regular

_IDLE_CONNECTIONS = 64
# The most kiln reads of a reply it does not use (an error page, a PUT's answer).
MAX_REPLY = 64 << 10
# Bytes a second a transfer is granted on top of the timeout: a request moving N
# bytes must be over within timeout + N / MIN_RATE seconds.
MIN_RATE = 1 << 20
# The longest request timeout: a socket timeout must fit the C types.
MAX_TIMEOUT_S = 86400.0
_T = TypeVar("_T")


class _Transient(Exception):
    """The request failed in a way worth retrying (no connection, the deadline,
    a reply that is not HTTP); the message says how."""


class _Expired(_Transient):
    """The request was not over by its deadline (not worth retrying)."""


class _Oversize(Exception):
    """The server sent (or announced) more than kiln expects of the reply."""


def check_url(url: str) -> urllib.parse.SplitResult:
    """The parts of an http(s) URL kiln can send as it is; else ValueError, saying
    what is wrong, the URL shown redacted."""
    shown = redact_url(url)
    odd = next((c for c in url if not (0x20 < ord(c) < 0x7F)), None)
    if odd is not None:
        raise ValueError(
            f"{shown} holds {odd!r}, which a URL cannot hold as it is: percent-encode it "
            f"({urllib.parse.quote(odd)})"
        )
    try:
        parts = urllib.parse.urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port out of range
    except ValueError as e:
        raise ValueError(f"{shown} is not a URL ({e})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{shown} is not an http:// or https:// URL with a host")
    if parts.query or parts.fragment:
        raise ValueError(f"{shown} has a query or a fragment; give the cache's base URL")
    return parts


def check_timeout(seconds: float) -> float:
    """``seconds`` if it can bound a request (finite, above 0, at most a day); else
    ValueError."""
    if not (math.isfinite(seconds) and 0 < seconds <= MAX_TIMEOUT_S):
        raise ValueError(
            f"expected a number of seconds above 0 and at most {MAX_TIMEOUT_S:g}, got {seconds!r}"
        )
    return seconds


class _Connection(http.client.HTTPConnection):
    """A connection whose socket its request's deadline can cut."""

    deadline: Request | None = None

    def connect(self) -> None:
        super().connect()
        if self.deadline is not None:
            self.deadline.attach(self.sock)


class _TLSConnection(http.client.HTTPSConnection):
    """As ``_Connection``, the socket cut-able during the TLS handshake too, which is
    with ``server_name`` (the server's, also through a proxy's tunnel)."""

    deadline: Request | None = None
    server_name: str = ""

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        if self.deadline is not None:
            self.deadline.attach(self.sock)
        context = self._context  # type: ignore[attr-defined]
        self.sock = context.wrap_socket(
            self.sock, server_hostname=self.server_name, do_handshake_on_connect=False
        )
        if self.deadline is not None:
            self.deadline.attach(self.sock)
        self.sock.do_handshake()


class Transport:
    """Requests to the server of ``parts``, ``timeout_s`` the deadline of one that
    moves nothing. Invariant: an idle connection is in ``_idle`` only when its last
    response was read whole and its request ended before its deadline. Safe to use
    from several threads (a connection is used by one at a time)."""

    def __init__(
        self, parts: urllib.parse.SplitResult, timeout_s: float, headers: dict[str, str]
    ) -> None:
        self._https = parts.scheme == "https"
        self._route = route(parts)
        self._timeout = check_timeout(timeout_s)
        self._headers = {**headers, **self._route.headers}
        self._lock = threading.Lock()
        self._idle: list[http.client.HTTPConnection] = []
        self._deadlines = Deadlines("kiln-remote-cache")
        self.keep_alive = True

    def exchange(
        self,
        method: str,
        path: str,
        moves: int,
        read: Callable[[http.client.HTTPResponse, Request], _T],
        body: bytes | Path | None = None,
    ) -> _T:
        """Send one request and return what ``read`` makes of its response, all of it
        over by its deadline: the timeout, plus a second per MiB of the ``moves``
        bytes it sends (``read`` may extend it for what the reply announces, as
        ``Capped`` does). Raises _Expired past the deadline, _Transient for 5xx, 429
        and failures of the connection, and whatever ``read`` raises."""
        seconds = self._timeout + moves / MIN_RATE
        with self._deadlines.bound(seconds) as deadline:
            conn, response = self._send(method, path, body, deadline, seconds)
            try:
                result = read(response, deadline)
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                raise _failure(e, deadline, seconds) from e
            except BaseException:
                conn.close()
                raise
            if deadline.expired:
                conn.close()
                raise _Expired(f"{method} {path} did not finish within {seconds:g} s")
            self._done(conn, response)
        return result

    def _connection(self) -> tuple[_Connection | _TLSConnection, bool]:
        """An idle kept-alive connection (and True), else a new one."""
        with self._lock:
            if self._idle:
                return self._idle.pop(), True  # type: ignore[return-value]
        way = self._route
        if not self._https:
            return _Connection(way.host, way.port, timeout=self._timeout), False
        conn = _TLSConnection(way.host, way.port, timeout=self._timeout)
        conn.server_name = way.server_name
        if way.tunnel is not None:
            conn.set_tunnel(*way.tunnel, headers=way.tunnel_headers)
        return conn, False

    def _send(
        self, method: str, path: str, body: bytes | Path | None, deadline: Request, seconds: float
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        while True:
            conn, reused = self._connection()
            conn.deadline = deadline
            try:
                if conn.sock is None:
                    conn.timeout = deadline.left()
                    conn.connect()
                else:
                    deadline.attach(conn.sock)
                conn.sock.settimeout(deadline.left())
                response = self._request(conn, method, path, body)
                break
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                # A kept-alive connection the server closed meanwhile: try a fresh
                # one (every request kiln makes is idempotent).
                if not reused or deadline.expired:
                    raise _failure(e, deadline, seconds, answered=False) from e
        if response.status >= 500 or response.status == 429:
            conn.close()
            raise _Transient(f"HTTP {response.status} {response.reason} for {method} {path}")
        return conn, response

    def _request(
        self, conn: http.client.HTTPConnection, method: str, path: str, body: bytes | Path | None
    ) -> http.client.HTTPResponse:
        headers = dict(self._headers)
        path = self._route.prefix + path
        if isinstance(body, Path):
            try:
                fd = open_regular(body, follow=True)  # never blocks on a FIFO
            except NotRegularFile as e:
                raise OSError(str(e)) from None
            with os.fdopen(fd, "rb") as f:
                headers["Content-Length"] = str(os.fstat(f.fileno()).st_size)
                conn.request(method, path, body=f, headers=headers)
                return conn.getresponse()
        conn.request(method, path, body=body, headers=headers)
        return conn.getresponse()

    def _done(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
        """Keep ``conn`` for the next request if its response was read whole and the
        server keeps it open; close it otherwise."""
        if response.isclosed() and not response.will_close:
            with self._lock:
                if len(self._idle) < _IDLE_CONNECTIONS and self.keep_alive:
                    self._idle.append(conn)
                    return
        conn.close()

    def close(self) -> None:
        """Close the idle connections (the transport stays usable)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()


class Capped:
    """Reads a response's body, at most ``cap`` bytes of it: a body that announces
    or brings more raises _Oversize (kiln reads no further). The request's deadline
    grows by a second per MiB it announces (``cap``, when it does not say)."""

    def __init__(self, response: http.client.HTTPResponse, cap: int, what: str, deadline: Request):
        self._response = response
        self._left = self._cap = cap
        self._what = what
        length = (response.getheader("Content-Length") or "").strip()
        announced = int(length) if length.isdigit() else None
        if announced is not None and announced > cap:
            raise _Oversize(
                f"{what} announced {announced} bytes, more than expected (at most {cap})"
            )
        deadline.extend((cap if announced is None else announced) / MIN_RATE)
        self._owed = 0 if announced is None else announced

    def read(self, amount: int) -> bytes:
        chunk = self._response.read(min(amount, self._left + 1))
        self._left -= len(chunk)
        if self._left < 0:
            raise _Oversize(f"{self._what} sent more than expected (at most {self._cap} bytes)")
        self._owed -= len(chunk)
        if not chunk and self._owed > 0:  # closed before the end it announced
            raise http.client.IncompleteRead(b"", self._owed)
        return chunk

    def read_all(self) -> bytes:
        parts = []
        while chunk := self.read(CHUNK):
            parts.append(chunk)
        return b"".join(parts)


def skim(response: http.client.HTTPResponse) -> None:
    """Read a reply kiln does not use, at most ``MAX_REPLY`` bytes of it (the
    connection is kept only when that was all of it)."""
    response.read(MAX_REPLY)


def _failure(
    error: BaseException, deadline: Request, seconds: float, answered: bool = True
) -> _Transient:
    """What a failed request raises: _Expired when its deadline cut it (before the
    server's answer began, or while it came)."""
    if deadline.expired or isinstance(error, TimeoutError):
        if not answered:
            return _Expired(f"no answer within {seconds:g} s")
        return _Expired(f"the request did not finish within {seconds:g} s")
    if isinstance(error, ConnectionRefusedError):
        return _Transient("connection refused")
    return _Transient(f"{type(error).__name__}: {error}".rstrip(": "))
