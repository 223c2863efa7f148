"""A scriptable HTTP server on 127.0.0.1 for tests that need a real network peer.

Use the class directly as a context manager::

    with HTTPTestServer() as server:
        server.serve("/model.onnx", b"...")
        fetch(server.url("/model.onnx"))
        assert server.count("/model.onnx") == 1

or through the ``http_server`` fixture, which a test module imports
(``from httpserver import http_server``) -- pytest finds fixtures by name in
the module's namespace.  To avoid ruff's F811 on the parameter, import it as
``from httpserver import http_server as http_server  # noqa: F401`` or wrap the
class in a local fixture.

Routes are exact paths (query strings ignored).  Unknown paths answer 404.
Stalled handlers wait on an Event that :meth:`HTTPTestServer.close` sets, so
teardown never hangs on them.
"""

from __future__ import annotations

import sys
import threading
from collections import Counter
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from urllib.parse import urlsplit

import pytest

__all__ = ["HTTPTestServer", "Route", "http_server"]

# Upper bound on how long a stalled handler waits if close() is never called.
_STALL_LIMIT = 60.0


@dataclass
class Route:
    """How the server answers requests for one path.

    The first ``fail_times`` requests get ``fail_status`` with an empty body (and
    ``fail_headers``);
    later ones get ``status`` with ``body``.  ``stall_after`` sends the headers
    (announcing the full length) and that many body bytes, then stalls until
    the server closes; ``drop_after`` does the same but closes the connection
    instead.  ``content_length=False`` omits the header and ends the body by
    closing the connection.  ``drip_s`` sends the body one byte every
    ``drip_s`` seconds (``drip_headers`` drips the status line and headers too).
    """

    body: bytes = b""
    status: int = 200
    headers: Mapping[str, str] = field(default_factory=dict)
    fail_times: int = 0
    fail_status: int = 500
    fail_headers: Mapping[str, str] = field(default_factory=dict)
    stall_after: int | None = None
    drop_after: int | None = None
    content_length: bool = True
    drip_s: float | None = None
    drip_headers: bool = False


