"""Running a plan: the ready queue, ``-j``, resource pools, failure cascade and
interruption.

One scheduler thread owns all bookkeeping. Actions run on ``ThreadWorkers``
(PROCESS actions hand their thunk on to the ``ProcessPool``) or in-line, and
report back through a queue. An action is launched only when every one of its
dependencies finished successfully, and its up-to-date check happens then, when
its inputs' digests are known. Ready actions that cannot start yet wait in a heap
ordered by their remaining critical path (``kiln.priority``). What happens is
emitted as events (``kiln.build_events``) and recorded in the ``BuildResult``
(``kiln.result``); the outputs' side is ``kiln.action_outputs``, the shared
cache's ``kiln.cache_step``, the limits ``kiln.limits``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import heapq
import itertools
import math
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING

from kiln import events as ev
from kiln.action_outputs import ActionOutputs, Produced
from kiln.action_record import ActionRecord
from kiln.actionkey import KeyMaker
from kiln.build_events import BuildEmitter
from kiln.cache import BuildCache
from kiln.cache_step import CacheStep
from kiln.completions import Completions
from kiln.errors import (
    ActionFailed,
    ConfinementError,
    DependenceException,
    KilnError,
    StateError,
)
from kiln.graph import (
    ActionConcurrency,
    BuildAction,
    BuildDependency,
    BuildFile,
    Finish,
    SpawnsCommand,
)
from kiln.incremental import REBUILT_DIGEST, Decision, UpToDateChecker
from kiln.limits import MAX_JOBS, ResourcePools, TinyActions, cap_jobs
from kiln.output_tree import OutputTree
from kiln.outputs import sync_filesystem
from kiln.plan import Plan, node_name
from kiln.priority import remaining_paths
from kiln.process.commands import CommandRunner
from kiln.process.pool import ProcessPool
from kiln.progress import ProgressReporter
from kiln.result import BuildResult, NodeRun, SchedulerOptions
from kiln.state import StateStore, StatKey
from kiln.threads import ThreadWorkers, run_with_deadline

__all__ = ["MAX_JOBS", "BuildResult", "Scheduler", "SchedulerOptions"]

if TYPE_CHECKING:  # imported only by a build with a remote executor
    from kiln.remote_exec.runner import RemoteRunner

_INTERRUPT_WAIT_S = 5.0
# The "error" of a queued action that the build stopped before it started.
_CANCELLED = ActionFailed("not started: the build stopped")
# Not an error: what the reaper says first when a command ended, before it commits
# and hashes the outputs, so that the next command takes its place at once.
_ENDED = ActionFailed("its command ended")
# The most in-line actions run in a row before the scheduler takes completions.
_INLINE_BATCH = 64
# A command whose output is at most this large is finished on the reaper thread.
_FINISH_INLINE_BYTES = 1 << 20
# The longest a finished action's record waits for the next round's claims to share
# their transaction (a group commit); a kill loses at most this much finished work.
_GROUP_COMMIT_S = 0.05


_Done = tuple[BuildAction, Decision, BaseException | None, Produced]
# A waiting action: (minus its remaining path, arrival number, action, decision).
_Waiting = tuple[float, int, BuildAction, Decision]


def _reraise(error: BaseException) -> None:
    raise error


class Scheduler:
    """Runs one plan once.

    Invariants: ``_pending[n]`` counts the deps of ``n`` not yet finished; a node
    is in ``_finished`` once it succeeded, failed or was cascaded; ``_running``
    holds exactly the launched actions whose completion was not processed;
    ``_waiting`` and ``_dispatch`` are heaps, their first entries the action to
    start next.
    """

    def __init__(
        self,
        plan: Plan,
        store: StateStore,
        reporter: ProgressReporter,
        options: SchedulerOptions,
        keys: KeyMaker,
        on_interrupt: Callable[[], None] = lambda: None,
        outputs: OutputTree | None = None,
        readers: list[ev.EventReader] | None = None,
        cache: BuildCache | None = None,
        remote: RemoteRunner | None = None,
        environment: Callable[[], tuple[dict[str, str], str]] | None = None,
        commands: Callable[[], CommandRunner] | None = None,
    ):
        self.plan = plan
        self.store = store
        self.reporter = reporter
        self.result = BuildResult(runs={n: NodeRun() for n in plan.order})
        self.events = BuildEmitter(
            ev.EventStream([reporter, *(readers or [])]),
            plan,
            self.result.runs,
            explain=options.explain,
        )
        self.opts = options
        self.checker = UpToDateChecker(plan, store, keys)
        self._runs = self.result.runs
        self._on_interrupt = on_interrupt
        self._pending = {n: len(n.deps) for n in plan.order}
        self._ready: deque[BuildDependency] = deque(n for n in plan.order if not n.deps)
        self._waiting: list[_Waiting] = []
        self._arrivals = itertools.count()
        self._paths: dict[BuildDependency, float] | None = None
        # Actions handed to the worker threads and not yet taken, best first: one
        # ``_execute_next`` call is queued per entry.
        self._dispatch: list[_Waiting] = []
        self._dispatch_lock = threading.Lock()
        self._running: set[BuildAction] = set()
        # Running commands that ended, whose outputs are being committed: their
        # places are free for the next commands (a subset of ``_running``).
        self._ending: set[BuildAction] = set()
        self._finished: set[BuildDependency] = set()
        self._pools = ResourcePools(options.pools)
        self._tiny = TinyActions()
        self._ident = threading.get_ident()  # the scheduler's thread (set again by ``run``)
        self._done: Completions[_Done] = Completions()
        # Commands reaped on this thread, to commit and hash once the next started.
        self._reaped: list[Callable[[], None]] = []
        self._stopping = False
        self._threads: ThreadWorkers | None = None
        self._processes: ProcessPool | None = None
        self._outputs = ActionOutputs(store, outputs)
        self._tree = outputs
        self._jobs, self._cap_note = cap_jobs(options.jobs, len(plan.actions))
        # What every PROCESS action starts with, whatever ran before it: the build's
        # controlled environment and directory (``kiln.action_env``), made on first use.
        self._environment = environment or (lambda: (dict(os.environ), os.getcwd()))
        # The build's command runner, which this thread drives while it waits.
        self._commands = commands
        self._pool_lock = threading.Lock()
        # The shared cache as this build uses it; ``--check-reproducible`` defers its
        # saves until the second runs agreed (the executor flushes them).
        self.cache_step = CacheStep(
            cache, plan, avoid=store.nonreproducible(), defer=options.check_reproducible
        )
        self._cache = self.cache_step
        # Runs remotable actions on a cluster (``--executor dask...``); None: here.
        self.remote = remote
        # Actions whose outputs came from the cache, with the lane that restored them.
        self._served: dict[BuildAction, str] = {}
        # The running commands' slots: their lanes in the trace.
        self._slots: dict[BuildAction, int] = {}
        # Records of the actions that finished since the last commit: they go to the
        # state with the next round's claims, in one transaction, before anything
        # else starts (``_launch``), or alone when the round starts nothing.
        self._unrecorded: list[tuple[str, ActionRecord]] = []
        self._record_by = math.inf  # when ``_unrecorded`` must be written at the latest

    def run(self) -> BuildResult:
        start = time.monotonic()
        self._ident = threading.get_ident()
        self.events.build_started(self.opts.jobs)
        if self._cap_note is not None:
            self.events.note(self._cap_note)
        try:
            self._loop()
        except KeyboardInterrupt:
            self.result.interrupted = True
            self._interrupt()
            raise
        finally:
            self._shutdown()
            self.result.not_run = [
                a
                for a in self.plan.actions
                if a not in self._finished or isinstance(self._runs[a].failure, DependenceException)
            ]
            self.result.wall_s = time.monotonic() - start
            self.result.digests = {
                f: d
                for f, d in self.checker.digests.items()
                if d is not None and not d.startswith(REBUILT_DIGEST)
            }
            self._record_finished()
            self.store.flush()
            if self._tree is not None and (self.result.built or self.result.cached):
                failed = sync_filesystem(self._tree.root)  # on disk before it says done
                if failed is not None:
                    self.events.note(
                        f"warning: the outputs may not all be on disk ({self._tree.root}): {failed}"
                    )
            self.events.build_finished(self.result)
        return self.result

    def _loop(self) -> None:
        while True:
            self._drain_ready()
            self._launch()
            self._finish_reaped()
            if not self._running:
                return
            now = time.monotonic()
            if now >= self._record_by:
                self._record_finished()
            # Every completion waiting: one wake-up (by the time records are due).
            timeout = min(0.5, self._record_by - now)
            self._complete_all(self._note_ended(self._done.take(timeout)))

    def _finish_reaped(self) -> None:
        reaped, self._reaped = self._reaped, []
        for finish in reaped:
            finish()

    def _note_ended(self, batch: list[_Done]) -> list[_Done]:
        """Free the places of the commands that ended; the completions in ``batch``."""
        done = []
        for item in batch:
            if item[2] is _ENDED:
                self._ending.add(item[0])
            else:
                done.append(item)
        return done

    def _drain_ready(self) -> None:
        # Once per node of a no-op build: the bound methods are looked up once.
        ready, succeed, decide = self._ready, self._succeed, self.checker.decide
        skipped, up_to_date = self.result.skipped, self.events.up_to_date
        keys = self.result.keys
        while ready and not self._stopping:
            node = ready.popleft()
            if not isinstance(node, BuildAction):
                succeed(node)
                continue
            decision = decide(node)
            keys[node] = decision.key
            if decision.reason is None:  # up to date
                skipped.append(node)
                up_to_date(node, decision)
                succeed(node)
            elif self.opts.dry_run:
                self._pretend(node, decision)
            else:
                self._wait(node, decision)

    def _wait(self, action: BuildAction, decision: Decision) -> None:
        """Queue a ready action, first by remaining critical path, then by arrival."""
        priority = 0.0
        if self.opts.critical_path:
            if self._paths is None:  # first needed now: a no-op build never computes it
                self._paths = remaining_paths(
                    self.plan, self.events.all_ids(), self.store.durations()
                )
            priority = -self._paths[action]
        heapq.heappush(self._waiting, (priority, next(self._arrivals), action, decision))

    def _launch(self) -> None:
        if self._stopping:
            self._waiting.clear()
            return
        deferred: list[_Waiting] = []
        chosen: list[_Waiting] = []  # for the worker threads, then in-line ones
        inline: list[_Waiting] = []
        busy = len(self._running) - len(self._ending)
        # Up to ``jobs`` more than run are queued for the worker threads, so a thread
        # that finishes starts its next action without waiting for this thread. Only
        # ``jobs`` threads exist, so no more than ``jobs`` actions run; in-line actions
        # run one after the other, each only when it fits within ``jobs`` with
        # everything queued, at most ``_INLINE_BATCH`` before completions are taken.
        while self._waiting and busy + len(chosen) < 2 * self._jobs:
            if len(inline) >= _INLINE_BATCH:
                break
            entry = heapq.heappop(self._waiting)
            action = entry[2]
            here = self._runs_inline(action)
            # With in-line actions to run, one of the ``jobs`` places is theirs. A
            # command holds its place until it is reaped: no queuing ahead for it.
            room = self._jobs if here or not inline else self._jobs - 1
            if (here or inline or self._spawns(action)) and busy + len(chosen) >= room:
                heapq.heappush(self._waiting, entry)  # the best waits for a free place
                break
            if not self._pools.take(action):
                deferred.append(entry)
                continue
            (inline if here else chosen).append(entry)
        for entry in deferred:
            heapq.heappush(self._waiting, entry)
        chosen += inline
        if not chosen:
            return
        # One transaction records what finished since the last one, drops the old
        # records of the chosen and claims their outputs.
        runs = ((e[3].action_id, self.plan.outputs[e[2]]) for e in chosen)
        self._outputs.claim(runs, self._take_unrecorded())
        for entry in chosen:
            self._start(entry[2], entry[3], entry[:2])

    def _runs_inline(self, action: BuildAction) -> bool:
        """In-line: an action that asks for it, or a thread action of a tiny type
        (``TinyActions``) that needs no deadline thread and no cluster."""
        concurrency = action.concurrency
        if concurrency is ActionConcurrency.NONE:
            return True
        return (
            concurrency is ActionConcurrency.THREAD
            and self._tiny.is_tiny(action)
            and action.timeout is None
            and (self.remote is None or not self.remote.takes(action))
        )

    def _start(
        self, action: BuildAction, decision: Decision, order: tuple[float, int] = (0.0, 0)
    ) -> None:
        """Start ``action``, whose old record ``_launch`` dropped and whose outputs it
        claimed."""
        self._running.add(action)
        try:
            self._prepare_outputs(action)
        except StateError:
            raise  # the state cannot be written: the build stops
        except (KilnError, OSError) as e:
            error = (
                e
                if isinstance(e, KilnError)
                else ConfinementError(f"'{action.desc}': cannot prepare its output: {e}")
            )
            run = self._runs[action]
            run.start_time = run.finish_time = time.time()
            self.events.started(action, decision)
            self._done.put((action, decision, error, {}))
            return
        if self._runs_inline(action) or (
            self._spawns(action) and not self._cache.applies(action, decision)
        ):  # a command starts here, at once (a cache lookup is left to a worker)
            self._execute(action, decision)
            return
        # The worker that takes this turn runs the best action queued by then, so one
        # that became ready later but lies on a longer path overtakes the queue.
        with self._dispatch_lock:
            heapq.heappush(self._dispatch, (*order, action, decision))
        self._workers().submit(self._execute_next)

    def _execute_next(self) -> None:
        with self._dispatch_lock:
            _, _, action, decision = heapq.heappop(self._dispatch)
        self._execute(action, decision)

    def _prepare_outputs(self, action: BuildAction) -> None:
        self._outputs.prepare(self.plan.outputs[action])
        ActionOutputs.link_sources(self.plan.inputs[action])

    def _execute(self, action: BuildAction, decision: Decision) -> None:
        """Run one action (on a worker thread) and hash what it wrote. Whatever goes
        wrong, its completion is posted: a worker thread never ends with the build
        waiting for an action it took (a reporter that raises, say)."""
        try:
            self._execute_one(action, decision)
        except BaseException as e:  # noqa: BLE001 - the failure belongs to the action
            if isinstance(e, KeyboardInterrupt) and threading.get_ident() == self._ident:
                raise  # Ctrl-C on the scheduler's thread: stop the build
            self._done.put((action, decision, e, {}))

    def _execute_one(self, action: BuildAction, decision: Decision) -> None:
        if self._stopping:  # queued before the build stopped: never started
            self._done.put((action, decision, _CANCELLED, {}))
            return
        run = self._runs[action]
        run.start_time = run.invoke_time = time.time()
        if self._serve_from_cache(action, decision):
            return
        if self._spawns(action):  # a lane per running command, for the trace
            lane = f"kiln-{self._slot(action)}"
            run.start_time = run.invoke_time = time.time()  # within its lane
            self.events.started(action, decision, lane)
            self._spawn(action, decision)
            return
        self.events.started(action, decision)
        error: BaseException | None = None
        produced: dict[BuildFile, tuple[StatKey, str]] = {}
        inline = threading.get_ident() == self._ident
        cpu, wall = time.thread_time(), time.perf_counter()  # the run's own cost
        spent: tuple[float, float] | None = None  # ... up to its outputs' hashes
        try:
            if self.remote is not None and self.remote.takes(action):
                produced = self._run_remote(action)
            elif action.concurrency is ActionConcurrency.PROCESS:
                thunk = action._remotable_thunk()
                self._process_pool().run(thunk, action.desc, action.timeout)
            elif action.timeout is not None and not action.enforces_own_timeout:
                run_with_deadline(action._invoke, action.desc, action.timeout)
            else:
                action._invoke()
            produced = produced or ActionOutputs.hash(action, self.plan.outputs[action])
            spent = (time.thread_time() - cpu, time.perf_counter() - wall)
            self._cache.save(action, decision, produced)
        except BaseException as e:  # noqa: BLE001 - the failure belongs to the action
            if isinstance(e, KeyboardInterrupt) and inline:
                # Ctrl-C reached an in-line action, on the scheduler's thread: stop the build.
                self._running.discard(action)
                raise
            error = e
            if self.opts.fail_fast:  # now, so that no queued action starts after it
                self._stopping = True
        run.finish_time = time.time()
        if action.concurrency is ActionConcurrency.THREAD:  # judged by itself, not the cache
            spent = spent or (time.thread_time() - cpu, time.perf_counter() - wall)
            self._tiny.observe(action, *spent, inline)
        self._done.put((action, decision, error, produced))

    # -- commands: started without a thread, finished by the reaper (kiln.process.commands) ----

    def _spawns(self, action: BuildAction) -> bool:
        """Whether ``action`` is a command started here and reaped by the runner."""
        return isinstance(action, SpawnsCommand) and (
            self.remote is None or not self.remote.takes(action)
        )

    def _spawn(self, action: BuildAction, decision: Decision) -> None:
        """Start a command action; the runner's reaper thread calls ``finished``."""
        assert isinstance(action, SpawnsCommand)

        def finished(finish: Finish, size: int) -> None:
            self._end_slot(action)
            self._done.put((action, decision, _ENDED, {}))  # the next command may start
            rest = functools.partial(self._finish, action, decision, finish)
            if size > _FINISH_INLINE_BYTES:  # a large output: hashed off the reaper
                self._workers().submit(rest)
            elif threading.get_ident() == self._ident:  # reaped here: after the next starts
                self._reaped.append(rest)
            else:
                rest()

        if threading.get_ident() == self._ident and self._commands is not None:
            self._done.drive(self._commands())

        try:
            action._spawn(finished)
        except KeyboardInterrupt:  # Ctrl-C on the scheduler's thread: stop the build
            self._running.discard(action)
            raise
        except BaseException as e:  # noqa: BLE001 - the failure belongs to the action
            self._end_slot(action)
            self._finish(action, decision, functools.partial(_reraise, e))

    def _end_slot(self, action: BuildAction) -> None:
        """The command of ``action`` ended (or never started): its slice of its lane
        ends, and its slot is free."""
        self._runs[action].finish_time = time.time()
        with self._pool_lock:
            self._slots.pop(action, None)

    def _slot(self, action: BuildAction) -> int:
        """The lowest command slot free (fewer than ``jobs`` commands run at once)."""
        with self._pool_lock:
            taken = set(self._slots.values())
            slot = next(i for i in itertools.count() if i not in taken)
            self._slots[action] = slot
            return slot

    def _finish(self, action: BuildAction, decision: Decision, finish: Finish) -> None:
        """After a command ended: the action's own checks, then hash its outputs."""
        error: BaseException | None = None
        produced: Produced = {}
        try:
            finish()
            produced = ActionOutputs.hash(action, self.plan.outputs[action])
            self._cache.save(action, decision, produced)
        except BaseException as e:  # noqa: BLE001 - the failure belongs to the action
            error = e
            if self.opts.fail_fast:
                self._stopping = True
        self._done.put((action, decision, error, produced))

    def _workers(self) -> ThreadWorkers:
        with self._pool_lock:  # the reaper thread asks for them too
            if self._threads is None:
                self._threads = ThreadWorkers(self._jobs)
            return self._threads

    # -----------------------------------------------------------------------------

    def _run_remote(self, action: BuildAction) -> Produced:
        assert self.remote is not None
        inputs = {f: self.checker.digests[f] or "" for f in self.plan.inputs[action]}
        produced, worker = self.remote.run(action, inputs, self.plan.outputs[action])
        self._runs[action].worker = worker  # in the build's record, never on the node
        self.events.set_lane(action, f"dask {worker}")
        return produced

    def _serve_from_cache(self, action: BuildAction, decision: Decision) -> bool:
        """On a cache hit, materialize the outputs and report the action done."""
        produced = self._cache.restore(action, decision)
        if produced is None:
            return False
        name = threading.current_thread().name
        self._served[action] = "main" if name == "MainThread" else name
        self._runs[action].finish_time = time.time()
        self._done.put((action, decision, None, produced))
        return True

    def _process_pool(self) -> ProcessPool:
        with self._pool_lock:  # worker threads ask for it concurrently
            if self._processes is None:
                self._processes = ProcessPool(*self._environment())
            return self._processes

    def _complete(
        self,
        action: BuildAction,
        decision: Decision,
        error: BaseException | None,
        produced: dict[BuildFile, tuple[StatKey, str]],
    ) -> None:
        self._complete_all([(action, decision, error, produced)])

    def _complete_all(self, batch: list[_Done]) -> None:
        """Process the completions of one wake-up: report them and release their
        dependents. Their records go to the state in one transaction before anything
        else starts (with the claims of the next round, ``_launch``), or within
        ``_GROUP_COMMIT_S`` when nothing starts (``_record_finished``): a dependent
        never runs on an output whose record a kill could lose."""
        succeeded: list[_Done] = []
        records: list[tuple[str, ActionRecord]] = []
        for item in batch:
            record = self._settle(*item)
            if record is not None:
                succeeded.append(item)
                records.append((item[1].action_id, record))
        if not records:
            return
        if not self._unrecorded:
            self._record_by = time.monotonic() + _GROUP_COMMIT_S
        self._unrecorded += records
        for action, decision, _, produced in succeeded:
            run = self._runs[action]
            lane = self._served.pop(action, None)
            if lane is not None:
                self.result.cached.append(action)
                self.events.cached(action, decision, produced, run.start_time or time.time(), lane)
            else:
                self.result.built.append(action)
                self.events.finished(action, decision, produced)
            self._succeed(action)

    def _record_finished(self) -> None:
        """Write the records ``_complete_all`` left, in one transaction."""
        if self._unrecorded:
            self.store.record_many(self._take_unrecorded())

    def _take_unrecorded(self) -> list[tuple[str, ActionRecord]]:
        """The records waiting to be written; none wait afterwards."""
        finished, self._unrecorded, self._record_by = self._unrecorded, [], math.inf
        return finished

    def _settle(
        self,
        action: BuildAction,
        decision: Decision,
        error: BaseException | None,
        produced: dict[BuildFile, tuple[StatKey, str]],
    ) -> ActionRecord | None:
        """Take ``action`` off the running set; a failure is reported now, a success
        gives the record to write."""
        self._running.discard(action)
        self._ending.discard(action)
        self._pools.release(action)
        if error is _CANCELLED:
            return None  # counted as not run
        run = self._runs[action]
        if run.start_time is not None and run.finish_time is not None:
            self.store.remember_duration(decision.action_id, run.finish_time - run.start_time)
        if error is not None:
            self._fail(action, decision, error)
            return None
        outputs = {}
        for f, (skey, digest) in produced.items():
            self.store.remember_digest(f.fs_str, skey, digest)
            self.checker.digests[f] = digest
            outputs[f.key] = digest
        return ActionRecord(decision.key, decision.params, decision.inputs, outputs)

    def _pretend(self, action: BuildAction, decision: Decision) -> None:
        """Dry run: count the action as run; its outputs' new digests are unknown."""
        if self._cache.would_serve(action, decision):
            decision = dataclasses.replace(
                decision, reason=f"{decision.reason}; would be served from cache"
            )
        self.result.would_run.append((action, decision.reason or ""))
        self.events.would_run(action, decision)
        for f in self.plan.outputs[action]:
            self.checker.digests[f] = f"{REBUILT_DIGEST}{action.desc}>"
        self._succeed(action)

    def _succeed(self, node: BuildDependency) -> None:
        self._finished.add(node)
        for consumer in self.plan.consumers[node]:
            if consumer in self._finished:
                continue
            self._pending[consumer] -= 1
            if self._pending[consumer] == 0:
                self._ready.append(consumer)

    def _fail(self, action: BuildAction, decision: Decision, error: BaseException) -> None:
        self._runs[action].failure = error
        self._finished.add(action)
        self.result.failed.append(action)
        self.result.errors[action] = error
        self.events.failed(action, decision, error)
        if self.opts.fail_fast:
            self._stopping = True
        cascade: deque[BuildDependency] = deque([action])
        while cascade:
            cause = cascade.popleft()
            for consumer in self.plan.consumers[cause]:
                if consumer in self._finished:
                    continue
                failure = DependenceException(f"not run: it needs {node_name(cause)}, which failed")
                self._runs[consumer].failure = failure
                if isinstance(consumer, BuildAction):
                    self.result.errors[consumer] = failure
                    self.events.not_run(consumer, str(failure), root=action)
                self._finished.add(consumer)
                cascade.append(consumer)

    def _interrupt(self) -> None:
        """Stop everything running and remove what it half-wrote."""
        self._stopping = True
        self._on_interrupt()
        if self.remote is not None:
            self.remote.cancel_all()
        if self._processes is not None:
            self._processes.shutdown()
        # A second signal cuts the wait short, not the clean-up.
        with contextlib.suppress(KeyboardInterrupt):
            self._drain_running(time.monotonic() + _INTERRUPT_WAIT_S)
        for action in self.plan.actions:
            done = action in self.result.built or action in self.result.cached
            if self._runs[action].start_time is not None and not done:
                ActionOutputs.remove_partial(self.plan.outputs[action])

    def _drain_running(self, deadline: float) -> None:
        """Until ``deadline``, collect what running actions report; record those that
        finished successfully despite the interrupt."""
        while self._running and time.monotonic() < deadline:
            self._finish_reaped()
            for item in self._done.take(0.1):
                if item[2] is None:
                    self._complete(*item)
                elif item[2] is not _ENDED:
                    self._running.discard(item[0])

    def _shutdown(self) -> None:
        self._done.release()  # what still runs is reaped by the runner's own thread
        if self._processes is not None:
            self._processes.shutdown()
        if self._threads is not None:
            self._threads.shutdown(wait_s=0 if self.result.interrupted else 1.0)
