"""What bounds how many actions run at once: ``-j`` (capped by kiln and by the
size of the build) and the named resource pools (``--pool NAME=N``)."""

from __future__ import annotations

import os

from kiln.graph import BuildAction

# The most actions that run at once, whatever -j says: more threads (or worker
# processes) than this only cost memory and scheduling.
MAX_JOBS = 1024


def cap_jobs(asked: int, actions: int) -> tuple[int, str | None]:
    """The number of actions that may run at once for ``-j asked`` in a build of
    ``actions``, and a message when the cap is worth telling (a -j above the
    default, the number of CPUs, is the user's own choice)."""
    jobs = min(asked, max(1, actions), MAX_JOBS)
    if jobs >= asked or asked <= (os.cpu_count() or 1):
        return jobs, None
    why = (
        "kiln's limit on actions running at once"
        if jobs == MAX_JOBS
        else "the number of actions in this build"
    )
    return jobs, f"kiln: -j {asked} capped to {jobs} ({why})"


class ResourcePools:
    """The places taken in each resource pool.

    Invariant: ``_use[p]`` counts the running actions holding pool ``p``, -1 while
    an exclusive one holds it alone; it never exceeds the pool's limit. An
    exclusive action waits until its pool is empty; new members do not wait for it
    (no drain): it runs at the first moment its pool is idle.
    """

    def __init__(self, limits: dict[str, int]) -> None:
        self._limits = limits
        self._use: dict[str, int] = {}

    def take(self, action: BuildAction) -> bool:
        """Take a place in ``action``'s pool if one is free (always, without a pool)."""
        if action.pool is None:
            return True
        pool = str(action.pool)
        use = self._use.get(pool, 0)
        limit = self._limits.get(pool)
        if use < 0 or (action.exclusive and use > 0) or (limit is not None and use >= limit):
            return False
        self._use[pool] = -1 if action.exclusive else use + 1
        return True

    def release(self, action: BuildAction) -> None:
        """Give back the place ``action`` took (nothing if it took none)."""
        pool = action.pool
        if pool in self._use:
            self._use[pool] = 0 if action.exclusive else self._use[pool] - 1
