"""Connecting a build to its cluster: the scheduler's client, the CAS its workers
share, and the ``ClusterOffload`` that sends actions there, opened together and
closed together when the build ends."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from kiln.base.errors import UsageError

if TYPE_CHECKING:
    from kiln.cache import BuildCache
    from kiln.cache.remote import RemoteCache
    from kiln.execution.cluster.offload import ClusterOffload
    from kiln.execution.cluster.spec import ExecutorSpec


@contextlib.contextmanager
def open_cluster(
    text: str,
    spec: ExecutorSpec,
    cache: BuildCache | None,
    connect_timeout_s: float,
    warn: Callable[[str], None],
) -> Iterator[ClusterOffload]:
    """The cluster ``spec`` (``--executor text``) names, with the CAS its workers
    share; the client closed (and a ``dask-local`` cluster shut down) at the end."""
    if cache is None:
        raise UsageError(
            f"--executor {text} moves inputs and outputs through a cache: drop --no-cache"
        )
    with _workers_cas(text, spec.kind, cache, warn) as cas:
        from kiln.execution.cluster.dask_client import DaskClient
        from kiln.execution.cluster.offload import ClusterOffload

        client = DaskClient(spec, cas.url, connect_timeout_s=connect_timeout_s)
        try:
            warn(f"kiln: {client.describe()}")
            yield ClusterOffload(client, cache, cas, warn)
        finally:
            client.close()
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
