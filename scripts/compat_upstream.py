"""Measure iree.build compatibility on iree.build's own test suite, offline.

    python scripts/compat_upstream.py UPSTREAM_DIR [--package kiln|iree.build]

UPSTREAM_DIR holds copies of iree-org/iree's
``compiler/bindings/python/test/build_api/`` files (basic_test.py, net_test.py,
mnist_builder_test.py, mnist_builder.py); they are not part of kiln's tree.
The script copies them into a scratch directory, with ``--package kiln`` rewrites
``iree.build`` to ``kiln``, points every ``https://HOST/PATH`` at an HTTPS server
on 127.0.0.1 (a throw-away certificate, trusted through ``SSL_CERT_FILE``) that
serves made-up contents for those URLs, runs each test file as upstream does
(``python FILE.py``), and prints each test's result and the totals.
Nothing is fetched from the network.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import functools
import http.server
import os
import re
import shutil
import ssl
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

TEST_FILES = ("basic_test.py", "net_test.py", "mnist_builder_test.py")
SUPPORT_FILES = ("mnist_builder.py",)
# URLs the upstream tests expect to answer 404 (on the real internet they do).
ABSENT = ("github.com/iree-org/doesnotexist",)
_URL = re.compile(r"https://([A-Za-z0-9.-]+)/([^\s\"'\\]*)")
_RESULT = re.compile(r"^(FAIL|ERROR): (\w+) \(", re.MULTILINE)
_RAN = re.compile(r"^Ran (\d+) tests?", re.MULTILINE)


@dataclass
class Outcome:
    """One upstream test: ``status`` is PASS, FAIL, ERROR or NOT RUN."""

    file: str
    test: str
    status: str
    why: str = ""


def rewrite(text: str, package: str, base: str) -> tuple[str, set[str]]:
    """``text`` with imports naming ``package`` and URLs served under ``base``;
    also the ``host/path`` of every URL it names."""
    if package != "iree.build":
        text = re.sub(r"\biree\.build\b", package, text)
    found: set[str] = set()

    def local(m: re.Match[str]) -> str:
        found.add(f"{m.group(1)}/{m.group(2)}")
        return f"{base}/{m.group(1)}/{m.group(2)}"

    return _URL.sub(local, text), found


def tests_of(source: str) -> list[str]:
    """The test methods of the ``unittest.TestCase`` classes in ``source``."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ClassDef) and any(
            ast.unparse(b).endswith("TestCase") for b in node.bases
        ):
            names += [
                f.name
                for f in node.body
                if isinstance(f, ast.FunctionDef) and f.name.startswith("test")
            ]
    return names


def outcomes(file: str, names: list[str], proc: subprocess.CompletedProcess[str]) -> list[Outcome]:
    """Read unittest's report (stderr) of running ``file``."""
    ran = _RAN.search(proc.stderr)
    if ran is None or int(ran.group(1)) != len(names):
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no output"]
        return [Outcome(file, n, "NOT RUN", f"exit {proc.returncode}: {tail[0]}") for n in names]
    failed = {m.group(2): m.group(1) for m in _RESULT.finditer(proc.stderr)}
    return [
        Outcome(file, n, failed[n], _failure_line(proc.stderr, n))
        if n in failed
        else Outcome(file, n, "PASS")
        for n in names
    ]


def _failure_line(report: str, name: str) -> str:
    """The last line of the traceback unittest printed for test ``name``."""
    block = re.search(
        rf"^(?:FAIL|ERROR): {name} \(.*?\n-+\n(.*?)(?:\n=+\n|\n-+\nRan )",
        report,
        re.MULTILINE | re.DOTALL,
    )
    if block is None:
        return ""
    lines = [line for line in block.group(1).splitlines() if line.strip()]
    last = lines[-1].strip() if lines else ""
    return last if len(last) <= 200 else f"{last[:90]} ... {last[-100:]}"


def write_served_files(root: Path, urls: set[str]) -> None:
    """Made-up contents for every URL but the ABSENT ones: an ONNX model for
    ``.onnx`` paths (when the onnx package is there), else a line naming the URL."""
    for url in sorted(urls):
        if url in ABSENT:
            continue
        path = root / url
        path.parent.mkdir(parents=True, exist_ok=True)
        if url.endswith(".onnx") and _write_onnx_model(path):
            continue
        path.write_text(f"served by compat_upstream.py for https://{url}\n")


