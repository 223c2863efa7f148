"""The remote cache: a client of the Bazel HTTP cache protocol.

``GET``, ``HEAD`` and ``PUT`` of ``{URL}/ac/{name}`` (an action-cache entry, kiln's
JSON of ``kiln.cache.entry``, opaque to the server; ``name`` is
``entry.key_name(key)``) and ``{URL}/cas/{sha256}`` (a blob). 200 is found, 404 is
a miss; a ``PUT`` succeeds with any 2xx. nginx's WebDAV module
(``dav_methods PUT; create_full_put_path on;``), bazel-remote, and object stores
behind a proxy all serve it. User and password in the URL become basic auth.

A remote is never worth a failed build, nor a hung one. Every request has a total
deadline (the timeout, plus a second per MiB the request moves), however slowly
the server answers, and a bound on what kiln reads: an entry at most
``entry.MAX_ENTRY_SIZE``, a blob at most the size its entry declares, any other
reply (an error page) at most 64 KiB (``kiln.cache.http_transport``). A reply
that announces or sends more is a miss, reported once. Failures worth retrying
(connection refused or reset, 5xx, 429, a server that does not speak HTTP) are
retried with backoff; when they persist, or a request runs past its deadline,
the remote is reported once and left alone for the rest of the build. Any other
answer (a redirect, which kiln does not follow; 401; 403) is a miss, each status
reported once; a refused ``PUT`` stops uploads, reported once. Any other
exception in a request is the same: the remote is reported and left alone, never
raised into the build. A blob is written into the local CAS only when its bytes
have the digest they were asked for; one that does not is a miss, reported. The
URL is checked before the build (``check_url``) and shown only redacted
(``kiln.base.redact``).

Round trips are kept few: connections are kept alive and reused, a blob this
client has put or seen in the remote is not asked about again during the build,
and a small blob is ``PUT`` without a ``HEAD`` first (as
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
from typing import Any, TypeVar

from kiln.base.redact import redact_url
from kiln.cache.deadlines import Request
from kiln.cache.entry import MAX_ENTRY_SIZE, key_name
from kiln.cache.http_transport import (
    MAX_TIMEOUT_S,
    Capped,
    Transport,
    _Expired,
    _Oversize,
    _Transient,
    check_timeout,
    check_url,
    skim,
)
from kiln.cache.local import LocalCache

__all__ = ["MAX_TIMEOUT_S", "SMALL_BLOB", "RemoteCache", "check_timeout", "check_url"]

_USER_AGENT = "kiln-cache/1"
# A blob up to this size is PUT at once: asking first costs as much as sending it.
SMALL_BLOB = 64 << 10
_T = TypeVar("_T")


class _Refused(Exception):
    """The server answered, and said no (HTTP ``status``)."""

    def __init__(self, text: str, status: int):
        super().__init__(text)
        self.status = status


class RemoteCache:
    """One remote cache URL, as one build uses it.

    Invariant: once ``disabled`` is set (after a persistent failure) no request is
    made; once ``uploads`` is False no ``PUT`` is made; ``_present`` holds only
    digests the server said it has (or accepted). Safe to call from several
    threads.
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
        parts = check_url(url)
        self.url = url.rstrip("/")
        self._prefix = parts.path.rstrip("/")
        self._headers = {"User-Agent": _USER_AGENT}
        if parts.username is not None:
            user = urllib.parse.unquote(parts.username)
            pair = f"{user}:{urllib.parse.unquote(parts.password or '')}"
            self._headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
        self.shown = redact_url(self.url)
        self.uploads = upload
        self.disabled = False
        self._http = Transport(parts, timeout_s, self._headers)
        self._retries = retries
        self._backoff = backoff_s
        self._warn = warn
        self._lock = threading.Lock()
        self._bad: set[str] = set()  # digests it served wrong bytes for (reported)
        self._present: set[str] = set()  # blobs known to be in the remote CAS
        self._reported: set[str] = set()

    # -- the protocol --------------------------------------------------------

    def get_entry(self, key: str) -> bytes | None:
        name = f"ac/{key_name(key)}"
        found = self._call(lambda: self._get(name, None, MAX_ENTRY_SIZE))
        return found if isinstance(found, bytes) else None

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

    def fetch_blob(
        self, digest: str, local: LocalCache, size: int | None = None, limit: int = 10 << 30
    ) -> bool:
        """Download blob ``digest`` into ``local``'s CAS; False when the remote lacks
        it, fails, sends more than ``size`` bytes (what its entry declares; without
        one, ``limit``) or bytes with another digest (reported)."""

        def store(read: Callable[[int], bytes]) -> bool:
            return local.put_stream(digest, read)

        with self._lock:
            if digest in self._bad:
                return False
        cap = size if size is not None and size >= 0 else limit
        stored = self._call(lambda: self._get(f"cas/{digest}", store, cap))
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
        try:
            size = len(path) if isinstance(path, bytes) else os.stat(path).st_size
        except OSError:
            return  # gone since it was hashed: nothing to put
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
            size = len(body) if isinstance(body, bytes) else os.stat(body).st_size
        except OSError:
            return False  # gone since it was hashed: nothing to put
        try:
            return bool(self._call(lambda: self._put(name, body, size), raise_refused=True))
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
        """``request()`` with retries; None when the answer is a miss or the remote
        is (or becomes) unusable. Never raises but ``_Refused`` when asked to."""
        if self.disabled:
            return None
        for attempt in range(self._retries + 1):
            try:
                return request()
            except _Expired as e:  # as slow again: left alone at once
                last = str(e)
                break
            except _Transient as e:
                last = str(e)
            except _Refused as e:
                if raise_refused:
                    raise
                self._report_once(f"HTTP {e.status}", f"{e}; counted as a miss")
                return None
            except _Oversize as e:
                self._report_once("oversize", f"{e}; counted as a miss")
                return None
            except Exception as e:  # noqa: BLE001 - a remote never fails the build
                self._disable(f"{type(e).__name__}: {e}")
                return None
            if attempt < self._retries:
                time.sleep(self._backoff * 2**attempt)
        self._disable(last)
        return None

    def _report_once(self, topic: str, text: str) -> None:
        with self._lock:
            if topic in self._reported:
                return
            self._reported.add(topic)
        self._warn(f"warning: remote cache {self.shown}: {text}")

    def _disable(self, reason: str) -> None:
        with self._lock:
            if self.disabled:
                return
            self.disabled = True
        self._http.keep_alive = False
        self._http.close()
        self._warn(
            f"warning: remote cache {self.shown} is not usable ({reason}); "
            "going on without it for the rest of this build"
        )

    def close(self) -> None:
        """Close the idle connections (the client stays usable)."""
        self._http.close()

    def _exchange(
        self,
        method: str,
        name: str,
        moves: int,
        read: Callable[[http.client.HTTPResponse, Request], _T],
        body: bytes | Path | None = None,
    ) -> _T:
        return self._http.exchange(method, f"{self._prefix}/{name}", moves, read, body)

    def _head(self, name: str) -> bool:
        def read(response: http.client.HTTPResponse, _: Request) -> bool:
            response.read()  # a HEAD has no body
            self._not_found_or_odd(response, "HEAD", name)
            return response.status == 200

        return self._exchange("HEAD", name, 0, read)

    def _get(
        self, name: str, sink: Callable[[Callable[[int], bytes]], bool] | None, cap: int
    ) -> Any:
        """``GET`` ``name``: its body (at most ``cap`` bytes), or what ``sink`` made of
        it; None when it is not there."""

        def read(response: http.client.HTTPResponse, deadline: Request) -> Any:
            if response.status != 200:
                skim(response)
                self._not_found_or_odd(response, "GET", name)
                return None
            reader = Capped(response, cap, f"GET {name}", deadline)
            if sink is None:
                return reader.read_all()
            return sink(reader.read)

        return self._exchange("GET", name, 0, read)

    def _put(self, name: str, body: bytes | Path, size: int) -> bool:
        def read(response: http.client.HTTPResponse, _: Request) -> bool:
            skim(response)
            if not 200 <= response.status < 300:
                raise _Refused(
                    f"HTTP {response.status} {response.reason} for PUT {name}", response.status
                )
            return True

        return self._exchange("PUT", name, size, read, body)

    def _not_found_or_odd(self, response: http.client.HTTPResponse, method: str, name: str) -> None:
        """A 200 or 404 says whether ``name`` is there; any other answer is a miss,
        reported once per status (a redirect is never followed)."""
        status = response.status
        if status in (200, 404):
            return
        why = ""
        if 300 <= status < 400:
            where = redact_url(response.getheader("Location") or "elsewhere")
            why = (
                f" (a redirect to {where}: kiln does not follow redirects; "
                "give the URL it leads to)"
            )
        elif status in (401, 403):
            why = " (check the credentials in the URL)"
        raise _Refused(f"HTTP {status} {response.reason}{why} for {method} {name}", status)
