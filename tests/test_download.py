"""Tests of kiln.actions._download against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import hashlib
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from httpserver import HTTPTestServer

from kiln.actions._download import download
from kiln.base.errors import ActionFailed, ToolError
from kiln.output_dir.writing import is_temporary

BODY = os.urandom(3 * (1 << 20) + 123)  # several chunks, not a multiple of the chunk size
DIGEST = hashlib.sha256(BODY).hexdigest()
FAST = {"backoff": 0.01, "timeout": 20.0, "stall_timeout": 5.0}


@pytest.fixture(autouse=True)
def _no_proxy(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make sure a proxy from the environment never intercepts 127.0.0.1."""
    for name in ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "all_proxy"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server() -> Iterator[HTTPTestServer]:
    with HTTPTestServer() as srv:
        yield srv


def leftovers(directory: Path) -> list[str]:
    """Names of temporary download files left in ``directory``."""
    return [p.name for p in directory.iterdir() if is_temporary(p.name)]


def test_serves_file_with_digest_and_progress(server: HTTPTestServer, tmp_path: Path) -> None:
    url = server.serve("/model.bin", BODY)
    dest = tmp_path / "model.bin"
    calls: list[tuple[int, int | None]] = []

    digest = download(
        url, dest, sha256=DIGEST.upper(), progress=lambda d, t: calls.append((d, t)), **FAST
    )

    assert digest == DIGEST
    assert dest.read_bytes() == BODY
    assert calls and calls[-1] == (len(BODY), len(BODY))
    assert all(total == len(BODY) for _, total in calls)
    assert [done for done, _ in calls] == sorted(done for done, _ in calls)
    assert server.count("/model.bin") == 1
    assert leftovers(tmp_path) == []


def test_unknown_length_reports_none_total(server: HTTPTestServer, tmp_path: Path) -> None:
    url = server.serve("/x", b"abc", content_length=False)
    calls: list[tuple[int, int | None]] = []
    download(url, tmp_path / "x", progress=lambda d, t: calls.append((d, t)), **FAST)
    assert (tmp_path / "x").read_bytes() == b"abc"
    assert calls[-1] == (3, None)


def test_404_fails_at_once(server: HTTPTestServer, tmp_path: Path) -> None:
    url = server.url("/missing")
    with pytest.raises(ToolError, match=r"HTTP 404 Not Found fetching .*/missing") as info:
        download(url, tmp_path / "out", **FAST)
    assert url in str(info.value)
    assert isinstance(info.value, ActionFailed)
    assert server.count("/missing") == 1
    assert list(tmp_path.iterdir()) == []


def test_500_then_success(server: HTTPTestServer, tmp_path: Path) -> None:
    url = server.flaky("/f", b"payload", failures=1)
    assert download(url, tmp_path / "f", **FAST) == hashlib.sha256(b"payload").hexdigest()
    assert (tmp_path / "f").read_bytes() == b"payload"
    assert server.count("/f") == 2


def test_429_is_retried(server: HTTPTestServer, tmp_path: Path) -> None:
    url = server.flaky("/r", b"ok", failures=2, status=429)
    download(url, tmp_path / "r", **FAST)
    assert server.count("/r") == 3


def test_always_500_gives_up(server: HTTPTestServer, tmp_path: Path) -> None:
    url = server.status("/bad", 500)
    with pytest.raises(ToolError) as info:
        download(url, tmp_path / "bad", retries=2, **FAST)
    message = str(info.value)
    assert url in message and "3 attempts" in message and "HTTP 500" in message
    assert server.count("/bad") == 3
    assert list(tmp_path.iterdir()) == []


def test_stalled_body_times_out(server: HTTPTestServer, tmp_path: Path) -> None:
    url = server.stall("/slow", BODY, sent=1000)
    start = time.monotonic()
    with pytest.raises(ToolError, match=r"less than 1 KiB arrived in 0\.3 s") as info:
        download(url, tmp_path / "slow", stall_timeout=0.3, retries=1, backoff=0.01)
    assert time.monotonic() - start < 10  # the server stalls for 60 s; slack for CI's load
    assert "2 attempts" in str(info.value)
    assert server.count("/slow") == 2
    assert leftovers(tmp_path) == [] and not (tmp_path / "slow").exists()


def test_truncated_body_is_retried(server: HTTPTestServer, tmp_path: Path) -> None:
    url = server.drop("/cut", b"0123456789", sent=4)
    with pytest.raises(ToolError, match=r"after 4 of 10 bytes") as info:
        download(url, tmp_path / "cut", retries=1, **FAST)
    assert "2 attempts" in str(info.value)
    assert server.count("/cut") == 2


