"""The remote cache and the Dask address as trust boundaries (docs/reliability.md,
"Trust model"): every remote call has a total deadline and a size cap from what is
expected; a server that drips, stalls, redirects, sends too much or is not the
expected kind of server is a reported miss or a clear error within the deadline;
option values are checked before anything starts; credentials never show.

The peers are real servers on 127.0.0.1 written here, each misbehaving one way."""

from __future__ import annotations

import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import needs
import pytest
from cache_build import entries, module_text, runs, write_tool
from nginx import NginxCache

Kiln = Callable[..., Any]
# What a peer does with one request: (method, path, the connection's socket).
Answer = Callable[[str, str, socket.socket], None]


class Peer:
    """A TCP server on 127.0.0.1 answering each request with ``answer``; it counts
    requests by path. ``tls`` wraps connections in TLS (a self-signed certificate)."""

    def __init__(self, answer: Answer, tls: ssl.SSLContext | None = None):
        self.answer = answer
        self.tls = tls
        self.paths: list[str] = []
        self.stop = threading.Event()
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{self.port}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            if self.tls is not None:
                conn = self.tls.wrap_socket(conn, server_side=True)
            data = b""
            while True:
                while b"\r\n\r\n" not in data:
                    chunk = conn.recv(65536)
                    if not chunk:
                        return
                    data += chunk
                head, _, data = data.partition(b"\r\n\r\n")
                method, path, _ = head.split(b"\r\n")[0].decode().split(" ", 2)
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                while len(data) < length:
                    data += conn.recv(65536)
                data = data[length:]
                self.paths.append(path)
                self.answer(method, path, conn)
        except (OSError, ValueError, ssl.SSLError):
            pass
        finally:
            conn.close()

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


@pytest.fixture
def peers() -> Iterator[Callable[..., Peer]]:
    made: list[Peer] = []

    def make(answer: Answer, tls: ssl.SSLContext | None = None) -> Peer:
        made.append(Peer(answer, tls))
        return made[-1]

    yield make
    for p in made:
        p.close()


def reply(conn: socket.socket, status: str, body: bytes = b"", **headers: str) -> None:
    lines = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}"]
    lines += [f"{k.replace('_', '-')}: {v}" for k, v in headers.items()]
    conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode() + body)


def drip(conn: socket.socket, data: bytes, every_s: float) -> None:
    for byte in data:
        conn.sendall(bytes([byte]))
        time.sleep(every_s)


@pytest.fixture
def project(tmp_path: Path, write_module: Callable[..., Path]) -> Path:
    tool = write_tool(tmp_path)
    write_module(module_text(tool, tmp_path / "counter", ["m1", "m2"], size=100_000))
    return tmp_path / "counter"


def _entries(cache: Path) -> dict[str, bytes]:
    """The action-cache entries of a local cache, by name."""
    return entries(cache)


def timed(kiln: Kiln, *args: str, **kw: Any) -> tuple[Any, float]:
    started = time.monotonic()
    r = kiln("build", "build.py", *args, timeout=120, **kw)
    took = time.monotonic() - started
    assert "Traceback" not in r.stderr, r.stderr
    return r, took


def remote_warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "warning: remote cache" in line]


# -- deadlines ---------------------------------------------------------------------