class _Server(ThreadingHTTPServer):
    """The socket server, holding the route table, counters and stop event."""

    daemon_threads = True
    allow_reuse_address = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.routes: dict[str, Route] = {}
        self.counts: Counter[str] = Counter()
        self.auth: list[str | None] = []  # the Authorization header of each request
        self.lock = threading.Lock()
        self.stopping = threading.Event()

    def handle_error(self, request: object, client_address: object) -> None:
        """Ignore clients that hang up early (the point of some tests); report the rest."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]

    def take(self, path: str) -> tuple[Route | None, int]:
        """Count a request for ``path``; return its route and its 1-based number."""
        with self.lock:
            self.counts[path] += 1
            return self.routes.get(path), self.counts[path]


class _Handler(BaseHTTPRequestHandler):
    """Answers every method according to the route table of its server."""

    server: _Server
    protocol_version = "HTTP/1.0"

    def do_GET(self) -> None:
        """Serve the route for the requested path."""
        self._answer(send_body=True)

    def do_HEAD(self) -> None:
        """Like GET, without the body."""
        self._answer(send_body=False)

    def _answer(self, *, send_body: bool) -> None:
        path = urlsplit(self.path).path
        route, number = self.server.take(path)
        with self.server.lock:
            self.server.auth.append(self.headers.get("Authorization"))
        if route is None:
            self._send(404, b"no such route\n", {}, send_body=send_body)
        elif number <= route.fail_times:
            self._send(route.fail_status, b"", route.fail_headers, send_body=send_body)
        elif route.drip_s is not None:
            self._drip(route)
        elif route.stall_after is not None or route.drop_after is not None:
            self._send_partial(route)
        else:
            self._send(
                route.status,
                route.body,
                route.headers,
                send_body=send_body,
                length=route.content_length,
            )

    def _send(
        self,
        status: int,
        body: bytes,
        headers: Mapping[str, str],
        *,
        send_body: bool,
        length: bool = True,
    ) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        if length:
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)

    def _send_partial(self, route: Route) -> None:
        """Announce the whole body, send a prefix, then stall or hang up."""
        sent = route.stall_after if route.stall_after is not None else route.drop_after
        self.send_response(route.status)
        self.send_header("Content-Length", str(len(route.body)))
        self.end_headers()
        self.wfile.write(route.body[:sent])
        self.wfile.flush()
        if route.stall_after is not None:
            self.server.stopping.wait(_STALL_LIMIT)
        self.close_connection = True

    def _drip(self, route: Route) -> None:
        """Send the response a byte at a time, ``route.drip_s`` seconds apart."""
        assert route.drip_s is not None
        head = (f"HTTP/1.0 {route.status} OK\r\nContent-Length: {len(route.body)}\r\n\r\n").encode()
        if not route.drip_headers:
            self.wfile.write(head)
            head = b""
        for i in range(len(head + route.body)):
            self.wfile.write((head + route.body)[i : i + 1])
            self.wfile.flush()
            if self.server.stopping.wait(route.drip_s):
                break
        self.close_connection = True

    def log_message(self, format: str, *args: object) -> None:
        """Keep test output quiet."""


class HTTPTestServer:
    """A route-table HTTP server running in a daemon thread on 127.0.0.1."""

    def __init__(self) -> None:
        self._server = _Server()
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    @property
    def port(self) -> int:
        """The port the server listens on."""
        return int(self._server.server_address[1])

    def url(self, path: str = "/") -> str:
        """Return the absolute URL of ``path`` on this server."""
        return f"http://127.0.0.1:{self.port}{path}"

    def route(self, path: str, route: Route) -> str:
        """Install ``route`` for ``path`` (replacing any earlier one); return its URL."""
        with self._server.lock:
            self._server.routes[path] = route
        return self.url(path)

    def serve(
        self,
        path: str,
        body: bytes,
        *,
        headers: Mapping[str, str] | None = None,
        content_length: bool = True,
    ) -> str:
        """Serve ``body`` at ``path`` with status 200."""
        route = Route(body=body, headers=dict(headers or {}), content_length=content_length)
        return self.route(path, route)

    def status(self, path: str, status: int, body: bytes = b"") -> str:
        """Answer ``path`` with ``status``."""
        return self.route(path, Route(body=body, status=status))

    def flaky(self, path: str, body: bytes, failures: int, status: int = 500) -> str:
        """Fail the first ``failures`` requests with ``status``, then serve ``body``."""
        return self.route(path, Route(body=body, fail_times=failures, fail_status=status))

    def stall(self, path: str, body: bytes, sent: int = 0) -> str:
        """Send the headers and ``sent`` bytes of ``body``, then stall until close."""
        return self.route(path, Route(body=body, stall_after=sent))

    def drop(self, path: str, body: bytes, sent: int = 0) -> str:
        """Send the headers and ``sent`` bytes of ``body``, then close the connection."""
        return self.route(path, Route(body=body, drop_after=sent))

    def drip(self, path: str, body: bytes, every_s: float, *, headers: bool = False) -> str:
        """Send ``body`` one byte every ``every_s`` seconds (the headers too with
        ``headers``)."""
        return self.route(path, Route(body=body, drip_s=every_s, drip_headers=headers))

    def authorization(self) -> list[str | None]:
        """The Authorization header each request carried, in order (None: none)."""
        with self._server.lock:
            return list(self._server.auth)

    def count(self, path: str) -> int:
        """Return how many requests ``path`` has received."""
        with self._server.lock:
            return self._server.counts[path]

    def close(self) -> None:
        """Release stalled handlers, stop serving and free the port; idempotent."""
        self._server.stopping.set()
        if self._thread.is_alive():
            self._server.shutdown()
            self._thread.join(timeout=5)
        self._server.server_close()

    def __enter__(self) -> HTTPTestServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


@pytest.fixture
def http_server() -> Iterator[HTTPTestServer]:
    """A running :class:`HTTPTestServer`, closed after the test."""
    with HTTPTestServer() as server:
        yield server
