"""A real nginx serving WebDAV ``PUT`` on 127.0.0.1, as a remote cache for tests.

``NginxCache(directory)`` writes a minimal configuration into ``directory``, starts
``nginx -p DIR -c CONF -g 'daemon off;'`` on a free port and serves (and stores)
files under ``directory/data``; ``close`` stops it. The ``nginx_cache`` fixture
(``conftest.py``) yields one per test. It needs no pytest itself: the benchmarks
(``benchmarks/``) start it too, in an environment without the dev extras.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

_CONF = """\
worker_processes 1;
{user}
pid {root}/nginx.pid;
error_log {root}/error.log warn;
events {{ worker_connections 64; }}
http {{
    access_log off;
    client_body_temp_path {root}/tmp/body;
    proxy_temp_path {root}/tmp/proxy;
    fastcgi_temp_path {root}/tmp/fastcgi;
    uwsgi_temp_path {root}/tmp/uwsgi;
    scgi_temp_path {root}/tmp/scgi;
    client_max_body_size 0;
    server {{
        listen 127.0.0.1:{port};
        location / {{
            root {root}/data;
            dav_methods PUT;
            create_full_put_path on;
            dav_access user:rw group:r all:r;
        }}
    }}
}}
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NginxCache:
    """A running nginx; ``url`` is the cache's URL, ``data`` the directory it serves."""

    def __init__(self, root: Path):
        program = shutil.which("nginx")
        if program is None:
            raise FileNotFoundError("nginx is not installed")
        self.root = root
        self.data = root / "data"
        self.data.mkdir(parents=True)
        (root / "tmp").mkdir()
        self.port = free_port()
        user = "user root;" if os.geteuid() == 0 else ""  # workers must reach tmp dirs
        conf = root / "nginx.conf"
        conf.write_text(_CONF.format(root=root, port=self.port, user=user))
        self._proc = subprocess.Popen(
            [
                program,
                "-p",
                str(root),
                "-e",
                str(root / "error.log"),
                "-c",
                str(conf),
                "-g",
                "daemon off;",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        self._wait_ready()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                err = self._proc.stderr.read().decode() if self._proc.stderr else ""
                raise RuntimeError(f"nginx exited with {self._proc.returncode}: {err}")
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=0.5),
            ):
                return
            time.sleep(0.05)
        self.close()
        raise RuntimeError("nginx did not start listening within 15 s")

    def files(self, area: str) -> list[Path]:
        """The files stored under ``ac`` or ``cas``."""
        base = self.data / area
        return sorted(p for p in base.rglob("*") if p.is_file()) if base.is_dir() else []

    def close(self) -> None:
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        if self._proc.stderr is not None:
            self._proc.stderr.close()
