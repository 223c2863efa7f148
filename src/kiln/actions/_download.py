"""Download a URL to a file atomically, verifying its SHA-256.

The body is streamed into kiln's temporary file next to the destination
(``kiln.outputs``) and renamed over it only once it is complete (and matches the expected
digest), so a failed or interrupted download never leaves a partial or
corrupt destination behind.  Transient network failures are retried with
exponential backoff; everything else fails at once with a :class:`ToolError`.
"""

from __future__ import annotations

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

from kiln.errors import ToolError
from kiln.outputs import atomic_write

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
    timeout: float = 30.0,
    retries: int = 3,
    backoff: float = 0.5,
    progress: Progress | None = None,
) -> str:
    """Fetch ``url`` (http, https or file) into ``dest`` and return its SHA-256 hex digest.

    ``timeout`` bounds the connect and every single read.  Transient failures
    (refused or reset connections, timeouts, truncated bodies, HTTP 5xx and 429)
    are retried up to ``retries`` more times, sleeping ``backoff * 2**attempt``
    seconds (at most 10) in between.  ``progress(done, total)`` is called as
    chunks arrive; ``total`` is None when the size is unknown, and ``done``
    restarts from 0 on a retry.  Raises :class:`ToolError` on failure, leaving
    ``dest`` as it was.
    """
    if retries < 0 or timeout <= 0 or backoff < 0:
        raise ValueError("retries and backoff must be >= 0 and timeout > 0")
    dest_path = os.fspath(dest)
    expected = _normalize_digest(url, sha256)
    scheme = urllib.parse.urlsplit(url).scheme.lower()
    if scheme == "file":
        path = _file_url_path(url)

        def read_local(out: IO[bytes]) -> str:
            return _read_file(url, path, out, progress)

        return _write_atomically(url, dest_path, expected, read_local)
    if scheme not in ("http", "https"):
        shown = scheme or "(none)"
        raise ToolError(f"unsupported URL scheme {shown!r} in {url}: use http, https or file")

    def fetch(out: IO[bytes]) -> str:
        return _fetch_http(url, out, timeout, progress)

    return _with_retries(
        url, lambda: _write_atomically(url, dest_path, expected, fetch), retries, backoff
    )


def _with_retries(url: str, attempt: Callable[[], str], retries: int, backoff: float) -> str:
    """Run ``attempt`` until it succeeds, retrying transient failures with backoff."""
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
                time.sleep(delay)
    plural = "attempt" if attempts == 1 else "attempts"
    raise ToolError(
        f"download of {url} failed after {attempts} {plural}; last error: {last.reason}"
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
    """Let ``fill`` write kiln's temporary for ``dest`` (``kiln.outputs.atomic_write``:
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
        raise ToolError(f"cannot create a temporary file in {directory} for {url}, or move "
                        f"it to {dest}: {exc}") from exc  # fmt: skip
    return digest


def _copy(
    url: str, read: Reader, out: IO[bytes], total: int | None, progress: Progress | None
) -> str:
    """Copy chunks from ``read`` to ``out`` until EOF, hashing them; return the hex digest.

    Read errors propagate unchanged so the caller can classify them; write
    errors become a ToolError at once (a full disk is not worth retrying).
    """
    hasher = hashlib.sha256()
    done = 0
    while chunk := read(_CHUNK_SIZE):
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


def _file_url_path(url: str) -> str:
    """Return the local path a ``file:`` URL names; remote hosts are refused."""
    parts = urllib.parse.urlsplit(url)
    if parts.netloc not in ("", "localhost"):
        raise ToolError(f"cannot download {url}: file URLs must name a local path")
    return urllib.request.url2pathname(parts.path)


def _read_file(url: str, path: str, out: IO[bytes], progress: Progress | None) -> str:
    """Copy the local file ``path`` into ``out``; return its digest."""
    try:
        with open(path, "rb") as src:
            info = os.fstat(src.fileno())
            size = info.st_size if stat.S_ISREG(info.st_mode) else None
            return _copy(url, src.read, out, size, progress)
    except _TransientError as exc:
        raise ToolError(f"cannot download {url}: {path} {exc.reason} while reading") from exc
    except FileNotFoundError as exc:
        raise ToolError(f"cannot download {url}: no such file {path}") from exc
    except OSError as exc:
        raise ToolError(f"cannot download {url}: cannot read {path}: {exc}") from exc


def _fetch_http(url: str, out: IO[bytes], timeout: float, progress: Progress | None) -> str:
    """Make one HTTP(S) request for ``url`` and stream its body into ``out``.

    Raises _TransientError for failures worth retrying and ToolError otherwise.
    """
    request = urllib.request.Request(
        url, headers={"User-Agent": _USER_AGENT, "Accept-Encoding": "identity"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            total = _content_length(response)
            return _copy(url, response.read1, out, total, progress)
    except urllib.error.HTTPError as exc:
        exc.close()
        raise _http_status_error(url, exc) from exc
    except urllib.error.URLError as exc:
        reason = exc.reason
        if isinstance(reason, OSError):
            raise _network_error(url, reason, timeout) from reason
        raise ToolError(f"cannot download {url}: {reason}") from exc
    except (OSError, http.client.HTTPException) as exc:
        raise _network_error(url, exc, timeout) from exc


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
    """Return the server's Retry-After delay in seconds, if it sent a numeric one."""
    value = exc.headers.get("Retry-After") if exc.headers is not None else None
    if value is None or not value.strip().isdigit():
        return None
    return float(value)


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
