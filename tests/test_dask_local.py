"""``--executor dask-local:N`` with no setup: kiln's local cache, served to its
own workers on 127.0.0.1 for the build (``kiln.cache.cas_server``), is the CAS
they exchange inputs and outputs through. Real LocalClusters, real builds; and
the server itself, through real HTTP."""

from __future__ import annotations

import hashlib
import http.client
import io
import json
import os
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from dask_cluster import require_dask
from procs import tagged_processes, wait_untagged
from test_dask_executor import _THUNK_ACTIONS, lanes

_MODULE = (
    _THUNK_ACTIONS
    + """
@entrypoint
def top():
    src = source_file("data.txt")
    a = run_command(name="a.txt", command=["sh", "-c", "cat {inputs[0]} {inputs[0]} > {out}"],
                    inputs=[src])
    b = shout("b.txt", a)
    return run_command(name="c.txt", command=["sh", "-c", "cat {inputs[0]} {inputs[1]} > {out}"],
                       inputs=[a, b])
"""
)


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")} if root.exists() else set()


def test_dask_local_builds_with_no_cache_options(
    tmp_path: Path, write_module: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    """No --remote-cache: the build runs on two local workers, its outputs are the
    local build's bytes, a second build runs nothing, and nothing is left running
    or on disk but in kiln's directories."""
    require_dask()
    (tmp_path / "data.txt").write_text("hello cluster\n")
    write_module(_MODULE)
    local = kiln("build", "build.py", "--output-dir", "local", "--no-cache")
    assert local.returncode == 0, local.stderr
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    tag = f"dask-local-{os.getpid()}-{tmp_path.name}"
    env = {"TMPDIR": str(scratch), "KILN_TEST_TAG": tag}
    before = _tree(tmp_path) - {"tmp"}
    args = ["build", "build.py", "--output-dir", "out", "--executor", "dask-local:2"]
    first = kiln(*args, "--events", "ev.jsonl", env=env)
    assert first.returncode == 0, first.stderr
    assert "needs --remote-cache" not in first.stderr
    for name in ("a.txt", "b.txt", "c.txt"):
        mine = (tmp_path / "out/genfiles/top" / name).read_bytes()
        assert mine == (tmp_path / "local/genfiles/top" / name).read_bytes(), name
    ran = lanes(tmp_path / "ev.jsonl")
    assert len(ran) == 3 and all(lane.startswith("dask tcp://127.0.0.1:") for lane in ran.values())
    again = kiln(*args, env=env)
    assert again.returncode == 0 and "0 built, 3 up to date" in again.stderr, again.stderr
    wait_untagged(tag)  # no worker, nanny or scheduler outlives the build
    assert not tagged_processes(tag)
    # Outside the output directory and kiln's cache, the build left nothing.
    new = {p for p in _tree(tmp_path) - before if not p.startswith(("out", "ev.jsonl", "tmp"))}
    assert not new, sorted(new)
    # (Dask keeps its scratch space's two lock files in TMPDIR, its workers' dirs gone.)
    assert not [p for p in _tree(scratch) if not p.startswith("dask-scratch-space")]


def test_dask_local_with_no_cache_is_a_clear_error(
    tmp_path: Path, write_module: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    write_module('@entrypoint\ndef top():\n    return run_command(name="a", command=["true"])\n')
    r = kiln("build", "build.py", "--executor", "dask-local:2", "--no-cache")
    assert r.returncode == 2 and "drop --no-cache" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "kiln-out").exists()


def test_a_remote_cluster_still_needs_a_remote_cache(
    tmp_path: Path, write_module: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    """A scheduler elsewhere has workers that cannot read this machine's cache: the
    error says what to give, before any connection is tried."""
    write_module('@entrypoint\ndef top():\n    return run_command(name="a", command=["true"])\n')
    r = kiln("build", "build.py", "--executor", "dask://127.0.0.1:9")
    assert r.returncode == 2, r.stderr
    assert "needs --remote-cache URL" in r.stderr and "dask-local:N" in r.stderr, r.stderr
    assert not (tmp_path / "kiln-out").exists()


# -- the server, through HTTP ---------------------------------------------------


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Any, str]]:
    from kiln.cache import LocalCache
    from kiln.cache.cas_server import serving

    local = LocalCache(tmp_path / "cache")
    with serving(local, max_blob=1 << 20) as url:
        yield local, url
    local.close()