def unused_port() -> int:
    """A port nothing listens on: bind one, then close it."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_refused_connection_retries_then_fails(tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{unused_port()}/x"
    sleeps: list[float] = []
    original = time.sleep

    def record(seconds: float) -> None:
        sleeps.append(seconds)
        original(seconds)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr("kiln.actions._download.time.sleep", record)
        with pytest.raises(ToolError, match="connection refused") as info:
            download(url, tmp_path / "x", retries=3, **FAST)
    assert url in str(info.value) and "4 attempts" in str(info.value)
    assert sleeps == [0.01, 0.02, 0.04]
    assert list(tmp_path.iterdir()) == []


def test_checksum_mismatch(server: HTTPTestServer, tmp_path: Path) -> None:
    url = server.serve("/m", b"actual")
    wrong = "0" * 64
    with pytest.raises(ToolError) as info:
        download(url, tmp_path / "m", sha256=wrong, **FAST)
    message = str(info.value)
    assert f"checksum mismatch for {url}" in message
    assert wrong in message and hashlib.sha256(b"actual").hexdigest() in message
    assert list(tmp_path.iterdir()) == []
    assert server.count("/m") == 1


def test_existing_dest_untouched_on_failure(server: HTTPTestServer, tmp_path: Path) -> None:
    dest = tmp_path / "keep"
    dest.write_bytes(b"old contents")
    with pytest.raises(ToolError):
        download(server.serve("/k", b"new"), dest, sha256="1" * 64, **FAST)
    with pytest.raises(ToolError):
        download(server.status("/gone", 410), dest, **FAST)
    with pytest.raises(ToolError):
        download(server.drop("/cut", b"new contents", sent=3), dest, retries=0, **FAST)
    assert dest.read_bytes() == b"old contents"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep"]


def test_existing_dest_replaced_on_success(server: HTTPTestServer, tmp_path: Path) -> None:
    dest = tmp_path / "d"
    dest.write_bytes(b"old")
    download(server.serve("/d", b"new"), dest, **FAST)
    assert dest.read_bytes() == b"new"


def test_interrupt_removes_temp_file(server: HTTPTestServer, tmp_path: Path) -> None:
    def interrupt(done: int, total: int | None) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        download(server.serve("/i", BODY), tmp_path / "i", progress=interrupt, **FAST)
    assert list(tmp_path.iterdir()) == []


def test_file_url(tmp_path: Path) -> None:
    src = tmp_path / "src dir" / "weights.bin"
    src.parent.mkdir()
    src.write_bytes(BODY)
    dest = tmp_path / "copy.bin"
    calls: list[tuple[int, int | None]] = []
    digest = download(src.as_uri(), dest, sha256=DIGEST, progress=lambda d, t: calls.append((d, t)))
    assert digest == DIGEST and dest.read_bytes() == BODY
    assert calls[-1] == (len(BODY), len(BODY))


def test_missing_file_url(tmp_path: Path) -> None:
    missing = tmp_path / "nope.bin"
    with pytest.raises(ToolError, match="no such file") as info:
        download(missing.as_uri(), tmp_path / "out")
    assert str(missing) in str(info.value)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("url", ["ftp://example.com/x", "gopher://h/y", "no-scheme"])
def test_unsupported_scheme(url: str, tmp_path: Path) -> None:
    scheme = url.split(":", 1)[0] if ":" in url else "(none)"
    with pytest.raises(ToolError, match="unsupported URL scheme") as info:
        download(url, tmp_path / "out")
    assert scheme in str(info.value)


def test_missing_dest_directory(server: HTTPTestServer, tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="temporary file"):
        download(server.serve("/z", b"z"), tmp_path / "no" / "such" / "z", **FAST)
    assert server.count("/z") == 0


def test_server_teardown_is_fast_with_stalled_handler() -> None:
    server = HTTPTestServer()
    server.stall("/hang", b"x" * 100, sent=10)
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as client:
        client.sendall(b"GET /hang HTTP/1.0\r\n\r\n")
        received = b""
        while b"\r\n\r\n" not in received:
            received += client.recv(4096)
        start = time.monotonic()
        server.close()
        assert time.monotonic() - start < 10  # its handler would stall for 60 s
    assert server.count("/hang") == 1


def test_retry_after_as_an_http_date_is_waited_for(server: HTTPTestServer, tmp_path: Path) -> None:
    from email.utils import formatdate

    from httpserver import Route

    when = formatdate(time.time() + 2, usegmt=True)  # at least 1 s from now, whole seconds
    url = server.route(
        "/later",
        Route(body=b"ok", fail_times=1, fail_status=503, fail_headers={"Retry-After": when}),
    )
    start = time.monotonic()
    download(url, tmp_path / "later", **FAST)
    assert time.monotonic() - start >= 0.9  # FAST's own backoff is 0.01 s
    assert server.count("/later") == 2


@pytest.mark.parametrize("value", ["Wed, 21 Oct 2015 07:28:00 GMT", "not a date", "-5", ""])
def test_a_past_or_unreadable_retry_after_does_not_hold_the_retry(
    server: HTTPTestServer, tmp_path: Path, value: str
) -> None:
    from httpserver import Route

    url = server.route(
        "/now",
        Route(body=b"ok", fail_times=1, fail_status=503, fail_headers={"Retry-After": value}),
    )
    start = time.monotonic()
    download(url, tmp_path / "now", **FAST)
    assert time.monotonic() - start < 5  # the 10 s cap of a misread value is not reached
    assert server.count("/now") == 2
