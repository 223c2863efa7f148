"""Where a started action runs: in-line on the scheduler's thread, on a worker
thread (a THREAD action; a PROCESS action handing its thunk to the process pool;
an action the cluster runs), or as a command without a thread
(``kiln.engine.command_lanes``); or whether the cache serves it instead.

Whatever happens, each action started posts exactly one completion to the
scheduler's inbox (``Shared.done``).
"""

from __future__ import annotations

import heapq
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kiln.base.reached import ModuleWatch, Reached
from kiln.engine.action_outputs import ActionOutputs
from kiln.engine.command_lanes import CommandLanes
from kiln.engine.incremental import Decision
from kiln.engine.limits import TinyActions
from kiln.engine.shared import CANCELLED, Shared
from kiln.execution.process.commands import CommandRunner
from kiln.execution.process.pool import ProcessPool
from kiln.execution.threads import ThreadWorkers, run_with_deadline
from kiln.graph import ActionConcurrency, BuildAction, SpawnsCommand
from kiln.planning.run_deps import RunDeps
from kiln.state import Produced

if TYPE_CHECKING:  # imported only by a build with a remote executor
    from kiln.cache import ReadOutput
    from kiln.execution.cluster.offload import ClusterOffload
    from kiln.graph import BuildFile


class Dispatcher:
    """Invariants: at most ``jobs`` worker threads exist, made as actions need them;
    one process pool, made on first use, serves every PROCESS action of the build;
    ``_queue`` is a heap of the actions handed to the worker threads and not yet
    taken, best first, one ``_execute_next`` queued per entry, each saying whether
    the cache was asked already; ``served`` holds the actions the cache served,
    with the lane that restored them, until the scheduler takes their completions.

    ``tiny`` judges, by type, whether an action's runs are small enough to run
    in-line; ``serves`` judges the same of its cache lookups (a hit materializes
    its outputs): an action served from the cache never runs, so without a judge
    of its own a warm cache served every action on a worker thread, each handed
    over and back (10,000 small outputs of the 10k graph: 12.5 s of CPU for 9.7 s
    of wall, slower than building them). An action whose lookups are tiny, or
    that runs in-line, is looked up in-line for what its entry holds; it goes to
    a worker on a miss (unless it runs in-line) or when serving it copies blobs.

    What a run reached (``kiln.base.reached``) becomes its decision's ``run_deps``
    (``kiln.planning.run_deps``): a worker process's, exactly what its action imported
    and opened; in kiln's own process, where ``sys.modules`` is shared by every
    thread, every module imported since the build started (``_imports``), counted
    for each in-process action that finishes after it was imported."""

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
        self._run_deps = run_deps
        self._imports = ModuleWatch(run_deps.is_project_module)
        self.jobs = jobs
        self.remote = remote
        self.tiny = TinyActions()
        self.serves = TinyActions()
        self.served: dict[BuildAction, str] = {}
        self._digests = digests  # every file's digest known this build
        self._environment = environment  # environment, output and start directories
        self._lock = threading.Lock()  # the pools: the reaper thread asks for them too
        self._threads: ThreadWorkers | None = None
        self._processes: ProcessPool | None = None
        self._queue: list[tuple[float, int, BuildAction, Decision, bool]] = []
        self._queue_lock = threading.Lock()
        self.lanes = CommandLanes(shared, self.workers, commands)

    # -- where an action runs ----------------------------------------------------

    def runs_inline(self, action: BuildAction) -> bool:
        """In-line: an action that asks for it, or a thread action of a tiny type
        (``TinyActions``) that needs no deadline thread and no cluster."""
        concurrency = action.concurrency
        if concurrency is ActionConcurrency.NONE:
            return True
        return (
            concurrency is ActionConcurrency.THREAD
            and self.tiny.is_tiny(action)
            and action.timeout is None
            and not self._remote_takes(action)
        )

    def spawns(self, action: BuildAction) -> bool:
        """Whether ``action`` is a command started here and reaped by the runner."""
        return isinstance(action, SpawnsCommand) and (
            self.remote is None or not self.remote.takes(action)
        )

    def start(self, action: BuildAction, decision: Decision, order: tuple[float, int]) -> None:
        """Run ``action`` (its outputs prepared): now when it runs in-line, else on a
        worker thread; first, when its lookups are tiny (or it runs in-line), ask the
        cache here for what it can serve without copying a blob. A command too is
        started by a worker (which returns as soon as it is spawned): 10,000 trivial
        commands at -j 2 took 1.7x the wall time when the scheduler's own thread
        started each of them."""
        inline = self.runs_inline(action)
        asked = False
        if self._looks_up_here(action, inline):
            run = self.shared.runs[action]
            run.start_time = run.invoke_time = time.time()
            try:
                served = self._serve_small(action, decision)
            except BaseException:  # Ctrl-C here: the build stops without waiting for it
                self.shared.running.discard(action)
                raise
            if served:
                return
            asked = served is False  # a miss: the run needs no second look
            inline = inline and asked  # blobs to copy: a worker serves them
        if inline:
            self.execute(action, decision, asked)
            return
        # The worker that takes this turn runs the best action queued by then, so one
        # that became ready later but lies on a longer path overtakes the queue.
        with self._queue_lock:
            heapq.heappush(self._queue, (*order, action, decision, asked))
        self.workers().submit(self._execute_next)

    def _looks_up_here(self, action: BuildAction, inline: bool) -> bool:
        """Whether the cache is asked for ``action`` on the scheduler's thread: it runs
        in-line or its type's lookups are tiny, and lookups read this machine's cache
        only (a remote cache's server is never waited for on this thread, however
        fast it answered; an in-line action then looks up as it runs, as before)."""
        cache = self.shared.cache.cache
        return (
            cache is not None
            and cache.remote is None
            and not self.shared.stopping
            and (inline or self.serves.is_tiny(action))
            and not self._remote_takes(action)
        )

    def _remote_takes(self, action: BuildAction) -> bool:
        return self.remote is not None and self.remote.takes(action)

    def _execute_next(self) -> None:
        with self._queue_lock:
            _, _, action, decision, asked = heapq.heappop(self._queue)
        self.execute(action, decision, asked)

    def execute(self, action: BuildAction, decision: Decision, asked: bool = False) -> None:
        """Run one action and hash what it wrote (``asked``: the cache missed it
        already). Whatever goes wrong, its completion is posted: a worker thread
        never ends with the build waiting for an action it took (a reporter that
        raises, say)."""
        try:
            self._execute(action, decision, asked)
        except BaseException as e:  # noqa: BLE001 - the failure belongs to the action
            if isinstance(e, KeyboardInterrupt) and self.shared.on_scheduler_thread():
                raise  # Ctrl-C on the scheduler's thread: stop the build
            self.shared.done.put((action, decision, e, {}))

    def _execute(self, action: BuildAction, decision: Decision, asked: bool) -> None:
        shared = self.shared
        if shared.stopping:  # queued before the build stopped: never started
            shared.done.put((action, decision, CANCELLED, {}))
            return
        run = shared.runs[action]
        run.start_time = run.invoke_time = time.time()
        if not asked and self._serve_from_cache(action, decision):
            return
        decision = shared.cache.noted(decision)  # why the cache did not serve it
        if self.spawns(action):
            lane = self.lanes.lane(action)
            run.start_time = run.invoke_time = time.time()  # within its lane
            shared.events.started(action, decision, lane)
            self.lanes.spawn(action, decision)
            return
        shared.events.started(action, decision)
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
        if action.concurrency is ActionConcurrency.THREAD:  # judged by itself, not the cache
            spent = spent or (time.thread_time() - cpu, time.perf_counter() - wall)
            self.tiny.observe(action, *spent, inline)
        shared.done.put((action, decision, error, produced))

    def _run(
        self, action: BuildAction, decision: Decision, read: dict[BuildFile, ReadOutput]
    ) -> Produced:
        """Run ``action`` where it runs; what it wrote (what hashing it read: ``read``).
        What it reached while it ran goes to ``decision.run_deps``, also when it
        failed (a remembered failure is checked against them too)."""
        started = time.time_ns()
        reached = Reached()
        try:
            if self.remote is not None and self.remote.takes(action):
                produced, reached = self._run_remote(action)
                return produced
            if action.concurrency is ActionConcurrency.PROCESS:
                self.process_pool().run_action(action, reached=reached)
            else:
                self._invoke(action, reached)
        finally:
            keyed = getattr(action, "keyed_sources", ())  # ``kiln.planning.run_deps``
            decision.run_deps = self._run_deps.entries(reached, started, keyed)
        return ActionOutputs.hash(action, self.shared.plan.outputs[action], read)

    def _invoke(self, action: BuildAction, reached: Reached) -> None:
        """Run an in-process action; the modules imported since the build started
        (and, when it fails, the files its traceback went through) go to ``reached``."""
        try:
            if action.timeout is not None and not action.enforces_own_timeout:
                run_with_deadline(action._invoke, action.desc, action.timeout)
            else:
                action._invoke()
        except BaseException as e:
            reached.modules = self._imports.loaded()
            reached.note_failure(e)
            raise
        reached.modules = self._imports.loaded()

    def _run_remote(self, action: BuildAction) -> tuple[Produced, Reached]:
        assert self.remote is not None
        plan = self.shared.plan
        inputs = {f: self._digests[f] or "" for f in plan.inputs[action]}
        produced, worker, reached = self.remote.run(action, inputs, plan.outputs[action])
        self.shared.runs[action].worker = worker  # in the build's record, never on the node
        self.shared.events.set_lane(action, f"dask {worker}")
        return produced, reached

    def _serve_from_cache(self, action: BuildAction, decision: Decision) -> bool:
        """On a cache hit, materialize the outputs and report the action done."""
        if self.shared.cache.cache is None:
            return False
        return self._look_up(action, decision, small=False) is True

    def _serve_small(self, action: BuildAction, decision: Decision) -> bool | None:
        """On the scheduler's thread: True when the cache served ``action`` from its
        entry, False on a miss, None when serving it copies blobs (left to a worker,
        so that no large copy holds up this thread)."""
        return self._look_up(action, decision, small=True)

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

    # -- the pools ----------------------------------------------------------------

    def workers(self) -> ThreadWorkers:
        with self._lock:
            if self._threads is None:
                self._threads = ThreadWorkers(self.jobs)
            return self._threads

    def process_pool(self) -> ProcessPool:
        with self._lock:
            if self._processes is None:
                self._processes = ProcessPool(*self._environment())
            return self._processes

    def stop(self) -> None:
        """Stop what runs out of this process (the build was interrupted): the
        cluster's tasks are cancelled, the worker processes killed."""
        if self.remote is not None:
            self.remote.cancel_all()
        if self._processes is not None:
            self._processes.shutdown()

    def shutdown(self, interrupted: bool) -> None:
        if self._processes is not None:
            self._processes.shutdown()
        if self._threads is not None:
            self._threads.shutdown(wait_s=0 if interrupted else 1.0)
