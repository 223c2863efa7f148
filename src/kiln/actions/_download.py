"""Download a URL to a file atomically, verifying its SHA-256.

The body is streamed into kiln's temporary file next to the destination
(``kiln.output_dir``) and renamed over it only once it is complete (and matches the expected
digest), so a failed or interrupted download never leaves a partial or
corrupt destination behind.  Transient network failures are retried with
exponential backoff; everything else fails at once with a :class:`ToolError`.
"""

from __future__ import annotations

import datetime
import email.utils
import hashlib
import http.client
import os
import stat
import string
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import IO

from kiln.actions._http import Watchdog, make_request, opener
from kiln.base.errors import ToolError
from kiln.base.redact import redact_url
from kiln.output_dir.writing import atomic_write

__all__ = ["download"]

Progress = Callable[[int, int | None], None]
Reader = Callable[[int], bytes]

_CHUNK_SIZE = 1 << 20
_MAX_BACKOFF = 10.0
_USER_AGENT = "kiln-download/1"


class _TransientError(Exception):
    """A failure worth retrying; ``reason`` describes it for the final message."""

    def __init__(self, reason: str, retry_after: float | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.retry_after = retry_after


def download(
    url: str,
    dest: str | os.PathLike[str],
    *,
    sha256: str | None = None,
    timeout: float | None = None,
    stall_timeout: float = 60.0,
    retries: int = 3,
    backoff: float = 0.5,
    progress: Progress | None = None,
) -> str:
    """Fetch ``url`` (http, https or file) into ``dest`` and return its SHA-256 hex digest.

    ``timeout`` (seconds, None for no limit) bounds the whole download, retries
    and their waits included; ``stall_timeout`` bounds a stall: connecting, or
    any stretch of that many seconds bringing less than 1 KiB.  Transient
    failures (refused or reset connections, stalls, truncated bodies, HTTP 5xx
    and 429) are retried up to ``retries`` more times, sleeping ``backoff *
    2**attempt`` seconds (at most 10) in between.  ``progress(done, total)`` is
    called as chunks arrive; ``total`` is None when the size is unknown, and
    ``done`` restarts from 0 on a retry.  Raises :class:`ToolError` on failure,
    leaving ``dest`` as it was.
    """
    if retries < 0 or backoff < 0 or stall_timeout <= 0 or (timeout is not None and timeout <= 0):
        raise ValueError("retries and backoff must be >= 0, timeouts > 0")
    dest_path = os.fspath(dest)
    shown = redact_url(url)
    expected = _normalize_digest(shown, sha256)
    limit = _Limit(timeout)
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme == "file":
        path = _file_url_path(url, shown)

        def read_local(out: IO[bytes]) -> str:
            return _read_file(shown, path, out, progress, limit)

        return _write_atomically(shown, dest_path, expected, read_local)
    if scheme not in ("http", "https"):
        named = scheme or "(none)"
        raise ToolError(f"unsupported URL scheme {named!r} in {shown}: use http, https or file")

    def fetch(out: IO[bytes]) -> str:
        return _fetch_http(url, shown, out, stall_timeout, limit, progress)

    return _with_retries(
        shown,
        lambda: _write_atomically(shown, dest_path, expected, fetch),
        retries,
        backoff,
        limit,
    )


class _Limit:
    """The whole download's time limit: ``deadline`` in monotonic seconds, or None."""

    def __init__(self, timeout: float | None):
        self.timeout = timeout
        self.deadline = None if timeout is None else time.monotonic() + timeout

    def left(self) -> float | None:
        return None if self.deadline is None else self.deadline - time.monotonic()

    def error(self, shown: str, received: int, last: str | None = None) -> ToolError:
        detail = f"; last error: {last}" if last else ""
        return ToolError(
            f"download of {shown} did not finish within its timeout of {self.timeout:g} s "
            f"({received} bytes received){detail}"
        )


def _with_retries(
    shown: str, attempt: Callable[[], str], retries: int, backoff: float, limit: _Limit
) -> str:
    """Run ``attempt`` until it succeeds, retrying transient failures with backoff
    while the time limit allows."""
    attempts = retries + 1
    for number in range(attempts):
        try:
            return attempt()
        except _TransientError as exc:
            last = exc
            if number + 1 < attempts:
                delay = min(backoff * 2**number, _MAX_BACKOFF)
                if exc.retry_after is not None:
                    delay = max(delay, min(exc.retry_after, _MAX_BACKOFF))
                left = limit.left()
                if left is not None and delay >= left:
                    raise limit.error(shown, 0, exc.reason) from exc
                time.sleep(delay)
    plural = "attempt" if attempts == 1 else "attempts"
    raise ToolError(
        f"download of {shown} failed after {attempts} {plural}; last error: {last.reason}"
    ) from last.__cause__


def _normalize_digest(url: str, sha256: str | None) -> str | None:
    """Return the expected digest in lower case, rejecting anything that is not one."""
    if sha256 is None:
        return None
    digest = sha256.strip().lower()
    if len(digest) != 64 or not set(digest) <= set(string.hexdigits.lower()):
        raise ToolError(f"invalid sha256 {sha256!r} for {url}: expected 64 hex digits")
    return digest


def _write_atomically(
    url: str, dest: str, expected: str | None, fill: Callable[[IO[bytes]], str]
) -> str:
    """Let ``fill`` write kiln's temporary for ``dest`` (``kiln.output_dir.writing.atomic_write``:
    one naming scheme, one fsync policy), verify it, then commit it over ``dest``.

    The temporary file is removed on any failure, including KeyboardInterrupt.
    """
    try:
        with atomic_write(dest) as out:
            digest = fill(out)
            if expected is not None and digest != expected:
                raise ToolError(f"checksum mismatch for {url}: expected {expected}, got {digest}")
            try:
                out.flush()
            except OSError as exc:
                raise ToolError(f"cannot write the download of {url} to {dest}: {exc}") from exc
    except OSError as exc:
        directory = os.path.dirname(os.path.abspath(dest))
        raise ToolError(
            f"cannot create a temporary file in {directory} for {url}, or move it to {dest}: {exc}"
        ) from exc
    return digest


def _copy(
    url: str,
    read: Reader,
    out: IO[bytes],
    total: int | None,
    progress: Progress | None,
    limit: _Limit,
) -> str:
    """Copy chunks from ``read`` to ``out`` until EOF, hashing them; return the hex digest.

    Read errors propagate unchanged so the caller can classify them; write
    errors become a ToolError at once (a full disk is not worth retrying), and
    so does passing the time limit.
    """
    hasher = hashlib.sha256()
    done = 0
    while chunk := read(_CHUNK_SIZE):
        left = limit.left()
        if left is not None and left <= 0:
            raise limit.error(url, done)
        try:
            out.write(chunk)
        except OSError as exc:
            raise ToolError(f"cannot write the download of {url}: {exc}") from exc
        hasher.update(chunk)
        done += len(chunk)
        if progress is not None:
            progress(done, total)
    if total is not None and done < total:
        raise _TransientError(f"connection closed after {done} of {total} bytes")
    return hasher.hexdigest()


def _file_url_path(url: str, shown: str) -> str:
    """Return the local path a ``file:`` URL names; remote hosts are refused."""
    parts = urllib.parse.urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise ToolError(f"cannot download {shown}: file URLs must name a local path")
    return urllib.request.url2pathname(parts.path)


def _read_file(
    url: str, path: str, out: IO[bytes], progress: Progress | None, limit: _Limit
) -> str:
    """Copy the local file ``path`` into ``out``; return its digest."""
    try:
        with open(path, "rb") as src:
            info = os.fstat(src.fileno())
            size = info.st_size if stat.S_ISREG(info.st_mode) else None
            return _copy(url, src.read, out, size, progress, limit)
    except _TransientError as exc:
        raise ToolError(f"cannot download {url}: {path} {exc.reason} while reading") from exc
    except FileNotFoundError as exc:
        raise ToolError(f"cannot download {url}: no such file {path}") from exc
    except OSError as exc:
        raise ToolError(f"cannot download {url}: cannot read {path}: {exc}") from exc


def _fetch_http(
    url: str,
    shown: str,
    out: IO[bytes],
    stall_s: float,
    limit: _Limit,
    progress: Progress | None,
) -> str:
    """Make one HTTP(S) request for ``url`` and stream its body into ``out``.

    Raises _TransientError for failures worth retrying and ToolError otherwise
    (passing the time limit included).
    """
    left = limit.left()
    if left is not None and left <= 0:
        raise limit.error(shown, 0)
    request = make_request(url, {"User-Agent": _USER_AGENT, "Accept-Encoding": "identity"})
    # One second past the watchdog's limits, so that the watchdog (which names the
    # cause) cuts first; the socket's own timeout still ends a connect that hangs.
    socket_timeout = stall_s + 1.0 if left is None else min(stall_s, left) + 1.0
    with Watchdog(stall_s, limit.deadline) as watchdog:
        try:
            with opener(watchdog).open(request, timeout=socket_timeout) as response:
                total = _content_length(response)

                def read(size: int) -> bytes:
                    chunk: bytes = response.read1(size)
                    watchdog.note(len(chunk))
                    return chunk

                digest = _copy(shown, read, out, total, progress, limit)
        except Exception as exc:
            if watchdog.reason is not None:  # the watchdog cut the connection
                raise _cut_error(shown, watchdog, limit) from exc
            raise _classify(shown, exc, socket_timeout) from exc
        if watchdog.reason is not None:  # the cut looked like the end of the body
            raise _cut_error(shown, watchdog, limit)
    return digest


def _cut_error(shown: str, watchdog: Watchdog, limit: _Limit) -> Exception:
    if watchdog.reason == "deadline":
        return limit.error(shown, watchdog.received)
    return _TransientError(
        f"stalled: less than 1 KiB arrived in {watchdog.stall_s:g} s fetching {shown}"
    )


def _classify(shown: str, exc: Exception, timeout: float) -> Exception:
    """The error to raise for ``exc``, a failure of one request."""
    if isinstance(exc, ToolError | _TransientError):
        return exc
    if isinstance(exc, urllib.error.HTTPError):
        exc.close()
        return _http_status_error(shown, exc)
    if isinstance(exc, urllib.error.URLError):
        if isinstance(exc.reason, OSError):
            return _network_error(shown, exc.reason, timeout)
        return ToolError(f"cannot download {shown}: {exc.reason}")
    if isinstance(exc, OSError | http.client.HTTPException):
        return _network_error(shown, exc, timeout)
    return ToolError(f"cannot download {shown}: {exc!r}")


def _content_length(response: http.client.HTTPResponse) -> int | None:
    """Return the body size the server announced, or None when it did not (validly)."""
    value = response.headers.get("Content-Length")
    if value is None or not value.strip().isdigit():
        return None
    return int(value)


def _http_status_error(url: str, exc: urllib.error.HTTPError) -> Exception:
    """Classify an HTTP error status: 5xx and 429 are transient, the rest final."""
    message = f"HTTP {exc.code} {exc.reason} fetching {url}"
    if exc.code >= 500 or exc.code == 429:
        return _TransientError(message, _retry_after(exc))
    return ToolError(message)


def _retry_after(exc: urllib.error.HTTPError) -> float | None:
    """The server's Retry-After delay in seconds: a number of seconds, or an HTTP
    date (RFC 9110) from now, 0 when it has passed; None when absent or unreadable.
    The caller bounds it (``_MAX_BACKOFF``, the download's time limit)."""
    value = exc.headers.get("Retry-After") if exc.headers is not None else None
    if value is None:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError, OverflowError):
        return None
    if when.tzinfo is None:  # an HTTP date is in GMT
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, (when - datetime.datetime.now(datetime.UTC)).total_seconds())


def _network_error(url: str, exc: BaseException, timeout: float) -> Exception:
    """Classify a socket-level failure: drops, refusals and timeouts are transient."""
    if isinstance(exc, TimeoutError):
        return _TransientError(f"timed out after {timeout:g} s fetching {url}")
    if isinstance(exc, ConnectionRefusedError):
        return _TransientError(f"connection refused fetching {url}")
    if isinstance(exc, ConnectionError | http.client.IncompleteRead):
        return _TransientError(f"connection lost fetching {url}: {exc!r}")
    if isinstance(exc, http.client.HTTPException):
        return ToolError(f"bad HTTP response fetching {url}: {exc!r}")
    return ToolError(f"cannot download {url}: {exc}")
