"""The remote cache client's round trips: kept-alive connections (and a server
that drops an idle one), blobs known present not asked about again, small blobs
``PUT`` without a ``HEAD``. A real HTTP/1.1 server on 127.0.0.1 counts what it
was asked."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from kiln.cache.local import LocalCache
from kiln.cache.remote import SMALL_BLOB, RemoteCache


class _Store(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, drop_after_each: bool) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.blobs: dict[str, bytes] = {}
        self.requests: list[str] = []
        self.connections = 0
        self.drop_after_each = drop_after_each
        self.lock = threading.Lock()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Store

    def setup(self) -> None:
        super().setup()
        with self.server.lock:
            self.server.connections += 1

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass

    def _answer(self, status: int, body: bytes = b"", send_body: bool = True) -> None:
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if send_body:
            self.wfile.write(body)
        self.wfile.flush()
        if self.server.drop_after_each:  # an idle kept-alive connection, closed
            self.close_connection = True

    def _note(self) -> None:
        with self.server.lock:
            self.server.requests.append(f"{self.command} {self.path}")

    def do_HEAD(self) -> None:  # noqa: N802
        self._note()
        found = self.server.blobs.get(self.path)
        self._answer(200 if found is not None else 404, found or b"", send_body=False)

    def do_GET(self) -> None:  # noqa: N802
        self._note()
        found = self.server.blobs.get(self.path)
        self._answer(200 if found is not None else 404, found or b"")

    def do_PUT(self) -> None:  # noqa: N802
        self._note()
        body = self.rfile.read(int(self.headers["Content-Length"]))
        self.server.blobs[self.path] = body
        self._answer(201)


def _serve(drop_after_each: bool) -> Iterator[_Store]:
    server = _Store(drop_after_each)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


@pytest.fixture
def store() -> Iterator[_Store]:
    yield from _serve(drop_after_each=False)


@pytest.fixture
def dropping_store() -> Iterator[_Store]:
    yield from _serve(drop_after_each=True)


def _blob(tmp_path: Path, name: str, data: bytes) -> tuple[str, Path]:
    path = tmp_path / name
    path.write_bytes(data)
    return hashlib.sha256(data).hexdigest(), path


def test_requests_share_one_kept_alive_connection(tmp_path: Path, store: _Store) -> None:
    remote = RemoteCache(f"http://127.0.0.1:{store.server_port}/c")
    digests = []
    for i in range(5):
        digest, path = _blob(tmp_path, f"b{i}", f"blob {i}\n".encode())
        remote.put_blob(digest, path)
        digests.append(digest)
    local = LocalCache(tmp_path / "cache")
    fresh = RemoteCache(f"http://127.0.0.1:{store.server_port}/c")
    assert all(fresh.fetch_blob(d, local) for d in digests)
    assert fresh.get_entry("0" * 64) is None
    assert len(store.requests) == 11
    assert store.connections == 2  # one per client, however many requests


def test_a_dropped_idle_connection_is_retried_on_a_fresh_one(
    tmp_path: Path, dropping_store: _Store
) -> None:
    warnings: list[str] = []
    remote = RemoteCache(
        f"http://127.0.0.1:{dropping_store.server_port}/c", warn=warnings.append, retries=0
    )
    for i in range(4):
        digest, path = _blob(tmp_path, f"b{i}", f"blob {i}\n".encode())
        remote.put_blob(digest, path)
        assert remote.known(digest)
    assert not remote.disabled and warnings == []
    assert len(dropping_store.blobs) == 4 and dropping_store.connections >= 4


def test_a_blob_known_present_is_not_asked_about_again(tmp_path: Path, store: _Store) -> None:
    remote = RemoteCache(f"http://127.0.0.1:{store.server_port}/c")
    small, small_path = _blob(tmp_path, "small", b"x" * 100)
    large, large_path = _blob(tmp_path, "large", b"y" * (SMALL_BLOB + 1))
    remote.put_blob(small, small_path)
    remote.put_blob(large, large_path)
    remote.put_blob(small, small_path)
    remote.put_blob(large, large_path)
    assert remote.has_blob(small) and remote.has_blob(large)
    # The small one is PUT at once; the large one only after a HEAD said it is missing.
    assert store.requests == [f"PUT /c/cas/{small}", f"HEAD /c/cas/{large}", f"PUT /c/cas/{large}"]
    other = RemoteCache(f"http://127.0.0.1:{store.server_port}/c")
    other.put_blob(large, large_path)  # present already: a HEAD, no upload
    assert store.requests[-1] == f"HEAD /c/cas/{large}" and len(store.requests) == 4
