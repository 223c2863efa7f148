"""Remote cache URLs of every valid shape reach their server: an IPv6 address with
or without a port, user information, trailing slashes; and the environment's
proxy (``http_proxy``, ``HTTP_PROXY``, ``no_proxy``) is honoured as ``fetch_http``
honours it. Against a real Bazel-protocol cache server bound to ``::1`` and a real
forwarding proxy on 127.0.0.1, both started here (the machine's own proxy
variables are cleared for every test: conftest's ``_private_cache``). A loopback
remote never goes through the proxy; the others are named by hosts that only the
proxy reaches."""

from __future__ import annotations

import base64
import contextlib
import errno
import http.client
import socket
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from cache_build import module_text, runs, write_tool

pytestmark = pytest.mark.in_process


class _Cache(ThreadingHTTPServer):
    """GET, HEAD and PUT of any path, kept in memory; each request line, ``Host`` and
    ``Authorization`` recorded."""

    address_family = socket.AF_INET6
    daemon_threads = True

    def __init__(self, port: int = 0) -> None:
        super().__init__(("::1", port), _CacheHandler)
        self.blobs: dict[str, bytes] = {}
        self.seen: list[tuple[str, str, str | None]] = []
        self.lock = threading.Lock()


class _CacheHandler(BaseHTTPRequestHandler):
    server: _Cache
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _note(self) -> None:
        with self.server.lock:
            self.server.seen.append(
                (f"{self.command} {self.path}", self.headers["Host"], self.headers["Authorization"])
            )

    def do_GET(self) -> None:
        self._note()
        body = self.server.blobs.get(self.path)
        if body is None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)

    do_HEAD = do_GET

    def do_PUT(self) -> None:
        self._note()
        data = self.rfile.read(int(self.headers["Content-Length"]))
        with self.server.lock:
            self.server.blobs[self.path] = data
        self.send_response(201)
        self.send_header("Content-Length", "0")
        self.end_headers()


