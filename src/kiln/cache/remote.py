"""The remote cache: a client of the Bazel HTTP cache protocol.

``GET``, ``HEAD`` and ``PUT`` of ``{URL}/ac/{name}`` (an action-cache entry, kiln's
JSON of ``kiln.cache.entry``, opaque to the server; ``name`` is
``entry.key_name(key)``) and ``{URL}/cas/{sha256}`` (a blob). 200 is found, 404 is
a miss; a ``PUT`` succeeds with any 2xx. nginx's WebDAV module
(``dav_methods PUT; create_full_put_path on;``), bazel-remote, and object stores
behind a proxy all serve it. User and password in the URL become basic auth.

A remote is never worth a failed build. Every request has a timeout; failures
worth retrying (connection refused or reset, timeouts, 5xx, 429) are retried with
backoff; when they persist the remote is reported once and left alone for the
rest of the build. A refused ``PUT`` (4xx) stops uploads, reported once. A blob is
written into the local CAS only when its bytes have the digest they were asked
for; one that does not is a miss, reported.

Round trips are kept few: connections are kept alive and reused (a pool of idle
ones; a reused connection the server has closed meanwhile is retried once on a
fresh one), a blob this client has put or seen in the remote is not asked about
again during the build, and a small blob is ``PUT`` without a ``HEAD`` first (as
Bazel's HTTP cache client does: for a CAS the ``PUT`` is idempotent).
"""

from __future__ import annotations

import base64
import http.client
import os
import threading
import time
import urllib.parse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kiln.cache.entry import key_name
from kiln.cache.local import LocalCache

_USER_AGENT = "kiln-cache/1"
_CHUNK = 1 << 20
# A blob up to this size is PUT at once: asking first costs as much as sending it.
SMALL_BLOB = 64 << 10
_IDLE_CONNECTIONS = 64


class _Transient(Exception):
    """A failure worth retrying."""


class _Refused(Exception):
    """The server answered, and said no."""


