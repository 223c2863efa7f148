"""What bounds how many actions run at once, and where: ``-j`` (capped by kiln and
by the size of the build), the named resource pools (``--pool NAME=N``), and which
thread actions are small enough to run in-line (``TinyActions``)."""

from __future__ import annotations

import sys
import threading

from kiln.base.cpus import usable_cpus
from kiln.graph import BuildAction

# The most actions that run at once, whatever -j says: more threads (or worker
# processes) than this only cost memory and scheduling.
MAX_JOBS = 1024


def cap_jobs(asked: int, actions: int) -> tuple[int, str | None]:
    """The number of actions that may run at once for ``-j asked`` in a build of
    ``actions``, and a message when the cap is worth telling (a -j above the
    default, the number of CPUs, is the user's own choice)."""
    jobs = min(asked, max(1, actions), MAX_JOBS)
    if jobs >= asked or asked <= usable_cpus():
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


class TinyActions:
    """Which thread actions run in-line, on the scheduler's thread, as they are too
    small to be worth a worker thread.

    Handing an action to a worker and its result back costs two thread switches
    and contention for the GIL, more than a pure-Python action of a few dozen
    microseconds takes; and such actions hold the GIL, so threads run them one at
    a time anyway. Actions are judged by type, in windows of ``SAMPLES`` runs, by
    the vote of most (``QUORUM``) of the window, so that a run the OS preempted
    does not decide. A run waited when its wall time was over twice its thread's
    CPU time, plus ``WAIT_SLACK_S`` (for I/O, a subprocess, a sleep) in-line, plus
    two switch intervals on a worker (where wall time also holds the waits for the
    GIL, up to a switch interval after each system call while another thread
    computes). On a worker a run is small when it did not wait and took under
    ``CPU_S`` of CPU time; in-line, when it did not wait and took under
    ``STAY_CPU_S``. The two bounds differ on purpose: on a worker the GIL's handing
    over counts as the run's CPU time (an action that creates one file took 0.5 ms
    of CPU in-line and 1.3 ms, median, on two workers, on this machine's ext4,
    where creating a file costs hundreds of microseconds in the kernel), and a type
    whose runs sit near one bound must not flip between the modes: each flip back
    to the workers cost thousands of runs at twice the CPU before a window voted
    it in-line again. A sleep of milliseconds passes, is seen in-line and sent
    back for good (below); one of tens of milliseconds does not. A type whose
    window on workers is small becomes tiny: an action that waits, or computes for
    long without the GIL (which shows as CPU time), stays on the workers, where
    ``-j`` of them run at once. A tiny type goes back to the workers (and is judged
    there again) when its in-line window is not small or one in-line run takes
    over ``LONG_S``; and for the rest of the build when most of its in-line runs
    waited.

    Invariant: ``_seen[t]`` holds the current window of type ``t`` (runs, small
    runs, runs that waited), of in-line runs when ``t`` is in ``_tiny``, else of
    runs on workers; no type in ``_waits`` is in ``_tiny``. Called from several
    threads: updated under a lock.
    """

    SAMPLES = 8
    QUORUM = 6
    CPU_S = 0.002
    STAY_CPU_S = 0.004
    LONG_S = 0.05
    WAIT_SLACK_S = 0.0002

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._seen: dict[type, list[int]] = {}
        self._tiny: set[type] = set()
        self._waits: set[type] = set()

    def is_tiny(self, action: BuildAction) -> bool:
        return type(action) in self._tiny

    def observe(self, action: BuildAction, cpu_s: float, wall_s: float, inline: bool) -> None:
        """Note one run of ``action``: on a worker, or in-line."""
        kind = type(action)
        with self._lock:
            if inline != (kind in self._tiny) or kind in self._waits:
                return  # judged under the other mode (it changed while this one ran)
            seen = self._seen.setdefault(kind, [0, 0, 0])
            if inline:
                waited = wall_s > 2 * cpu_s + self.WAIT_SLACK_S
                small = cpu_s < self.STAY_CPU_S and not waited
            else:
                waited = wall_s > 2 * cpu_s + 2 * sys.getswitchinterval()
                small = cpu_s < self.CPU_S and not waited
            seen[0] += 1
            seen[1] += small
            seen[2] += waited
            if inline and wall_s > self.LONG_S:
                self._end_window(kind, tiny=False)
            elif seen[0] >= self.SAMPLES:
                if inline and seen[2] >= self.QUORUM:
                    self._waits.add(kind)
                small = seen[1] >= self.QUORUM and kind not in self._waits
                self._end_window(kind, tiny=small)

    def _end_window(self, kind: type, tiny: bool) -> None:
        """End ``kind``'s window, tiny (in-line) or not from now on."""
        del self._seen[kind]
        if tiny:
            self._tiny.add(kind)
        else:
            self._tiny.discard(kind)
