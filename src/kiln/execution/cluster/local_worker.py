"""Preloaded by each worker process of the LocalCluster that kiln starts for
``--executor dask-local:N`` (Dask's ``preload``).

Those processes are in kiln's process group, so a Ctrl-C at the terminal reaches
each of them too, and each would print its own KeyboardInterrupt traceback while
kiln shuts the cluster down. A worker of kiln's own cluster ignores the terminal's
Ctrl-C and Ctrl-\\; kiln, which gets them as well, stops the build and closes the
cluster (``DaskClient.close``).
"""

from __future__ import annotations

import signal
from typing import Any


def dask_setup(worker: Any) -> None:
    """Dask's preload hook, called in the worker process's main thread."""
    for signum in (signal.SIGINT, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_IGN)
