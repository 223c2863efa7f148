"""Where a started action runs: the first of the build's runners that takes it
(``kiln.engine.runner``, ``kiln.engine.runners``), in-line on the scheduler's
thread or handed to a worker thread, after the runners ahead of it (the cache)
were asked.

Whatever happens, each action started posts exactly one completion to the
scheduler's inbox (``Shared.done``).
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, NamedTuple

from kiln.engine.command_lanes import CommandLanes
from kiln.engine.incremental import Decision
from kiln.engine.runner import Later, Placement, Runner
from kiln.engine.runners import standard_runners
from kiln.engine.shared import CANCELLED, Shared
from kiln.execution.process.commands import CommandRunner
from kiln.execution.threads import ThreadWorkers
from kiln.graph import BuildAction
from kiln.planning.run_deps import RunDeps

if TYPE_CHECKING:  # imported only by a build with a remote executor
    from kiln.execution.cluster.offload import ClusterOffload
    from kiln.graph import BuildFile


class Route(NamedTuple):
    """The runners of one action: those ``ahead`` still to ask, then ``runner``,
    which runs it as ``place`` says."""

    ahead: tuple[Runner, ...]
    runner: Runner
    place: Placement


class Dispatcher:
    """Invariants: ``runners`` is the build's list, best first, its last taking every
    action; at most ``jobs`` worker threads exist, made as actions need them;
    ``_queue`` is a heap of the actions handed to the worker threads and not yet
    taken, best first, one ``_execute_next`` queued per entry, each with the
    runners still to ask; ``served`` holds the actions the cache served, with the
    lane that restored them, until the scheduler takes their completions."""

    def __init__(
        self,
        shared: Shared,
        jobs: int,
        remote: ClusterOffload | None,
        digests: dict[BuildFile, str | None],
        environment: Callable[[], tuple[dict[str, str], str, str]],
        commands: Callable[[], CommandRunner] | None,
        run_deps: RunDeps,
    ) -> None:
        self.shared = shared
        self.jobs = jobs
        self.served: dict[BuildAction, str] = {}
        self._threads: ThreadWorkers | None = None
        self._threads_lock = threading.Lock()  # the reaper thread asks for them too
        self._queue: list[tuple[float, int, BuildAction, Decision, Route]] = []
        self._queue_lock = threading.Lock()
        self.lanes = CommandLanes(shared, self.workers, commands)
        self.runners: list[Runner] = standard_runners(
            shared, self.served, self.lanes, remote, digests, environment, run_deps
        )

    def route(self, action: BuildAction) -> Route:
        """The runners ``action`` goes to: the first that takes it and runs it, and
        the runners ``AHEAD`` that take it before that one."""
        ahead: list[Runner] = []
        for runner in self.runners:
            if runner.takes(action):
                place = runner.placement(action)
                if not place.ahead:
                    return Route(tuple(ahead), runner, place)
                ahead.append(runner)
        raise LookupError(f"no runner takes '{action.desc}'")  # the last takes every one

    def start(
        self, action: BuildAction, decision: Decision, order: tuple[float, int], route: Route
    ) -> None:
        """Run ``action`` (its outputs prepared) by ``route``, the one the scheduler
        counted it by (``route``: judged once, since whether an action is tiny
        changes as its kind's runs finish): first offer it to the runners ahead (the
        cache), here; then run it now when it runs in-line, else on a worker thread.
        The worker that takes a turn runs the best action queued by then, so one
        that became ready later but lies on a longer path overtakes."""
        inline = route.place.in_line
        ahead = route.ahead
        try:
            while ahead:
                answer = ahead[0].offer(action, decision, route.place)
                if answer is None:
                    return
                if isinstance(answer, Later):
                    inline = inline and answer is Later.WHERE_IT_RUNS
                    break
                decision, ahead = answer, ahead[1:]
        except BaseException:  # Ctrl-C here: the build stops without waiting for it
            self.shared.running.discard(action)
            raise
        route = route._replace(ahead=ahead)
        if inline:
            self.execute(action, decision, route)
            return
        with self._queue_lock:
            heapq.heappush(self._queue, (*order, action, decision, route))
        self.workers().submit(self._execute_next)

    def _execute_next(self) -> None:
        with self._queue_lock:
            _, _, action, decision, route = heapq.heappop(self._queue)
        self.execute(action, decision, route)

    def execute(self, action: BuildAction, decision: Decision, route: Route) -> None:
        """Run one action where ``route`` says. Whatever goes wrong, its completion
        is posted: a worker thread never ends with the build waiting for an action
        it took (a reporter that raises, say)."""
        try:
            self._execute(action, decision, route)
        except BaseException as e:  # noqa: BLE001 - the failure belongs to the action
            if isinstance(e, KeyboardInterrupt) and self.shared.on_scheduler_thread():
                raise  # Ctrl-C on the scheduler's thread: stop the build
            self.shared.done.put((action, decision, e, {}))

    def _execute(self, action: BuildAction, decision: Decision, route: Route) -> None:
        shared = self.shared
        if shared.stopping:  # queued before the build stopped: never started
            shared.done.put((action, decision, CANCELLED, {}))
            return
        run = shared.runs[action]
        run.start_time = run.invoke_time = time.time()
        for runner in route.ahead:
            passed = runner.start(action, decision)
            if passed is None:
                return
            decision = passed
        route.runner.start(action, decision)

    def workers(self) -> ThreadWorkers:
        with self._threads_lock:
            if self._threads is None:
                self._threads = ThreadWorkers(self.jobs)
            return self._threads

    def stop(self) -> None:
        """Stop what runs out of this process (the build was interrupted): the
        cluster's tasks are cancelled, the worker processes killed."""
        for runner in self.runners:
            runner.cancel()

    def shutdown(self, interrupted: bool) -> None:
        for runner in self.runners:
            runner.shutdown(interrupted)
        if self._threads is not None:
            self._threads.shutdown(wait_s=0 if interrupted else 1.0)