def _request(url: str, method: str, path: str, body: bytes | None = None) -> tuple[int, bytes]:
    parts = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=10)
    try:
        conn.request(method, path, body=body)
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_the_served_cas_keeps_only_blobs_with_their_digest(served: tuple[Any, str]) -> None:
    local, url = served
    prefix = urllib.parse.urlsplit(url).path
    assert url.startswith("http://127.0.0.1:") and len(prefix) > 60
    data = b"a blob\n"
    digest = hashlib.sha256(data).hexdigest()
    assert _request(url, "PUT", f"{prefix}/cas/{digest}", data)[0] == 201
    assert _request(url, "GET", f"{prefix}/cas/{digest}") == (200, data)
    assert local.has_blob(digest)
    liar = hashlib.sha256(b"other").hexdigest()
    assert _request(url, "PUT", f"{prefix}/cas/{liar}", data)[0] == 400
    assert not local.has_blob(liar)
    assert _request(url, "GET", f"{prefix}/cas/{liar}")[0] == 404
    # The action cache is not served: the build's local cache has the entries.
    assert _request(url, "PUT", f"{prefix}/ac/abc", b"{}")[0] == 200
    assert _request(url, "GET", f"{prefix}/ac/abc")[0] == 404


@pytest.mark.parametrize(
    "path",
    [
        "/cas/{d}",
        "/{wrong}/cas/{d}",
        "{prefix}/../cas/{d}",
        "{prefix}/cas/{d}/x",
        "{prefix}x/cas/{d}",
    ],
)
def test_only_the_secret_prefix_reaches_the_cas(served: tuple[Any, str], path: str) -> None:
    local, url = served
    prefix = urllib.parse.urlsplit(url).path
    data = b"secret\n"
    digest = hashlib.sha256(data).hexdigest()
    assert local.put_stream(digest, io.BytesIO(data).read)
    where = path.format(d=digest, prefix=prefix, wrong="0" * 64)
    assert _request(url, "GET", where)[0] == 404
    assert _request(url, "PUT", where, data)[0] == 404


def test_an_oversized_upload_is_refused_and_dropped(served: tuple[Any, str]) -> None:
    """The answer reaches a client still sending its body (the server drops the rest
    before it closes: closed at once, the connection was reset, and the client saw a
    broken pipe now and then); nothing of it is kept."""
    local, url = served
    prefix = urllib.parse.urlsplit(url).path
    for size in (1 << 20) + 1, 8 << 20:
        data = b"x" * size
        digest = hashlib.sha256(data).hexdigest()
        for _ in range(5):
            assert _request(url, "PUT", f"{prefix}/cas/{digest}", data)[0] == 413
        assert not local.has_blob(digest)


def test_the_server_stops_with_the_build(tmp_path: Path) -> None:
    from kiln.cache import LocalCache
    from kiln.cache.cas_server import serving

    local = LocalCache(tmp_path / "cache")
    with serving(local, 1 << 20) as url:
        pass
    parts = urllib.parse.urlsplit(url)
    with pytest.raises(OSError):
        http.client.HTTPConnection(parts.hostname or "", parts.port, timeout=5).connect()
    local.close()
    assert json.dumps(url)  # the URL is plain text


def _raw(url: str, request: bytes, timeout: float = 5) -> bytes:
    """Send ``request`` as written on a socket; the answer's first bytes."""
    import socket

    parts = urllib.parse.urlsplit(url)
    with socket.create_connection((parts.hostname or "", parts.port or 0), timeout) as s:
        s.sendall(request)
        return s.recv(200)


@pytest.mark.parametrize("length", ["5_0", "+5", " 5x", "5, 5"])
def test_a_content_length_not_spelled_as_digits_is_refused(
    served: tuple[Any, str], length: str
) -> None:
    # int() reads '5_0' as 50: the server then waited for bytes that never came.
    local, url = served
    prefix = urllib.parse.urlsplit(url).path
    data = b"hello"
    digest = hashlib.sha256(data).hexdigest()
    head = f"PUT {prefix}/cas/{digest} HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n"
    assert _raw(url, head.encode() + data).startswith(b"HTTP/1.1 411")
    assert not local.has_blob(digest)