@pytest.mark.parametrize("what", ["body", "headers", "blob"])
def test_a_dripping_remote_fails_within_the_deadline(
    what: str, tmp_path: Path, project: Path, kiln_subprocess: Kiln, peers: Callable[..., Peer]
) -> None:
    if what == "blob":  # the entry is served at once, its blob a byte a second
        kiln_subprocess("build", "build.py", "--output-dir", "o0", "--cache-dir", "seed")
        entries = _entries(tmp_path / "seed")

    def answer(method: str, path: str, conn: socket.socket) -> None:
        name = path.rsplit("/", 1)[-1]
        if what == "headers":
            drip(conn, b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", 0.5)
        elif what == "body" and path.startswith("/ac/"):
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
            drip(conn, b"x" * 1000, 0.5)
        elif what == "blob" and path.startswith("/ac/") and name in entries:
            reply(conn, "200 OK", entries[name])
        elif what == "blob" and path.startswith("/cas/") and method == "GET":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
            drip(conn, b"x" * 100_000, 0.5)
        else:
            reply(conn, "404 Not Found")

    peer = peers(answer)
    args = ["--cache-dir", "fresh", "--remote-cache", peer.url, "--remote-cache-timeout", "2"]
    r, took = timed(kiln_subprocess, *args)
    assert r.returncode == 0, r.stderr
    assert took < 15, (took, r.stderr)  # 2 s (plus a tenth for the blob's 100 kB) + start-up
    [warning] = remote_warnings(r.stderr)
    assert "within 2" in warning and "not usable" in warning, warning


# -- size caps ---------------------------------------------------------------------


def build_measuring_rss(cwd: Path, *args: str) -> tuple[int, str, float]:
    """``kiln build build.py ARGS`` run from a small Python parent: its status, stderr
    and peak resident size in MiB (the largest child's, from getrusage)."""
    probe = (
        "import resource, subprocess, sys\n"
        "r = subprocess.run([sys.executable, '-m', 'kiln', 'build', 'build.py', *sys.argv[1:]],"
        " capture_output=True, text=True)\n"
        "rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
        "sys.stdout.write(f'{r.returncode} {rss}')\n"
        "sys.stderr.write(r.stderr)\n"
    )
    p = subprocess.run(
        [sys.executable, "-c", probe, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        env={**os.environ, "NO_COLOR": "1"},
        timeout=120,
    )
    code, kib = p.stdout.split()
    return int(code), p.stderr, int(kib) / 1024


@pytest.mark.parametrize("length", ["announced", "unannounced"])
def test_a_remote_sending_more_than_expected_is_a_miss(
    length: str, tmp_path: Path, project: Path, kiln_subprocess: Kiln, peers: Callable[..., Peer]
) -> None:
    kiln_subprocess("build", "build.py", "--output-dir", "o0", "--cache-dir", "seed")
    entries = _entries(tmp_path / "seed")
    junk = b"x" * (1 << 20)

    def flood(conn: socket.socket, announce: int) -> None:
        head = "HTTP/1.1 200 OK\r\n"
        head += (
            f"Content-Length: {announce}\r\n" if length == "announced" else "Connection: close\r\n"
        )
        conn.sendall(head.encode() + b"\r\n")
        for _ in range(3 << 10):  # 3 GiB, unless kiln stops reading
            conn.sendall(junk)

    def answer(method: str, path: str, conn: socket.socket) -> None:
        name = path.rsplit("/", 1)[-1]
        if method != "GET":  # uploads are taken; nothing is there to HEAD
            reply(conn, "201 Created" if method == "PUT" else "404 Not Found")
        elif path.startswith("/ac/") and name in entries and "m1" in entries[name].decode():
            flood(conn, 3 << 30)  # an entry of 3 GiB
        elif path.startswith("/ac/") and name in entries:
            reply(conn, "200 OK", entries[name])
        elif path.startswith("/cas/"):
            flood(conn, 3 << 30)  # 3 GiB for a blob of 100 kB
        else:
            reply(conn, "404 Not Found")

    peer = peers(answer)
    started = time.monotonic()
    code, err, rss = build_measuring_rss(
        tmp_path, "--cache-dir", "fresh", "--remote-cache", peer.url
    )
    took = time.monotonic() - started
    assert code == 0 and "3 built, 1 cached" in err and "Traceback" not in err, err
    assert took < 30, took
    assert rss < 300, rss  # kiln never held the flood (a 3 GiB entry took 6.3 GB)
    stored = sum(p.stat().st_size for p in (tmp_path / "fresh").rglob("*") if p.is_file())
    assert stored < 2 << 20  # nor wrote it (3 GiB for a blob filled the disk)
    [warning] = remote_warnings(err)  # reported once
    assert "than expected" in warning and "counted as a miss" in warning, warning


# -- answers that are not what was asked --------------------------------------------


def test_a_redirect_is_a_miss_and_never_followed(
    tmp_path: Path, project: Path, kiln: Kiln, peers: Callable[..., Peer]
) -> None:
    elsewhere = peers(lambda m, p, conn: reply(conn, "200 OK", b"not yours"))

    def answer(method: str, path: str, conn: socket.socket) -> None:
        location = f"http://user:SECRET@127.0.0.1:{elsewhere.port}{path}?token=SECRET"
        reply(conn, "302 Found", Location=location)

    peer = peers(answer)
    r, _ = timed(kiln, "--cache-dir", "fresh", "--remote-cache", peer.url)
    assert r.returncode == 0 and "4 built" in r.stderr, r.stderr
    assert elsewhere.paths == []  # never followed, neither a GET nor a PUT
    warnings = remote_warnings(r.stderr)
    # The misses reported once; the uploads it refused (a redirect too) once.
    assert len([w for w in warnings if "HTTP 302" in w and "a miss" in w]) == 1, r.stderr
    assert len([w for w in warnings if "refused an upload" in w]) == 1, r.stderr
    assert "kiln does not follow redirects" in r.stderr and "SECRET" not in r.stderr


@pytest.mark.parametrize("kind", ["closes mid-body", "not HTTP", "garbage status"])
def test_a_server_that_is_not_a_cache_is_reported_and_left(
    kind: str, tmp_path: Path, project: Path, kiln: Kiln, peers: Callable[..., Peer]
) -> None:
    def answer(method: str, path: str, conn: socket.socket) -> None:
        if kind == "closes mid-body":
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10)
        elif kind == "not HTTP":
            conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
        else:
            conn.sendall(b"\x1b]0;pwned\x07HTTP/9 \x1b[2J\r\n\r\n")
        conn.shutdown(socket.SHUT_RDWR)

    peer = peers(answer)
    r, took = timed(kiln, "--cache-dir", "fresh", "--remote-cache", peer.url)
    assert r.returncode == 0 and "4 built" in r.stderr, r.stderr
    assert len(remote_warnings(r.stderr)) == 1, r.stderr
    assert "\x1b" not in r.stderr  # the server's bytes reach the terminal escaped
    assert took < 20


def test_a_tls_server_that_never_completes_the_handshake_costs_the_deadline(
    tmp_path: Path, project: Path, kiln: Kiln
) -> None:
    with socket.socket() as silent:  # https: the client speaks first; nobody answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"https://127.0.0.1:{silent.getsockname()[1]}"
        r, took = timed(
            kiln, "--cache-dir", "fresh", "--remote-cache", url, "--remote-cache-timeout", "1"
        )
    assert r.returncode == 0 and "4 built" in r.stderr, r.stderr
    [warning] = remote_warnings(r.stderr)
    assert "within 1 s" in warning, warning
    assert took < 10


def _certificate(tmp_path: Path) -> ssl.SSLContext:
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            "openssl",
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context


def test_a_tls_server_kiln_cannot_trust_is_reported(
    tmp_path: Path, project: Path, kiln: Kiln, peers: Callable[..., Peer]
) -> None:
    peer = peers(lambda m, p, conn: reply(conn, "404 Not Found"), tls=_certificate(tmp_path))
    r, took = timed(kiln, "--cache-dir", "fresh", "--remote-cache", peer.url)
    assert r.returncode == 0 and "4 built" in r.stderr, r.stderr
    [warning] = remote_warnings(r.stderr)
    assert "CERTIFICATE_VERIFY_FAILED" in warning, warning


# -- options checked before anything starts -----------------------------------------


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "0", "-1", "1e309", "ten", "90000"])
def test_a_timeout_that_bounds_nothing_is_a_usage_error(
    value: str, tmp_path: Path, project: Path, kiln: Kiln
) -> None:
    for option in ("--remote-cache-timeout", "--executor-timeout"):
        r = kiln("build", "build.py", "--remote-cache", "http://127.0.0.1:9", f"{option}={value}")
        assert r.returncode == 2 and option in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    assert not (tmp_path / "kiln-out").exists() and runs(project) == []