class _Proxy(ThreadingHTTPServer):
    """A forwarding HTTP proxy on 127.0.0.1: each request names the whole URL; it is
    sent on to the host and port the URL names (``ports`` and ``hosts`` map a port
    and a host to the ones really used: the proxy decides how it reaches servers)."""

    daemon_threads = True

    def __init__(self, ports: dict[int, int], hosts: dict[str, str] | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.ports = ports
        self.hosts = hosts or {}
        self.seen: list[tuple[str, str | None]] = []


class _ProxyHandler(BaseHTTPRequestHandler):
    server: _Proxy
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _forward(self) -> None:
        self.server.seen.append(
            (f"{self.command} {self.path}", self.headers["Proxy-Authorization"])
        )
        target = urllib.parse.urlsplit(self.path)
        port = target.port or 80
        host = target.hostname or ""
        host = self.server.hosts.get(host, host)
        conn = http.client.HTTPConnection(host, self.server.ports.get(port, port))
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else None
        headers = {k: v for k, v in self.headers.items() if k.lower() != "proxy-authorization"}
        path = target.path + (f"?{target.query}" if target.query else "")
        conn.request(self.command, path, body=body, headers=headers)
        reply = conn.getresponse()
        data = reply.read()
        self.send_response(reply.status)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
        conn.close()

    do_GET = do_HEAD = do_PUT = _forward


@contextlib.contextmanager
def serving(server: ThreadingHTTPServer) -> Iterator[Any]:
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()


def _ipv6_cache(port: int = 0) -> _Cache:
    if not socket.has_ipv6:
        pytest.skip("this Python has no IPv6")
    try:
        return _Cache(port)
    except OSError as e:
        if e.errno in (errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT):
            pytest.skip(f"this machine has no IPv6 loopback ({e})")
        if port and e.errno in (errno.EACCES, errno.EADDRINUSE):
            pytest.skip(f"cannot listen on [::1]:{port} ({e})")
        raise


@pytest.fixture
def project(tmp_path: Path, write_module: Callable[..., Path]) -> Path:
    tool = write_tool(tmp_path)
    write_module(module_text(tool, tmp_path / "counter", ["m1", "m2"]))
    return tmp_path / "counter"


def shared(kiln: Callable[..., Any], url: str, env: dict[str, str] | None = None) -> None:
    """Two machines (two output directories, two local caches) through ``url``: the
    first builds and uploads, the second builds nothing."""
    for n, expect in ((1, "4 built"), (2, "0 built, 4 cached")):
        r = kiln(
            "build", "build.py", "--output-dir", f"o{n}", "--cache-dir", f"c{n}",
            "--remote-cache", url, env=env, timeout=60,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert expect in r.stderr and "warning" not in r.stderr, (url, r.stderr)


def test_an_ipv6_remote_without_a_port_is_port_80_of_that_host(
    kiln: Callable[..., Any], project: Path
) -> None:
    """``http://[::1]/c`` is port 80 of ``::1`` (it was read as host ``::``, port 1,
    and the cache silently dropped)."""
    with serving(_ipv6_cache(80)) as cache:
        shared(kiln, "http://alice:s3cret@[::1]/c/")
    assert len(runs(project)) == 4
    assert {host for _, host, _ in cache.seen} == {"[::1]"}
    assert all(line.split()[1].startswith("/c/") for line, _, _ in cache.seen)
    token = base64.b64encode(b"alice:s3cret").decode()
    assert {auth for _, _, auth in cache.seen} == {f"Basic {token}"}
    assert any(line.startswith("PUT /c/cas/") for line, _, _ in cache.seen)


# A host that is not this machine's loopback (IPv6's documentation prefix, a name under
# .test): only the proxy reaches it, by the ``hosts`` it is given.
_FAR = {"2001:db8::1": "::1", "2001:db8:0:0:0:0:0:1": "::1", "cache.test": "::1"}


@pytest.mark.parametrize(
    ("variable", "shape"),
    [
        ("http_proxy", "http://[2001:db8::1]:{port}/c"),
        ("HTTP_PROXY", "http://[2001:db8::1]:{port}/c//"),
        ("http_proxy", "http://bob:pw@[2001:db8::1]:{port}"),
        ("http_proxy", "http://[2001:db8::1]/c"),  # port 80: where the proxy reaches it is its own
        ("http_proxy", "http://[2001:db8:0:0:0:0:0:1]:{port}/c/"),
        ("http_proxy", "http://cache.test:{port}/c"),
    ],
)
def test_the_environments_proxy_carries_every_url_shape_unless_no_proxy_says(
    kiln: Callable[..., Any], project: Path, variable: str, shape: str
) -> None:
    with serving(_ipv6_cache()) as cache:
        port = cache.server_address[1]
        url = shape.format(port=port)
        with serving(_Proxy({80: port}, _FAR)) as proxy:
            proxy_url = f"http://carol:pr0xy@127.0.0.1:{proxy.server_address[1]}"
            shared(kiln, url, env={variable: proxy_url, "no_proxy": "example.invalid"})
            assert proxy.seen and len(proxy.seen) == len(cache.seen)
            netloc = url.split("://", 1)[1].split("/", 1)[0].rpartition("@")[2]
            for line, auth in proxy.seen:
                assert line.split()[1].startswith(f"http://{netloc}/"), line
                assert auth == "Basic " + base64.b64encode(b"carol:pr0xy").decode()
            assert {host for _, host, _ in cache.seen} == {netloc}
            # no_proxy covering the host: straight to it (which only the proxy can
            # reach: the remote is not usable), the proxy asked nothing.
            if shape.startswith("http://[2001:db8::1]:"):
                through = len(proxy.seen)
                r = kiln(
                    "build", "build.py", "--output-dir", "o3", "--cache-dir", "c3",
                    "--remote-cache", url, env={variable: proxy_url, "no_proxy": "2001:db8::1"},
                    timeout=60,
                )  # fmt: skip
                assert r.returncode == 0 and "4 built" in r.stderr, r.stderr
                assert len(proxy.seen) == through
                assert len(runs(project)) == 8
                return
    assert len(runs(project)) == 4


@pytest.mark.parametrize("variable", ["http_proxy", "HTTP_PROXY"])
@pytest.mark.parametrize("host", ["[::1]", "[0:0:0:0:0:0:0:1]"])
def test_a_loopback_remote_never_goes_through_the_proxy(
    kiln: Callable[..., Any], project: Path, variable: str, host: str
) -> None:
    """No ``no_proxy``: a remote on this machine's loopback is reached straight (a
    proxy elsewhere cannot reach it); the proxy is asked nothing."""
    with serving(_ipv6_cache()) as cache:
        url = f"http://{host}:{cache.server_address[1]}/c"
        with serving(_Proxy({})) as proxy:
            shared(kiln, url, env={variable: f"http://127.0.0.1:{proxy.server_address[1]}"})
            assert proxy.seen == []
        assert any(line.startswith("PUT /c/cas/") for line, _, _ in cache.seen)
    assert len(runs(project)) == 4