def _write_onnx_model(path: Path) -> bool:
    """An MNIST-shaped classifier (1x1x28x28 -> 1x10) with zero weights."""
    try:
        import onnx
        from onnx import TensorProto, helper
    except ImportError:
        return False
    weights = helper.make_tensor("w", TensorProto.FLOAT, [784, 10], [0.0] * 7840)
    bias = helper.make_tensor("b", TensorProto.FLOAT, [1, 10], [0.0] * 10)
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["x"], ["flat"]),
            helper.make_node("MatMul", ["flat", "w"], ["mm"]),
            helper.make_node("Add", ["mm", "b"], ["y"]),
        ],
        "mnist_shaped",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 28, 28])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 10])],
        initializer=[weights, bias],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return True


def make_certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, made with the openssl program."""
    cert, key = folder / "cert.pem", folder / "key.pem"
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
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


@contextlib.contextmanager
def https_server(root: Path, cert: Path, key: Path) -> Iterator[str]:
    """Serve ``root`` over HTTPS on 127.0.0.1; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def measure(
    upstream: Path, package: str, python: str, timeout: float, show_output: bool
) -> list[Outcome]:
    missing = [n for n in TEST_FILES + SUPPORT_FILES if not (upstream / n).is_file()]
    if missing:
        raise SystemExit(f"compat_upstream: {upstream} lacks {', '.join(missing)}")
    with tempfile.TemporaryDirectory(prefix="kiln-compat-") as scratch:
        work, served = Path(scratch) / "tests", Path(scratch) / "served"
        work.mkdir()
        cert, key = make_certificate(Path(scratch))
        with https_server(served, cert, key) as base:
            urls: set[str] = set()
            for name in TEST_FILES + SUPPORT_FILES:
                text, found = rewrite((upstream / name).read_text(), package, base)
                (work / name).write_text(text)
                urls |= found
            write_served_files(served, urls)
            env = _child_env(package, cert)
            # As on a fresh machine: an empty shared cache of this run's own, so that
            # a download upstream's tests expect is not served from an earlier run.
            env["KILN_CACHE_DIR"] = str(Path(scratch) / "kiln-cache")
            results = []
            for name in TEST_FILES:
                proc = _run(python, work / name, env, timeout)
                if show_output:
                    print(f"===== {name}\n{proc.stdout}\n{proc.stderr}", file=sys.stderr)
                results += outcomes(name, tests_of((work / name).read_text()), proc)
    return results


def _child_env(package: str, cert: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR",)}
    env["SSL_CERT_FILE"] = str(cert)
    if package == "kiln":  # this checkout's kiln, ahead of any installed one
        src = str(Path(__file__).resolve().parents[1] / "src")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH")) if p)
    return env


def _run(
    python: str, file: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(
            [python, file.name],
            cwd=file.parent,
            env=env,
            text=True,
            capture_output=True,
            timeout=timeout,
        )
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        return subprocess.CompletedProcess(e.cmd, -9, out, f"timed out after {timeout:g}s")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    p.add_argument("upstream", type=Path, help="folder with upstream's build_api test files")
    p.add_argument(
        "--package",
        default="kiln",
        choices=("kiln", "iree.build"),
        help="what the tests import (default: kiln, from this checkout)",
    )
    p.add_argument("--python", default=sys.executable, help="interpreter to run the tests")
    p.add_argument("--timeout", type=float, default=600, help="seconds per test file")
    p.add_argument("--show-output", action="store_true", help="print each file's output")
    ns = p.parse_args(argv)
    if shutil.which("openssl") is None:
        raise SystemExit("compat_upstream: needs the openssl program for the local HTTPS server")
    results = measure(ns.upstream, ns.package, ns.python, ns.timeout, ns.show_output)
    for r in results:
        print(f"{r.status:8} {r.file}::{r.test}" + (f"  -- {r.why}" if r.why else ""))
    passed = sum(r.status == "PASS" for r in results)
    print(f"{ns.package}: {passed} of {len(results)} upstream tests pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())
