"""``--executor``: where a build's out-of-process actions run, and the cluster
connection a build opens for it."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from kiln.base.errors import UsageError
from kiln.cli.cache_options import seconds_option
from kiln.devices.identity import DeviceSet
from kiln.execution.cluster.spec import parse_executor

if TYPE_CHECKING:  # imported when a build runs on a cluster, not on every build
    from kiln.cache import BuildCache
    from kiln.cache.remote import RemoteCache
    from kiln.execution.cluster.offload import ClusterOffload


def add_executor_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("remote execution")
    g.add_argument(
        "--executor",
        default=None,
        metavar="WHERE",
        help="local (default: $KILN_EXECUTOR, else local), dask://HOST:PORT (a "
        "Dask scheduler) or dask-local:N (N Dask worker processes here); "
        "dask:// needs --remote-cache; dask-local:N shares kiln's local cache "
        "with its workers (docs/cluster.md)",
    )
    g.add_argument(
        "--executor-timeout",
        type=seconds_option,
        default=10.0,
        metavar="SECONDS",
        help="bound on connecting to the Dask scheduler, all of it (default: 10)",
    )


@contextlib.contextmanager
def open_remote(
    ns: argparse.Namespace, cache: BuildCache | None, warn: Callable[[str], None]
) -> Iterator[ClusterOffload | None]:
    """The cluster a build with options ``ns`` runs on (None: this machine), closed
    (and, for ``dask-local``, shut down) when the build ends."""
    text = getattr(ns, "executor", None) or os.environ.get("KILN_EXECUTOR") or "local"
    spec = parse_executor(text)
    if not spec.remote or getattr(ns, "dry_run", False):
        yield None
        return
    if cache is None:
        raise UsageError(
            f"--executor {text} moves inputs and outputs through a cache: drop --no-cache"
        )
    with _workers_cas(text, spec.kind, cache, warn) as cas:
        from kiln.execution.cluster.dask_executor import DaskExecutor
        from kiln.execution.cluster.offload import ClusterOffload

        executor = DaskExecutor(
            spec, cas.url, connect_timeout_s=getattr(ns, "executor_timeout", 10.0)
        )
        try:
            warn(f"kiln: {executor.describe()}")
            yield ClusterOffload(executor, cache, cas, warn)
        finally:
            executor.close()
            if cas is not cache.remote:
                cas.close()


@contextlib.contextmanager
def _workers_cas(
    text: str, kind: str, cache: BuildCache, warn: Callable[[str], None]
) -> Iterator[RemoteCache]:
    """The CAS the workers share: the remote cache; for ``dask-local`` without one,
    kiln's local cache, served on 127.0.0.1 while the build lasts
    (``kiln.cache.cas_server``)."""
    remote = cache.remote
    if remote is not None:
        if not remote.uploads:
            raise UsageError(
                f"--executor {text} needs uploads to the remote cache: "
                "drop --remote-cache-upload no"
            )
        yield remote
        return
    if kind != "dask-local":
        raise UsageError(
            f"--executor {text} needs --remote-cache URL: workers on other machines fetch "
            "inputs and store outputs in the remote cache's CAS (dask-local:N, on this "
            "machine, needs none)"
        )
    from kiln.cache.cas_server import serving
    from kiln.cache.remote import RemoteCache

    with serving(cache.local, cache.max_size) as url:
        yield RemoteCache(url, warn=warn)


def build_devices(remote: ClusterOffload | None, require: bool) -> DeviceSet:
    """The devices a build's checks run on: the cluster's workers' (``remote``), or
    this machine's; ``require``: one whose device is absent fails."""
    if remote is not None:
        return remote.executor.device_set(require)
    return DeviceSet.local(require)  # one per build: KILN_DEVICES is read again
