"""The CAS a ``dask-local:N`` build's workers share when no remote cache is given:
kiln's own local cache, served on 127.0.0.1 for the build's duration.

The workers of kiln's own LocalCluster run on this machine, and speak the Bazel
HTTP cache protocol (``kiln.cache.remote``) as they do to a remote cache; this
server answers it from the build's ``LocalCache``: ``GET``/``HEAD`` of
``{URL}/cas/{sha256}`` serve a blob kiln has, ``PUT`` stores one, through
``LocalCache.put_stream``, which keeps it only when its bytes have the digest of
its name. What the workers put is then already where kiln materializes outputs
from: nothing is fetched back, nothing is stored twice, and nothing is left
behind but blobs in kiln's cache, bounded and evicted as any other.

Bounds: the URL's path starts with a random 256-bit prefix (``secrets``), so that
another user of the machine who finds the port cannot read or write through it;
any other path is 404. A ``PUT`` needs a ``Content-Length`` of at most the
cache's size; a refused one is answered, and what the client still sends is read and
dropped for at most 2 s and 64 MiB (``_linger``; a stranger's, not at all). The
action cache (``ac/``) is not served (404; a ``PUT`` there is accepted and dropped:
the build's own local cache keeps its entries). The server listens only on 127.0.0.1
and stops with the build (``serving``).
"""

from __future__ import annotations

import contextlib
import hmac
import os
import re
import secrets
import shutil
import socket
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from kiln.cache.local import LocalCache

_BLOB = re.compile(r"^cas/([0-9a-f]{64})$")
_ENTRY = re.compile(r"^ac/[0-9A-Za-z_.-]{1,200}$")
_CHUNK = 1 << 20
_LINGER_BYTES = 64 << 20  # what a refused upload may still send before its connection ends
_LINGER_S = 2.0
_LENGTH = re.compile(r"[0-9]{1,20}")  # RFC 9110's 1*DIGIT: no sign, space or underscore


def _length(values: list[str] | None) -> int | None:
    """The one ``Content-Length`` as RFC 9110 spells it; None when it is missing,
    given twice, or anything else that ``int`` would read (``+5``, `` 5``, ``5_0``)."""
    if not values or len(values) != 1 or not _LENGTH.fullmatch(values[0]):
        return None
    return int(values[0])


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = False

    def __init__(self, local: LocalCache, max_blob: int):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.local = local
        self.max_blob = max_blob
        self.prefix = "/" + secrets.token_hex(32) + "/"

    def handle_error(self, request: object, client_address: object) -> None:
        """A client that went away mid-answer (a worker stopped, a timeout) is not
        reported: the stdlib's traceback would land in the build's terminal. Any
        other error is."""
        if not isinstance(sys.exc_info()[1], OSError):
            super().handle_error(request, client_address)  # type: ignore[arg-type]


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # kept-alive connections, as the client expects
    timeout = 60  # a connection that sends nothing does not hold its thread for ever

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - stdlib's name
        """Requests are not kiln's output."""

    def _name(self) -> str | None:
        """The path under the build's prefix; None for any other path."""
        prefix = self.server.prefix
        head = self.path[: len(prefix)]
        if (
            len(self.path) <= len(prefix)
            or not self.path.isascii()  # compare_digest takes ASCII text only
            or not hmac.compare_digest(head, prefix)
        ):
            return None
        return self.path[len(prefix) :]

    def _answer(self, status: int, length: int = 0) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(length))
        self.end_headers()

    def _linger(self, length: int) -> None:
        """After refusing an upload, read and drop what the client still sends, for a
        short while (a lingering close, as web servers do): closed at once with its
        body unread, the connection is reset, and a client still sending sees "broken
        pipe" where the answer said why. Nothing read is kept; at most
        ``_LINGER_BYTES`` and ``_LINGER_S`` are spent on it."""
        deadline = time.monotonic() + _LINGER_S
        left = min(length, _LINGER_BYTES)
        try:
            self.wfile.flush()
            self.connection.shutdown(socket.SHUT_WR)  # the answer is whole: end it
            while left > 0 and (wait := deadline - time.monotonic()) > 0:
                self.connection.settimeout(wait)
                chunk = self.rfile.read1(min(left, _CHUNK))
                if not chunk:
                    return
                left -= len(chunk)
        except OSError:  # the client went away, or the time is up
            return

    def do_HEAD(self) -> None:  # noqa: N802 - the stdlib's naming
        self._serve(body=False)

    def do_GET(self) -> None:  # noqa: N802
        self._serve(body=True)

    def _serve(self, body: bool) -> None:
        m = _BLOB.match(self._name() or "")
        local = self.server.local
        fd = None if m is None else local.dir.open_file(str(local.blob_path(m[1])))
        if fd is None:
            self._answer(404)
            return
        with os.fdopen(fd, "rb") as f:
            self._answer(200, os.fstat(f.fileno()).st_size)
            if body:
                shutil.copyfileobj(f, self.wfile, _CHUNK)

    def do_PUT(self) -> None:  # noqa: N802
        name = self._name() or ""
        length = _length(self.headers.get_all("Content-Length"))
        if length is None:
            self.close_connection = True
            self._answer(411)
            return
        m = _BLOB.match(name)
        limit = self.server.max_blob if m is not None else 64 << 10
        if length > limit or (m is None and _ENTRY.match(name) is None):
            self.close_connection = True  # its body is never kept
            self._answer(413 if length > limit else 404)
            if self._name() is not None:  # a stranger's upload gets no more of our time
                self._linger(length)
            return
        left = [length]

        def read(n: int) -> bytes:
            data = self.rfile.read(min(n, left[0])) if left[0] > 0 else b""
            left[0] -= len(data)
            return data

        if m is None:  # an action-cache entry: the build's local cache has it
            read(length)
            self._answer(200)
            return
        try:
            stored = self.server.local.put_stream(m[1], read)
        except OSError:
            stored = False
        if left[0] > 0:
            self.close_connection = True
        self._answer(201 if stored else 400)
        if left[0] > 0:  # not stored, its body not all read (a full disk): as a refusal
            self._linger(left[0])


@contextlib.contextmanager
def serving(local: LocalCache, max_blob: int) -> Iterator[str]:
    """Serve ``local``'s CAS on 127.0.0.1 while the ``with`` lasts; yields its URL
    (with its secret prefix). Blobs larger than ``max_blob`` are refused."""
    server = _Server(local, max_blob)
    thread = threading.Thread(target=server.serve_forever, name="kiln-cas", daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        yield f"http://127.0.0.1:{port}{server.prefix.rstrip('/')}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
