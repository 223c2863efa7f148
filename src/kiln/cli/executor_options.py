"""``--executor``: where a build's out-of-process actions run, and the cluster
connection a build opens for it."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from kiln.cli.cache_options import seconds_option
from kiln.devices.identity import DeviceSet
from kiln.execution.cluster.spec import parse_executor

if TYPE_CHECKING:  # imported when a build runs on a cluster, not on every build
    from kiln.cache import BuildCache
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
    from kiln.execution.cluster.connect import open_cluster

    timeout = getattr(ns, "executor_timeout", 10.0)
    with open_cluster(text, spec, cache, timeout, warn) as offload:
        yield offload


def build_devices(remote: ClusterOffload | None, require: bool) -> DeviceSet:
    """The devices a build's checks run on: the cluster's workers' (``remote``), or
    this machine's; ``require``: one whose device is absent fails."""
    if remote is not None:
        return remote.client.device_set(require)
    return DeviceSet.local(require)  # one per build: KILN_DEVICES is read again
