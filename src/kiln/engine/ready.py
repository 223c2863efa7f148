"""What may start: the ready queue of one build (Ninja's ``Plan``), the failure
cascade, and which waiting action starts first.

Nodes become ready when every one of their dependencies finished successfully;
ready actions that must run wait in a heap ordered by their remaining critical
path (``kiln.engine.priority``), then by arrival, until the scheduler finds them a
place.
"""

from __future__ import annotations

import heapq
import itertools
from collections import deque
from collections.abc import Callable

from kiln.engine.incremental import Decision
from kiln.graph import BuildAction, BuildDependency
from kiln.planning.plan import Plan

# A waiting action: (minus its remaining path, arrival number, action, decision).
Waiting = tuple[float, int, BuildAction, Decision]


class ReadyQueue:
    """Invariants: ``pending[n]`` counts the deps of ``n`` not yet finished; a node
    is in ``finished`` once it succeeded, failed or was cascaded; ``ready`` holds
    the nodes all of whose deps succeeded that nobody took yet; ``waiting`` is a
    heap, its first entry the action to start next; ``arrived`` lists the entries
    queued since the last ``take_arrived``, in arrival order."""

    def __init__(
        self, plan: Plan, paths: Callable[[], dict[BuildDependency, float]] | None = None
    ) -> None:
        self.plan = plan
        self.pending = {n: len(n.deps) for n in plan.order}
        self.ready: deque[BuildDependency] = deque(n for n in plan.order if not n.deps)
        self.finished: set[BuildDependency] = set()
        self.waiting: list[Waiting] = []
        self.arrived: list[Waiting] = []
        self._arrivals = itertools.count()
        self._paths_of = paths  # None: first come, first served
        self._paths: dict[BuildDependency, float] | None = None

    def succeed(self, node: BuildDependency) -> None:
        """``node`` is done: its consumers whose deps are now all done are ready."""
        self.finished.add(node)
        pending, ready, finished = self.pending, self.ready, self.finished
        for consumer in self.plan.consumers[node]:
            if consumer in finished:
                continue
            pending[consumer] -= 1
            if pending[consumer] == 0:
                ready.append(consumer)

    def cascade(self, failed: BuildAction) -> list[tuple[BuildDependency, BuildDependency]]:
        """``failed`` failed: it and everything that needs it are finished. Each
        node that will not run now, with the node whose failure stops it, in the
        order the failure spreads."""
        self.finished.add(failed)
        stopped: list[tuple[BuildDependency, BuildDependency]] = []
        spread: deque[BuildDependency] = deque([failed])
        while spread:
            cause = spread.popleft()
            for consumer in self.plan.consumers[cause]:
                if consumer in self.finished:
                    continue
                self.finished.add(consumer)
                stopped.append((consumer, cause))
                spread.append(consumer)
        return stopped

    def wait(self, action: BuildAction, decision: Decision) -> None:
        """Queue a ready action that must run, first by remaining critical path, then
        by arrival."""
        priority = 0.0
        if self._paths_of is not None:
            if self._paths is None:  # first needed now: a no-op build never computes it
                self._paths = self._paths_of()
            priority = -self._paths[action]
        entry = (priority, next(self._arrivals), action, decision)
        heapq.heappush(self.waiting, entry)
        self.arrived.append(entry)

    def take_arrived(self) -> list[Waiting]:
        """The entries queued since the last call (some may have started since)."""
        arrived, self.arrived = self.arrived, []
        return arrived

    def next_waiting(self) -> Waiting:
        return heapq.heappop(self.waiting)

    def put_back(self, entry: Waiting) -> None:
        heapq.heappush(self.waiting, entry)
