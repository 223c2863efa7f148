"""Shared fixtures: writing build modules and running the real ``kiln`` CLI."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from nginx import NginxCache
from procs import tagged_processes

# A build module's usual header, for tests that write modules.
HEADER = """\
from kiln import *
from kiln.executor import *
"""


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def write_module(tmp_path: Path):
    """Write a build module (dedented, with HEADER prepended) and return its path."""

    def write(text: str, name: str = "build.py", header: bool = True) -> Path:
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text((HEADER if header else "") + textwrap.dedent(text))
        return path

    return write


@pytest.fixture
def kiln(kiln_subprocess):
    """Run ``python -m kiln ARGS`` in tmp_path (plain console); return its Result.
    A test module whose tests need no process of their own overrides it with
    ``kiln_in_process``."""
    return kiln_subprocess


@pytest.fixture
def kiln_subprocess(tmp_path: Path):
    """Run ``python -m kiln ARGS`` in tmp_path (plain console); return its Result."""

    def run(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> Result:
        full_env = {**os.environ, "NO_COLOR": "1", **(env or {})}
        proc = subprocess.run(
            [sys.executable, "-m", "kiln", *args],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=full_env,
        )
        return Result(proc.returncode, proc.stdout, proc.stderr)

    return run


@pytest.fixture
def kiln_in_process(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Run ``kiln ARGS`` in this process (``kiln.cli.main.run_cli``) in tmp_path, with
    the streams captured; return its Result. For tests that need no process of their
    own (no signal, no kill, no terminal, no start-up environment): much faster than
    the ``kiln`` fixture's ``python -m kiln``."""
    from kiln.cli.main import run_cli

    def run(*args: str, timeout: float = 120, env: dict[str, str] | None = None) -> Result:
        out, err = io.StringIO(), io.StringIO()
        with monkeypatch.context() as m:
            m.chdir(tmp_path)
            for name, value in {"NO_COLOR": "1", **(env or {})}.items():
                m.setenv(name, value)
            code = run_cli(list(args), stdout=out, stderr=err)
        return Result(code, out.getvalue(), err.getvalue())

    return run


@pytest.fixture
def nginx_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NginxCache]:
    """A real nginx serving WebDAV on 127.0.0.1 (``tests/nginx.py``). Without nginx the
    test skips, except in CI (``CI`` set), where it fails: there the tests must run
    (``scripts/test`` installs nginx)."""
    import shutil

    if shutil.which("nginx") is None:
        if os.environ.get("CI"):
            pytest.fail("nginx is not installed; CI must install it (scripts/test does)")
        pytest.skip("nginx is not installed (apt-get install nginx); these tests need it")
    server = NginxCache(tmp_path_factory.mktemp("nginx"))
    try:
        yield server
    finally:
        server.close()


@pytest.fixture(autouse=True)
def _private_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> Path:
    """Every test gets its own empty shared cache (``KILN_CACHE_DIR``): no test reads the
    user's cache or another test's results, and none reaches a remote cache."""
    path = tmp_path_factory.mktemp("kiln-cache")
    monkeypatch.setenv("KILN_CACHE_DIR", str(path))
    for name in ("KILN_REMOTE_CACHE", "KILN_CACHE_MAX_SIZE"):
        monkeypatch.delenv(name, raising=False)
    return path


@pytest.fixture
def tag() -> Iterator[str]:
    """A value for $KILN_TEST_TAG; processes still carrying it at the end are killed."""
    value = uuid.uuid4().hex
    yield value
    for pid in tagged_processes(value):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    session.config.stash[_EXIT_STATUS] = int(exitstatus)


def pytest_unconfigure(config: pytest.Config) -> None:
    """IREE's runtime bindings (nanobind), once imported by an in-process test, print
    hundreds of "leaked" lines when the interpreter finalizes, burying pytest's
    summary. The run is over by now: leave without finalizing, with pytest's status."""
    if "iree._runtime" in sys.modules or "iree.runtime" in sys.modules:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(config.stash.get(_EXIT_STATUS, 0))


_EXIT_STATUS = pytest.StashKey[int]()
