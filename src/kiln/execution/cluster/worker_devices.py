"""A Dask worker's devices, published as worker resources when it joins.

Each device of the worker's machine (``kiln.devices.identity.local_devices``: its CPU, the
GPUs iree.runtime finds, the stand-ins of its ``KILN_DEVICES``) becomes one
resource ``kiln-device:<device id>``; the scheduler then places a check only on a
worker with that resource (``DaskClient``), and reschedules it, if that worker is
lost, only on another with the same device.

Two ways in, one function (``publish``): ``dask worker --preload
kiln.execution.cluster.worker_devices`` publishes them as the worker starts; and kiln
registers ``DevicePublisher`` as a worker plugin when it connects, so that every
worker of the cluster, and every one that joins later, publishes them too.
"""

from __future__ import annotations

import asyncio
from typing import Any

from distributed import Worker
from distributed.diagnostics.plugin import WorkerPlugin

from kiln.devices.identity import RESOURCE_PREFIX, local_devices, resources

PLUGIN_NAME = "kiln-devices"


async def publish(worker: Worker) -> None:
    """Set ``worker``'s device resources (identifying them off its event loop:
    iree.runtime's enumeration takes seconds)."""
    slots = max(1, int(worker.state.nthreads))
    loop = asyncio.get_running_loop()
    found = await loop.run_in_executor(None, lambda: resources(local_devices(), slots))
    known = {r for r in worker.state.total_resources if r.startswith(RESOURCE_PREFIX)}
    if known == set(found):
        return
    await worker.set_resources(**found)


class DevicePublisher(WorkerPlugin):
    """The worker plugin kiln registers: ``publish`` on every worker."""

    name = PLUGIN_NAME
    idempotent = True

    async def setup(self, worker: Worker) -> None:
        await publish(worker)


async def dask_setup(worker: Worker) -> None:
    """``--preload kiln.execution.cluster.worker_devices``: publish as the worker starts."""
    await publish(worker)


def described() -> list[dict[str, Any]]:
    """This worker's devices, each as ``Device.to_json`` (``kiln devices``)."""
    return [d.to_json() for d in local_devices()]