class RemoteCache:
    """One remote cache URL, as one build uses it.

    Invariant: once ``disabled`` is set (after a persistent failure) no request is
    made; once ``uploads`` is False no ``PUT`` is made; ``_present`` holds only
    digests the server said it has (or accepted); an idle connection is in
    ``_idle`` only when its last response was read whole. Safe to call from several
    threads (a connection is used by one at a time).
    """

    def __init__(
        self,
        url: str,
        *,
        upload: bool = True,
        timeout_s: float = 10.0,
        retries: int = 2,
        backoff_s: float = 0.2,
        warn: Callable[[str], None] = lambda text: None,
    ):
        parts = urllib.parse.urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"not an http(s) URL: {url!r}")
        self.url = url.rstrip("/")
        self._https = parts.scheme == "https"
        self._host = parts.hostname
        self._port = parts.port
        self._prefix = parts.path.rstrip("/")
        self._headers = {"User-Agent": _USER_AGENT}
        if parts.username is not None:
            user = urllib.parse.unquote(parts.username)
            pair = f"{user}:{urllib.parse.unquote(parts.password or '')}"
            self._headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        self.shown = urllib.parse.urlunsplit(
            (
                parts.scheme,
                parts.hostname + (f":{parts.port}" if parts.port else ""),
                parts.path,
                "",
                "",
            )
        )
        self.uploads = upload
        self.disabled = False
        self._timeout = timeout_s
        self._retries = retries
        self._backoff = backoff_s
        self._warn = warn
        self._lock = threading.Lock()
        self._bad: set[str] = set()  # digests it served wrong bytes for (reported)
        self._present: set[str] = set()  # blobs known to be in the remote CAS
        self._idle: list[http.client.HTTPConnection] = []

    # -- the protocol --------------------------------------------------------

    def get_entry(self, key: str) -> bytes | None:
        found = self._call(lambda: self._get(f"ac/{key_name(key)}", None))
        return found if isinstance(found, bytes) else None

    def has_entry(self, key: str) -> bool:
        return bool(self._call(lambda: self._head(f"ac/{key_name(key)}")))

    def has_blob(self, digest: str) -> bool:
        if self.known(digest):
            return True
        found = bool(self._call(lambda: self._head(f"cas/{digest}")))
        if found:
            self._note_present(digest)
        return found

    def known(self, digest: str) -> bool:
        """Whether blob ``digest`` is known to be in the remote (put or seen there by
        this client during the build): no request is needed to tell."""
        with self._lock:
            return digest in self._present

    def _note_present(self, digest: str) -> None:
        with self._lock:
            self._present.add(digest)

    def fetch_blob(self, digest: str, local: LocalCache) -> bool:
        """Download blob ``digest`` into ``local``'s CAS; False when the remote lacks
        it, fails, or serves bytes with another digest (reported)."""

        def store(read: Callable[[int], bytes]) -> bool:
            return local.put_stream(digest, read)

        with self._lock:
            if digest in self._bad:
                return False
        stored = self._call(lambda: self._get(f"cas/{digest}", store))
        if stored is True:
            self._note_present(digest)
        if stored is False:
            with self._lock:
                self._bad.add(digest)
            self._warn(
                f"warning: remote cache {self.shown} served cas/{digest} with another "
                "digest; ignored it"
            )
        return stored is True

    def put_blob(self, digest: str, path: Path | bytes) -> None:
        """Put ``path``'s content (or the bytes ``path``), whose digest is ``digest``,
        into the CAS unless it is known to be there; a large blob only after a
        ``HEAD`` says it is missing."""
        if self.known(digest):
            return
        size = len(path) if isinstance(path, bytes) else path.stat().st_size
        if size > SMALL_BLOB and self._call(lambda: self._head(f"cas/{digest}")):
            self._note_present(digest)
            return
        if self._upload(f"cas/{digest}", path):
            self._note_present(digest)

    def put_entry(self, key: str, data: bytes) -> None:
        self._upload(f"ac/{key_name(key)}", data)

    # -- requests ------------------------------------------------------------

    def _upload(self, name: str, body: bytes | Path) -> bool:
        """``PUT`` ``body`` at ``name``; whether the server took it."""
        if not self.uploads:
            return False
        try:
            return bool(self._call(lambda: self._put(name, body), raise_refused=True))
        except _Refused as e:
            with self._lock:
                if not self.uploads:
                    return False
                self.uploads = False
            self._warn(
                f"warning: remote cache {self.shown} refused an upload ({e}); "
                "not uploading for the rest of this build"
            )
            return False

    def _call(self, request: Callable[[], Any], raise_refused: bool = False) -> Any:
        """``request()`` with retries; None when the remote is (or becomes) unusable."""
        if self.disabled:
            return None
        for attempt in range(self._retries + 1):
            try:
                return request()
            except _Transient as e:
                last = str(e)
            except _Refused:
                if raise_refused:
                    raise
                return None
            if attempt < self._retries:
                time.sleep(self._backoff * 2**attempt)
        self._disable(last)
        return None

    def _disable(self, reason: str) -> None:
        with self._lock:
            if self.disabled:
                return
            self.disabled = True
        self._warn(
            f"warning: remote cache {self.shown} is not usable ({reason}); "
            "going on without it for the rest of this build"
        )

    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """An idle kept-alive connection (and True), else a new one."""
        with self._lock:
            if self._idle:
                return self._idle.pop(), True
        cls = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        return cls(self._host, self._port, timeout=self._timeout), False

    def _done(self, conn: http.client.HTTPConnection, response: http.client.HTTPResponse) -> None:
        """Keep ``conn`` for the next request if its response was read whole and the
        server keeps it open; close it otherwise."""
        if response.isclosed() and not response.will_close:
            with self._lock:
                if len(self._idle) < _IDLE_CONNECTIONS and not self.disabled:
                    self._idle.append(conn)
                    return
        conn.close()

    def close(self) -> None:
        """Close the idle connections (the client stays usable)."""
        with self._lock:
            idle, self._idle = self._idle, []
        for conn in idle:
            conn.close()

    def _send(
        self, method: str, name: str, body: bytes | Path | None = None
    ) -> tuple[http.client.HTTPConnection, http.client.HTTPResponse]:
        while True:
            conn, reused = self._connection()
            try:
                response = self._request(conn, method, name, body)
                break
            except (OSError, http.client.HTTPException) as e:
                conn.close()
                # A kept-alive connection the server closed meanwhile: try a fresh
                # one (every request kiln makes is idempotent).
                if not reused:
                    raise _Transient(_describe(e, self._timeout)) from e
        if response.status >= 500 or response.status == 429:
            conn.close()
            raise _Transient(f"HTTP {response.status} {response.reason} for {method} {name}")
        return conn, response

    def _request(
        self, conn: http.client.HTTPConnection, method: str, name: str, body: bytes | Path | None
    ) -> http.client.HTTPResponse:
        headers = dict(self._headers)
        if isinstance(body, Path):
            with open(body, "rb") as f:
                headers["Content-Length"] = str(os.fstat(f.fileno()).st_size)
                conn.request(method, f"{self._prefix}/{name}", body=f, headers=headers)
                return conn.getresponse()
        conn.request(method, f"{self._prefix}/{name}", body=body, headers=headers)
        return conn.getresponse()

    def _head(self, name: str) -> bool:
        conn, response = self._send("HEAD", name)
        response.read()
        self._done(conn, response)
        return response.status == 200

    def _get(self, name: str, sink: Callable[[Callable[[int], bytes]], bool] | None) -> Any:
        conn, response = self._send("GET", name)
        try:
            if response.status != 200:
                response.read()
                return None
            if sink is None:
                return response.read()
            stored = sink(response.read)
            response.read()  # the rest, if the sink stopped early
            return stored
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise _Transient(_describe(e, self._timeout)) from e
        finally:
            self._done(conn, response)

    def _put(self, name: str, body: bytes | Path) -> bool:
        conn, response = self._send("PUT", name, body)
        try:
            response.read()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise _Transient(_describe(e, self._timeout)) from e
        self._done(conn, response)
        if not 200 <= response.status < 300:
            raise _Refused(f"HTTP {response.status} {response.reason} for PUT {name}")
        return True


def _describe(error: BaseException, timeout: float) -> str:
    if isinstance(error, TimeoutError):
        return f"no answer within {timeout:g} s"
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    return f"{type(error).__name__}: {error}".rstrip(": ")