@pytest.mark.parametrize(
    "url, expected",
    [
        ("htps://alice:Hunter2Secret@h", "is not an http:// or https:// URL"),
        ("http://alice:Hunter2Secret@h/caché", "percent-encode it (%C3%A9)"),
        ("http://alice:Hunter2Secret@h:99999/", "is not a URL"),
        ("http://alice:Hunter2Secret@[::1/x", "is not a URL"),
        ("alice:Hunter2Secret@h/x", "is not an http:// or https:// URL"),
        ("http://alice:Hunter2Secret@h/x?token=Hunter2Secret", "query or a fragment"),
        ("http://h/a b", "percent-encode it"),
        ("ftp://alice:Hunter2Secret@h", "is not an http:// or https:// URL"),
    ],
)
def test_a_bad_remote_url_is_a_usage_error_that_shows_no_secret(
    url: str, expected: str, tmp_path: Path, project: Path, kiln: Kiln
) -> None:
    for args, env, where in (
        (["--remote-cache", url], {}, "--remote-cache"),
        ([], {"KILN_REMOTE_CACHE": url}, "KILN_REMOTE_CACHE"),
    ):
        r = kiln("build", "build.py", *args, env=env)
        assert r.returncode == 2 and where in r.stderr and expected in r.stderr, r.stderr
        assert "Hunter2Secret" not in r.stderr + r.stdout and "Traceback" not in r.stderr
    assert not (tmp_path / "kiln-out").exists() and runs(project) == []