def test_two_content_lengths_are_refused(served: tuple[Any, str]) -> None:
    local, url = served
    prefix = urllib.parse.urlsplit(url).path
    data = b"hello"
    digest = hashlib.sha256(data).hexdigest()
    head = f"PUT {prefix}/cas/{digest} HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 50\r\n\r\n"
    assert _raw(url, head.encode() + data).startswith(b"HTTP/1.1 411")
    assert not local.has_blob(digest)


def test_a_client_that_leaves_mid_download_prints_nothing(tmp_path: Path) -> None:
    # A worker stopped while it read a blob: the build's terminal gets no traceback.
    import subprocess
    import sys

    script = tmp_path / "probe.py"
    script.write_text(
        "import hashlib, io, os, socket, sys, time, urllib.parse\n"
        "from kiln.cache import LocalCache\n"
        "from kiln.cache.cas_server import serving\n"
        "local = LocalCache(sys.argv[1])\n"
        "data = os.urandom(16 << 20)\n"
        "d = hashlib.sha256(data).hexdigest()\n"
        "assert local.put_stream(d, io.BytesIO(data).read)\n"
        "with serving(local, max_blob=32 << 20) as url:\n"
        "    p = urllib.parse.urlsplit(url)\n"
        "    for _ in range(3):\n"
        "        s = socket.create_connection((p.hostname, p.port))\n"
        "        s.sendall(f'GET {p.path}/cas/{d} HTTP/1.1\\r\\nHost: x\\r\\n\\r\\n'.encode())\n"
        "        s.recv(100)\n"
        "        s.close()\n"
        "    time.sleep(1)\n"
        "local.close()\n"
        "print('ok')\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == "ok\n"
    assert out.stderr == ""


def test_a_path_that_is_not_ascii_is_404_not_a_traceback(served: tuple[Any, str]) -> None:
    # compare_digest takes ASCII text only: a byte above 0x7f in the request line
    # raised TypeError, which the server printed into the build's terminal.
    _, url = served
    prefix = urllib.parse.urlsplit(url).path
    answer = _raw(url, f"GET {prefix}\xff/cas/x HTTP/1.1\r\nHost: x\r\n\r\n".encode("latin-1"))
    assert answer.startswith(b"HTTP/1.1 404"), answer


class _RecordingProxy(ThreadingHTTPServer):
    """A stand-in for the machine's proxy on 127.0.0.1: it records each request and
    answers 502, as a proxy that cannot reach the server does."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _RecordingHandler)
        self.seen: list[str] = []


class _RecordingHandler(BaseHTTPRequestHandler):
    server: _RecordingProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _refuse(self) -> None:
        self.server.seen.append(f"{self.command} {self.path}")
        self.send_response(502)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD = do_PUT = do_POST = do_CONNECT = _refuse


@pytest.mark.parametrize("variable", ["http_proxy", "HTTP_PROXY"])
def test_the_loopback_cas_never_goes_through_the_environments_proxy(
    tmp_path: Path, write_module: Callable[..., Path], kiln: Callable[..., Any], variable: str
) -> None:
    """A proxy in the environment, no ``no_proxy``: kiln's workers reach its CAS on
    127.0.0.1 straight, as curl, requests and Go reach a loopback address; the proxy
    is asked nothing, and the build is the local build's."""
    require_dask()
    (tmp_path / "data.txt").write_text("hello proxy\n")
    write_module(_MODULE)
    proxy = _RecordingProxy()
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{proxy.server_address[1]}"
        env = {variable: url, "KILN_TEST_TAG": f"dask-proxy-{os.getpid()}-{tmp_path.name}"}
        args = ["build", "build.py", "--executor", "dask-local:2", "--events", "ev.jsonl"]
        r = kiln(*args, env=env)
    finally:
        proxy.shutdown()
        proxy.server_close()
    assert r.returncode == 0, r.stderr
    assert "not usable" not in r.stderr, r.stderr
    assert proxy.seen == []
    built = (tmp_path / "kiln-out/genfiles/top/c.txt").read_bytes()
    assert built == b"hello proxy\n" * 2 + b"HELLO PROXY\n" * 2
    ran = lanes(tmp_path / "ev.jsonl")
    assert len(ran) == 3 and all(lane.startswith("dask tcp://127.0.0.1:") for lane in ran.values())
