"""The ``--executor`` option's value: where out-of-process actions run."""

from __future__ import annotations

import re
from dataclasses import dataclass

from kiln.base.errors import UsageError
from kiln.base.redact import redact_url
from kiln.base.terminal import printable

_ADDRESS = re.compile(r"^dask://(?P<host>[^:/\s]+):(?P<port>\d{1,5})/?$")
_LOCAL = re.compile(r"^dask-local:(?P<n>\d+)$")


@dataclass(frozen=True)
class ExecutorSpec:
    """``local`` (kiln's own pools), ``dask`` (a scheduler at ``address``) or
    ``dask-local`` (a LocalCluster of ``workers`` processes kiln starts)."""

    kind: str
    address: str = ""
    workers: int = 0

    @property
    def remote(self) -> bool:
        return self.kind != "local"


def parse_executor(text: str) -> ExecutorSpec:
    """Parse ``local``, ``dask://HOST:PORT`` or ``dask-local:N``."""
    if text == "local":
        return ExecutorSpec("local")
    m = _ADDRESS.match(text)
    if m is not None and 0 < int(m["port"]) < 65536:
        return ExecutorSpec("dask", address=f"tcp://{m['host']}:{m['port']}")
    m = _LOCAL.match(text)
    if m is not None and int(m["n"]) > 0:
        return ExecutorSpec("dask-local", workers=int(m["n"]))
    shown = printable(redact_url(text), one_line=True)
    raise UsageError(
        f"--executor {shown!r}: give local, dask://HOST:PORT (a running Dask scheduler) "
        "or dask-local:N (N worker processes on this machine)"
    )