def test_an_executor_address_with_credentials_shows_none(project: Path, kiln: Kiln) -> None:
    r = kiln("build", "build.py", "--executor", "dask://alice:Hunter2Secret@h:1")
    assert r.returncode == 2 and "--executor" in r.stderr and "Hunter2Secret" not in r.stderr


# -- Dask -----------------------------------------------------------------------------


def _require_dask() -> None:
    needs.module("distributed")


@pytest.mark.parametrize("kind", ["silent", "HTTP", "TLS", "lying length"])
def test_a_dask_address_that_is_no_scheduler_is_an_error_within_the_timeout(
    kind: str, tmp_path: Path, project: Path, kiln_subprocess: Kiln, peers: Callable[..., Peer]
) -> None:
    _require_dask()

    def answer(method: str, path: str, conn: socket.socket) -> None:
        reply(conn, "400 Bad Request", b"not a scheduler")

    if kind == "silent":
        peer = peers(lambda m, p, conn: time.sleep(60))  # never sends a request line: waits
    elif kind == "HTTP":
        peer = peers(answer)
    elif kind == "TLS":
        peer = peers(answer, tls=_certificate(tmp_path))
    else:  # speaks first, as Dask does, announcing an 8 GiB message

        def lying(conn: socket.socket) -> None:
            conn.sendall((8 << 30).to_bytes(8, "little"))
            time.sleep(30)

        peer = peers(answer)
        peer.sock.close()
        peer = _first_speaker(lying)
    started = time.monotonic()
    r = kiln_subprocess(
        "build",
        "build.py",
        "--remote-cache",
        "http://127.0.0.1:9",
        "--executor",
        f"dask://127.0.0.1:{peer.port}",
        "--executor-timeout",
        "2",
        timeout=60,
    )
    took = time.monotonic() - started
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"tcp://127.0.0.1:{peer.port}" in r.stderr, r.stderr
    if kind == "lying length":
        assert "is not a Dask scheduler" in r.stderr, r.stderr
    else:
        assert "answered as a Dask scheduler within 2 s" in r.stderr, r.stderr
    assert took < 20, took
    assert not (tmp_path / "kiln-out").exists() and runs(project) == []


class _Speaker:
    port: int


def _first_speaker(speak: Callable[[socket.socket], None]) -> _Speaker:
    """A server that sends first on every connection (``speak``)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(8)

    def serve() -> None:
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            threading.Thread(target=speak, args=(conn,), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    found = _Speaker()
    found.port = sock.getsockname()[1]
    return found


def test_ctrl_c_on_a_local_dask_cluster_prints_no_tracebacks(
    tmp_path: Path, write_module: Callable[..., Path], nginx_cache: NginxCache
) -> None:
    _require_dask()
    marker = tmp_path / "started"
    write_module(f"""
@entrypoint
def top():
    return [run_command(name=f"long{{i}}.txt", command=["sh", "-c",
            "touch {marker}; sleep 60; echo done > {{out}}"]) for i in range(3)]
""")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kiln",
            "build",
            "build.py",
            "--executor",
            "dask-local:2",
            "--remote-cache",
            nginx_cache.url,
        ],
        cwd=tmp_path,
        env={**os.environ, "NO_COLOR": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a process group of its own, as a terminal's job
    )
    deadline = time.monotonic() + 60
    while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert marker.exists(), proc.communicate(timeout=30)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C at a terminal does
    _, err = proc.communicate(timeout=90)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err
    assert len(err.splitlines()) < 10, err
