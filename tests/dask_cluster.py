"""A real Dask cluster on 127.0.0.1 for tests: ``dask scheduler`` and two
``dask worker`` processes (no nanny, one thread each), each worker with its own
``--local-directory``, as on machines that share no filesystem.

``DaskCluster(root)`` starts them on free ports and waits until both workers are
registered; ``kill_worker``/``kill_scheduler`` SIGKILL one; ``close`` stops all.
The ``dask_cluster`` fixture yields one per test; without Dask it skips, except in
CI (``CI`` set), where it fails: ``scripts/test`` installs the ``dask`` extra.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import needs
import pytest
from nginx import free_port

_READY_S = 60


class DaskCluster:
    """A scheduler at ``address`` and workers ``workers[name] = (process, local dir)``."""

    def __init__(
        self,
        root: Path,
        n_workers: int = 2,
        env: dict[str, str] | None = None,
        worker_args: dict[str, list[str]] | None = None,
        worker_env: dict[str, dict[str, str]] | None = None,
    ):
        """``worker_args`` adds arguments to a worker's command line, by name (``w0``,
        ``w1``, ...), e.g. ``{"w0": ["--resources", "memory=1"]}``; ``worker_env``
        variables to its environment (``PYTHONPATH``: another kiln)."""
        self.root = root
        root.mkdir(parents=True, exist_ok=True)
        self.port = free_port()
        self.env = {**os.environ, **(env or {})}
        self.scheduler = self._start(
            "scheduler",
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--no-dashboard",
            log="scheduler.log",
        )
        self.workers: dict[str, tuple[subprocess.Popen[bytes], Path]] = {}
        for i in range(n_workers):
            name = f"w{i}"
            self._start_worker(
                name, (worker_args or {}).get(name, []), (worker_env or {}).get(name, {})
            )
        self._wait_ready(n_workers)

    def _start_worker(self, name: str, args: list[str], env: dict[str, str]) -> None:
        local = self.root / f"{name}-local"
        local.mkdir(parents=True)
        proc = self._start(
            "worker",
            self.address,
            "--name",
            name,
            "--nthreads",
            "1",
            "--no-nanny",
            "--local-directory",
            str(local),
            "--host",
            "127.0.0.1",
            "--no-dashboard",
            *args,
            log=f"{name}.log",
            env=env,
        )
        self.workers[name] = (proc, local)

    def add_worker(self, name: str, env: dict[str, str] | None = None) -> None:
        """Start one more worker (a machine joining mid-build); return once the
        scheduler has it."""
        self._start_worker(name, [], env or {})
        self._wait_ready(sum(p.poll() is None for p, _ in self.workers.values()))

    @property
    def address(self) -> str:
        return f"tcp://127.0.0.1:{self.port}"

    @property
    def url(self) -> str:
        return f"dask://127.0.0.1:{self.port}"

    def _start(
        self, *args: str, log: str, env: dict[str, str] | None = None
    ) -> subprocess.Popen[bytes]:
        with open(self.root / log, "wb") as out:
            return subprocess.Popen(
                [sys.executable, "-m", "dask", *args],
                stdout=out,
                stderr=subprocess.STDOUT,
                env={**self.env, **(env or {})},
            )

    def _wait_ready(self, n_workers: int) -> None:
        from distributed import Client

        deadline = time.monotonic() + _READY_S
        while time.monotonic() < deadline:
            with (
                contextlib.suppress(OSError, TimeoutError),
                Client(self.address, timeout=5) as client,
            ):
                client.wait_for_workers(n_workers, timeout=max(1, deadline - time.monotonic()))
                return
            time.sleep(0.2)
        self.close()
        raise RuntimeError(f"the Dask cluster did not start within {_READY_S} s: {self.logs()}")

    def logs(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-2000:] for p in self.root.glob("*.log"))

    def worker_of(self, path: str) -> str | None:
        """The worker whose local directory holds ``path``."""
        for name, (_, local) in self.workers.items():
            if path.startswith(str(local.resolve())) or path.startswith(str(local)):
                return name
        return None

    def kill_worker(self, name: str) -> None:
        self.workers[name][0].send_signal(signal.SIGKILL)

    def kill_scheduler(self) -> None:
        self.scheduler.send_signal(signal.SIGKILL)

    def close(self) -> None:
        for proc in [p for p, _ in self.workers.values()] + [self.scheduler]:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def require_dask() -> None:
    needs.module("distributed")


@pytest.fixture
def dask_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaskCluster]:
    require_dask()
    cluster = DaskCluster(tmp_path_factory.mktemp("dask"))
    try:
        yield cluster
    finally:
        cluster.close()
