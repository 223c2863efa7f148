"""The build's runners (``kiln.engine.runner``), best first: the cache serves an
action instead of running it; the cluster runs a remotable one on a Dask worker
(``kiln.execution.cluster``); a command runs without a thread
(``kiln.engine.command_lanes``); a process action runs in a worker process
(``kiln.execution.process.pool``); a tiny thread action runs in-line; any other
on a worker thread (``kiln.execution.threads``).

Each is an adapter in the engine around a backend of ``kiln.execution``: it
keeps the engine's side of a run (the ``started`` event, the run's times, its
run-time dependencies, hashing and caching its outputs, the completion).

What a run reached (``kiln.base.reached``) becomes its decision's ``run_deps``
(``kiln.planning.run_deps``): a worker process's, exactly what its action
imported and opened; in kiln's own process, where ``sys.modules`` is shared by
every thread, every module imported since the build started, counted for each
in-process action that finishes after it was imported.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kiln.base.bytecode import user_code
from kiln.base.reached import ModuleWatch, Reached
from kiln.engine.action_outputs import ActionOutputs
from kiln.engine.command_lanes import CommandLanes
from kiln.engine.incremental import Decision
from kiln.engine.limits import TinyActions
from kiln.engine.runner import AHEAD, ON_A_WORKER, Later, Placement, Runner
from kiln.engine.shared import Shared
from kiln.execution.process.pool import ProcessPool
from kiln.execution.threads import run_with_deadline
from kiln.graph import ActionConcurrency, BuildAction
from kiln.planning.run_deps import RunDeps
from kiln.state import Produced

if TYPE_CHECKING:  # imported only by a build with a remote executor
    from kiln.cache import ReadOutput
    from kiln.execution.cluster.offload import ClusterOffload
    from kiln.graph import BuildFile

IN_LINE = Placement(in_line=True)


class CacheRunner(Runner):
    """Serves an action from the build's cache (local, remote) instead of running it.

    ``serves`` judges, by type, whether an action's lookups are small enough to
    make on the scheduler's thread (a hit materializes its outputs): an action
    served from the cache never runs, so without a judge of its own a warm cache
    served every action on a worker thread, each handed over and back (10,000
    small outputs of the 10k graph: 12.5 s of CPU for 9.7 s of wall, slower than
    building them). An action whose lookups are tiny, or that runs in-line, is
    looked up in-line for what its entry holds (``offer``); it goes to a worker
    on a miss (unless it runs in-line) or when serving it copies blobs.

    Invariant: ``served`` holds the actions served, with the lane that restored
    them, until the scheduler takes their completions."""

    def __init__(self, shared: Shared, served: dict[BuildAction, str]) -> None:
        self.shared = shared
        self.serves = TinyActions()
        self.served = served

    def takes(self, action: BuildAction) -> bool:
        return self.shared.cache.cache is not None

    def placement(self, action: BuildAction) -> Placement:
        return AHEAD

    def offer(
        self, action: BuildAction, decision: Decision, place: Placement
    ) -> Decision | Later | None:
        """Look up here what the entry holds when the run stays on this machine, it
        runs in-line or its type's lookups are tiny, and lookups read this
        machine's cache only (a remote cache's server is never waited for on this
        thread, however fast it answered; an in-line action then looks up as it
        runs)."""
        cache = self.shared.cache.cache
        if (
            cache is None
            or cache.remote is not None
            or self.shared.stopping
            or not (place.in_line or self.serves.is_tiny(action))
            or place.off_machine
        ):
            return Later.WHERE_IT_RUNS
        run = self.shared.runs[action]
        run.start_time = run.invoke_time = time.time()
        served = self._look_up(action, decision, small=True)
        if served is None:
            return Later.ON_A_WORKER  # blobs to copy: a worker serves them
        return None if served else self.shared.cache.noted(decision)

    def start(self, action: BuildAction, decision: Decision) -> Decision | None:
        """Serve ``action`` (materialize its outputs, report it done), or pass it
        on with its decision saying why the cache did not serve it."""
        if self._look_up(action, decision, small=False):
            return None
        return self.shared.cache.noted(decision)

    def _look_up(self, action: BuildAction, decision: Decision, small: bool) -> bool | None:
        """Ask the cache (``small``: for what the entry holds only), judge the lookup's
        cost for ``serves``, and report a hit done: True served, False a miss, None
        left to a worker."""
        cpu, wall = time.thread_time(), time.perf_counter()
        cache = self.shared.cache
        if small:
            decided, produced = cache.restore_small(action, decision)
        else:
            decided, produced = True, cache.restore(action, decision)
        inline = self.shared.on_scheduler_thread()
        self.serves.observe(action, time.thread_time() - cpu, time.perf_counter() - wall, inline)
        if produced is not None:
            self._served(action, decision, produced)
            return True
        return False if decided else None

    def _served(self, action: BuildAction, decision: Decision, produced: Produced) -> None:
        name = threading.current_thread().name
        self.served[action] = "main" if name == "MainThread" else name
        self.shared.runs[action].finish_time = time.time()
        self.shared.done.put((action, decision, None, produced))


class RunsWork(Runner):
    """The engine's side of one run of an action's work, wherever ``work`` runs it:
    the ``started`` event, its times, its run-time dependencies, hashing and
    caching its outputs, and its one completion. ``tiny`` judges a THREAD action's
    runs (``TinyActions``), by themselves, not their cache lookups."""

    def __init__(self, shared: Shared, tiny: TinyActions, run_deps: RunDeps) -> None:
        self.shared = shared
        self.tiny = tiny
        self._run_deps = run_deps

    def work(self, action: BuildAction, reached: Reached) -> Produced | None:
        """Run ``action``'s work; what it wrote when known here (None: hash its
        outputs); what it reached goes to ``reached``."""
        raise NotImplementedError

    def start(self, action: BuildAction, decision: Decision) -> None:
        """Run ``action`` and hash what it wrote; its completion is posted."""
        shared = self.shared
        shared.events.started(action, decision)
        run = shared.runs[action]
        error: BaseException | None = None
        produced: Produced = {}
        inline = shared.on_scheduler_thread()
        cpu, wall = time.thread_time(), time.perf_counter()  # the run's own cost
        spent: tuple[float, float] | None = None  # ... up to its outputs' hashes
        try:
            read: dict[BuildFile, ReadOutput] = {}
            produced = self._run(action, decision, read)
            spent = (time.thread_time() - cpu, time.perf_counter() - wall)
            shared.cache.save(action, decision, produced, read)
        except BaseException as e:  # noqa: BLE001 - the failure belongs to the action
            if isinstance(e, KeyboardInterrupt) and inline:
                # Ctrl-C reached an in-line action, on the scheduler's thread: stop the build.
                shared.running.discard(action)
                raise
            error = e
            shared.failed_action()  # now, so that no queued action starts after it
        run.finish_time = time.time()
        if action.concurrency is ActionConcurrency.THREAD:
            spent = spent or (time.thread_time() - cpu, time.perf_counter() - wall)
            self.tiny.observe(action, *spent, inline)
        shared.done.put((action, decision, error, produced))

    def _run(
        self, action: BuildAction, decision: Decision, read: dict[BuildFile, ReadOutput]
    ) -> Produced:
        """Run ``action``; what it wrote (what hashing it read: ``read``). What it
        reached while it ran goes to ``decision.run_deps``, also when it failed (a
        remembered failure is checked against them too)."""
        started = time.time_ns()
        reached = Reached()
        try:
            produced = self.work(action, reached)
        finally:
            keyed = getattr(action, "keyed_sources", ())  # ``kiln.planning.run_deps``
            decision.run_deps = self._run_deps.entries(reached, started, keyed)
        if produced is not None:
            return produced
        return ActionOutputs.hash(action, self.shared.plan.outputs[action], read)


class ClusterRunner(RunsWork):
    """Runs a remotable action on a Dask worker (``ClusterOffload``); a worker thread
    waits for it (an in-line one, for an action that asks to run in-line)."""

    def __init__(
        self,
        shared: Shared,
        tiny: TinyActions,
        run_deps: RunDeps,
        offload: ClusterOffload,
        digests: dict[BuildFile, str | None],
    ) -> None:
        super().__init__(shared, tiny, run_deps)
        self.offload = offload
        self._digests = digests  # every file's digest known this build

    def takes(self, action: BuildAction) -> bool:
        return self.offload.takes(action)

    def placement(self, action: BuildAction) -> Placement:
        return Placement(in_line=action.concurrency is ActionConcurrency.NONE, off_machine=True)

    def work(self, action: BuildAction, reached: Reached) -> Produced:
        plan = self.shared.plan
        inputs = {f: self._digests[f] or "" for f in plan.inputs[action]}
        produced, worker, got = self.offload.run(action, inputs, plan.outputs[action])
        reached.modules, reached.files = got.modules, got.files
        self.shared.runs[action].worker = worker  # in the build's record, never on the node
        self.shared.events.set_lane(action, f"dask {worker}")
        return produced

    def cancel(self) -> None:
        self.offload.cancel_all()


class ProcessRunner(RunsWork):
    """Runs a PROCESS action in a worker process. Invariant: one pool, made on first
    use (from any thread), serves every PROCESS action of the build."""

    def __init__(
        self,
        shared: Shared,
        tiny: TinyActions,
        run_deps: RunDeps,
        environment: Callable[[], tuple[dict[str, str], str, str]],
        stays: Callable[[BuildAction], object],
    ) -> None:
        super().__init__(shared, tiny, run_deps)
        self._environment = environment  # environment, output and start directories
        self._stays = stays  # told of each action run here rather than remotely
        self._lock = threading.Lock()
        self._pool: ProcessPool | None = None

    def takes(self, action: BuildAction) -> bool:
        return action.concurrency is ActionConcurrency.PROCESS

    def placement(self, action: BuildAction) -> Placement:
        return ON_A_WORKER

    def work(self, action: BuildAction, reached: Reached) -> None:
        self._stays(action)
        self.pool().run_action(action, reached=reached)

    def pool(self) -> ProcessPool:
        with self._lock:
            if self._pool is None:
                self._pool = ProcessPool(*self._environment())
            return self._pool

    def cancel(self) -> None:
        """Kill the worker processes."""
        self.shutdown(interrupted=True)

    def shutdown(self, interrupted: bool) -> None:
        if self._pool is not None:
            self._pool.shutdown()


class ThreadRunner(RunsWork):
    """Runs an in-process action on a worker thread (its deadline, if it has one,
    on a thread of its own: ``run_with_deadline``)."""

    def __init__(
        self, shared: Shared, tiny: TinyActions, run_deps: RunDeps, imports: ModuleWatch
    ) -> None:
        super().__init__(shared, tiny, run_deps)
        self._imports = imports  # the modules imported since the build started

    def takes(self, action: BuildAction) -> bool:
        return True

    def placement(self, action: BuildAction) -> Placement:
        return ON_A_WORKER

    def work(self, action: BuildAction, reached: Reached) -> None:
        """Run the action here; the modules imported since the build started (and,
        when it fails, the files its traceback went through) go to ``reached``."""
        try:
            with user_code():  # what it imports writes no bytecode beside it
                if action.timeout is not None and not action.enforces_own_timeout:
                    run_with_deadline(action._invoke, action.desc, action.timeout)
                else:
                    action._invoke()
        except BaseException as e:
            reached.modules = self._imports.loaded()
            reached.note_failure(e)
            raise
        reached.modules = self._imports.loaded()


class InlineRunner(ThreadRunner):
    """Runs on the scheduler's thread an action that asks for it, or a thread action
    of a tiny type (``TinyActions``) that needs no deadline thread."""

    def takes(self, action: BuildAction) -> bool:
        concurrency = action.concurrency
        if concurrency is ActionConcurrency.NONE:
            return True
        return (
            concurrency is ActionConcurrency.THREAD
            and self.tiny.is_tiny(action)
            and action.timeout is None
        )

    def placement(self, action: BuildAction) -> Placement:
        return IN_LINE


def standard_runners(
    shared: Shared,
    served: dict[BuildAction, str],
    commands: CommandLanes,
    remote: ClusterOffload | None,
    digests: dict[BuildFile, str | None],
    environment: Callable[[], tuple[dict[str, str], str, str]],
    run_deps: RunDeps,
) -> list[Runner]:
    """The build's runners, best first: the cache, the cluster (``remote``, when the
    build has one), ``commands``, a worker process, in-line, a worker thread.
    ``served``: where the cache runner notes what it served. The in-process
    runners share one judge of tiny types and one watch of the imports."""
    tiny = TinyActions()
    imports = ModuleWatch(run_deps.is_project_module)
    runners: list[Runner] = [CacheRunner(shared, served)]
    stays: Callable[[BuildAction], object] = _runs_here
    if remote is not None:
        runners.append(ClusterRunner(shared, tiny, run_deps, remote, digests))
        stays = remote.stays
    return [
        *runners,
        commands,
        ProcessRunner(shared, tiny, run_deps, environment, stays),
        InlineRunner(shared, tiny, run_deps, imports),
        ThreadRunner(shared, tiny, run_deps, imports),
    ]


def _runs_here(action: BuildAction) -> None:
    """Without a cluster, every action runs on this machine, unremarked."""
