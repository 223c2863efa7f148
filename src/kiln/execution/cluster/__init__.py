"""Remote execution: kiln's out-of-process actions on a Dask cluster.

kiln keeps the graph, the keys, the state and the decision what runs; a Dask
scheduler places the actions that kiln hands it. No filesystem is shared: a task
carries the action (a command, or a cloudpickled thunk built against sandbox
paths) and its inputs' digests and relative paths; the worker fetches the inputs
from the remote CAS into a private sandbox under its local directory, runs there,
puts the outputs into the CAS and returns their digests
(``kiln.execution.cluster.task``). kiln then materializes the outputs as for a cache hit
(``kiln.execution.cluster.dask_client``).

An action is remotable when it can say where its files are in a sandbox:
``CommandAction`` through ``sandbox_command``, the built-in process actions
through ``sandbox_thunk(path)``; any other action runs locally.
"""

from __future__ import annotations

from kiln.execution.cluster.spec import ExecutorSpec, parse_executor

__all__ = ["ExecutorSpec", "parse_executor"]
