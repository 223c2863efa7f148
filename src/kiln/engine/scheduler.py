"""Running a plan once: the loop that ties the ready queue, the dispatch of
actions, the recording of their results and the events (as Ninja's
``Builder::Build`` ties its ``Plan`` and ``CommandRunner``).

One thread owns the bookkeeping. Each round it decides the ready nodes (an
action's up-to-date check happens when its inputs' digests are known, so only
once every dependency succeeded), starts what fits within ``-j`` and the
resource pools (``kiln.engine.limits``), and takes the completions that came meanwhile
(``kiln.engine``). What happens is emitted as events (``kiln.engine.build_events``)
and recorded in the ``BuildResult`` (``kiln.engine.result``).
"""

from __future__ import annotations

import dataclasses
import os
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

from kiln.base import events as ev
from kiln.base.errors import (
    ConfinementError,
    DependenceException,
    DeviceAbsent,
    KilnError,
    StateError,
)
from kiln.cache import BuildCache
from kiln.engine.action_outputs import ActionOutputs
from kiln.engine.build_events import BuildEmitter
from kiln.engine.cache_step import CacheStep
from kiln.engine.dispatch import Dispatcher, Route
from kiln.engine.failures import unchanged
from kiln.engine.incremental import REBUILT_DIGEST, Decision, UpToDateChecker
from kiln.engine.interruption import interrupt
from kiln.engine.limits import MAX_JOBS, ResourcePools, cap_jobs
from kiln.engine.priority import remaining_paths
from kiln.engine.ready import ReadyQueue, Waiting
from kiln.engine.recording import Recorder
from kiln.engine.request import SchedulerOptions
from kiln.engine.result import BuildResult, NodeRun
from kiln.engine.shared import CANCELLED, ENDED, Done, Shared
from kiln.execution.process.commands import CommandRunner
from kiln.graph import BuildAction, BuildDependency
from kiln.graph.progress import ProgressReporter
from kiln.output_dir.tree import OutputTree
from kiln.output_dir.writing import sync_filesystem
from kiln.planning.action_key import KeyMaker
from kiln.planning.plan import Plan, node_name
from kiln.state import StateStore

__all__ = ["MAX_JOBS", "BuildResult", "Scheduler", "SchedulerOptions"]

if TYPE_CHECKING:  # imported only by a build with a remote executor
    from kiln.execution.cluster.offload import ClusterOffload

# The most in-line actions run in a row before the scheduler takes completions.
_INLINE_BATCH = 64


class Scheduler:
    """Runs one plan once.

    Invariants: an action is started only when every node it needs succeeded; at
    most ``jobs`` actions run at once (commands hold their place until they are
    reaped); the records of succeeded actions are in the state before any of
    their dependents starts (``Recorder``)."""

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
        remote: ClusterOffload | None = None,
        environment: Callable[[], tuple[dict[str, str], str, str]] | None = None,
        commands: Callable[[], CommandRunner] | None = None,
    ):
        self.plan = plan
        self.store = store
        self.opts = options
        self.result = BuildResult(runs={n: NodeRun() for n in plan.order})
        self.events = BuildEmitter(
            ev.EventStream([reporter, *(readers or [])]),
            plan,
            self.result.runs,
            explain=options.explain,
        )
        self.checker = UpToDateChecker(plan, store, keys)
        # The shared cache as this build uses it; ``--check-reproducible`` defers its
        # saves until the second runs agreed (the executor flushes them).
        self.cache_step = CacheStep(
            cache, plan, avoid=store.nonreproducible(), defer=options.check_reproducible
        )
        self.shared = Shared(
            plan, self.result.runs, self.events, self.cache_step, options.fail_fast
        )
        paths = (
            (lambda: remaining_paths(plan, self.events.all_ids(), store.durations()))
            if options.critical_path
            else None
        )
        self.ready = ReadyQueue(plan, paths)
        self._jobs, self._cap_note = cap_jobs(options.jobs, len(plan.actions))
        self.dispatch = Dispatcher(
            self.shared,
            self._jobs,
            remote,
            self.checker.digests,
            environment or (lambda: (dict(os.environ), os.getcwd(), os.getcwd())),
            commands,
            self.checker.run_deps,
        )
        self.recorder = Recorder(store, self.checker.digests)
        self._pools = ResourcePools(dict(options.pools))
        self._outputs = ActionOutputs(store, outputs)
        self._tree = outputs
        self._on_interrupt = on_interrupt
        # Running commands that ended, whose outputs are being committed: their
        # places are free for the next commands (a subset of ``Shared.running``).
        self._ending: set[BuildAction] = set()

    def run(self) -> BuildResult:
        start = time.monotonic()
        self.shared.thread = threading.get_ident()
        self.events.build_started(self.opts.jobs)
        if self._cap_note is not None:
            self.events.note(self._cap_note)
        try:
            self._loop()
        except KeyboardInterrupt:
            self.result.interrupted = True
            interrupt(self.shared, self.dispatch, self.result, self._on_interrupt, self._complete)
            raise
        finally:
            self._finish_build(start)
        return self.result

    def _finish_build(self, start: float) -> None:
        """What every build does at its end, however it ended."""
        self.shared.done.release()  # what still runs is reaped by the runner's own thread
        self.dispatch.shutdown(self.result.interrupted)
        finished, runs = self.ready.finished, self.result.runs
        self.result.not_run = [
            a
            for a in self.plan.actions
            if a not in finished or isinstance(runs[a].failure, DependenceException)
        ]
        self.result.wall_s = time.monotonic() - start
        self.result.digests = {
            f: d
            for f, d in self.checker.digests.items()
            if d is not None and not d.startswith(REBUILT_DIGEST)
        }
        self.recorder.write()
        self.store.flush()
        if self._tree is not None and (self.result.built or self.result.cached):
            failed = sync_filesystem(self._tree.root)  # on disk before it says done
            if failed is not None:
                self.events.note(
                    f"warning: the outputs may not all be on disk ({self._tree.root}): {failed}"
                )
        self.events.build_finished(self.result)

    def _loop(self) -> None:
        shared, recorder = self.shared, self.recorder
        while True:
            self._drain_ready()
            self._launch()
            self.dispatch.lanes.finish_reaped()
            if not shared.running:
                return
            now = time.monotonic()
            if now >= recorder.due:
                recorder.write()
            # Every completion waiting: one wake-up (by the time records are due).
            timeout = min(0.5, recorder.due - now)
            self._complete_all(self._note_ended(shared.done.take(timeout)))

    def _note_ended(self, batch: list[Done]) -> list[Done]:
        """Free the places of the commands that ended; the completions in ``batch``."""
        done = []
        for item in batch:
            if item[2] is ENDED:
                self._ending.add(item[0])
            else:
                done.append(item)
        return done

    def _drain_ready(self) -> None:
        # Once per node of a no-op build: the bound methods are looked up once.
        ready, succeed, decide = self.ready.ready, self.ready.succeed, self.checker.decide
        skipped, up_to_date = self.result.skipped, self.events.up_to_date
        keys, shared = self.result.keys, self.shared
        while ready and not shared.stopping:
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
            elif node.needs is not None and self._device_absent(node, decision):
                continue
            elif decision.failed_before is not None and not self.opts.retry_failed:
                self._fail(node, decision, unchanged(decision.failed_before))
            elif self.opts.dry_run:
                self._pretend(node, decision)
            else:
                self.ready.wait(node, decision)

    def _launch(self) -> None:
        """Start the waiting actions that fit: within ``-j`` and the pools."""
        ready, dispatch = self.ready, self.dispatch
        if self.shared.stopping:
            ready.waiting.clear()
            return
        deferred: list[Waiting] = []
        chosen: list[Waiting] = []  # for the worker threads, then in-line ones
        # Each chosen action's route, judged once: where it was counted is where it runs.
        routes: dict[BuildAction, Route] = {}
        inline: list[Waiting] = []
        busy = len(self.shared.running) - len(self._ending)
        jobs = self._jobs
        # Up to ``jobs`` more than run are queued for the worker threads, so a thread
        # that finishes starts its next action without waiting for this thread. Only
        # ``jobs`` threads exist, so no more than ``jobs`` actions run; in-line actions
        # run one after the other, each only when it fits within ``jobs`` with
        # everything queued, at most ``_INLINE_BATCH`` before completions are taken.
        while ready.waiting and busy + len(chosen) < 2 * jobs and len(inline) < _INLINE_BATCH:
            entry = ready.next_waiting()
            action = entry[2]
            route = dispatch.route(action)
            place = route.place
            here = place.in_line
            # With in-line actions to run, one of the ``jobs`` places is theirs. A
            # command holds its place until it is reaped: no queuing ahead for it.
            room = jobs if here or not inline else jobs - 1
            if (here or inline or place.holds_place) and busy + len(chosen) >= room:
                ready.put_back(entry)  # the best waits for a free place
                break
            if not self._pools.take(action):
                deferred.append(entry)
                continue
            routes[action] = route
            (inline if here else chosen).append(entry)
        for entry in deferred:
            ready.put_back(entry)
        chosen += inline
        if not chosen:
            return
        # One transaction records what finished since the last one, drops the old
        # records of the chosen and claims their outputs, and does the same for every
        # action that came to wait since the last one. A round that starts only
        # actions claimed so, none of which depends on a record still waiting, needs
        # no transaction: the records are written with the next one or when due
        # (``Recorder``).
        unclaimed = self._outputs.unclaimed([e[3].action_id for e in chosen])
        if unclaimed or self.recorder.read_by(e[2] for e in chosen):
            outputs = self.plan.outputs
            self._outputs.claim(
                [(e[3].action_id, outputs[e[2]]) for e in chosen if e[3].action_id in unclaimed],
                self.recorder.take(),
                [(e[3].action_id, outputs[e[2]]) for e in ready.take_arrived()],
            )
        for entry in chosen:
            self._start(entry[2], entry[3], entry[:2], routes[entry[2]])

    def _start(
        self, action: BuildAction, decision: Decision, order: tuple[float, int], route: Route
    ) -> None:
        """Start ``action``, whose old record ``_launch`` dropped and whose outputs it
        claimed: prepare its outputs, then dispatch it."""
        self.shared.running.add(action)
        try:
            self._outputs.prepare(self.plan.outputs[action])
            ActionOutputs.link_sources(self.plan.inputs[action])
        except StateError:
            raise  # the state cannot be written: the build stops
        except (KilnError, OSError) as e:
            error = (
                e
                if isinstance(e, KilnError)
                else ConfinementError(f"'{action.desc}': cannot prepare its output: {e}")
            )
            run = self.result.runs[action]
            run.start_time = run.finish_time = time.time()
            self.events.started(action, decision)
            self.shared.done.put((action, decision, error, {}))
            return
        self.dispatch.start(action, decision, order, route)

    def _complete(self, item: Done) -> None:
        self._complete_all([item])

    def _complete_all(self, batch: list[Done]) -> None:
        """Process the completions of one wake-up: report them and release their
        dependents. Their records wait for the next transaction (``Recorder``)."""
        for action, decision, error, produced in batch:
            self.shared.running.discard(action)
            self._ending.discard(action)
            self._pools.release(action)
            if error is CANCELLED:
                continue  # counted as not run
            run = self.result.runs[action]
            self.recorder.ran(decision, run)
            if error is not None:
                self.recorder.failed(action, decision, error)
                self._fail(action, decision, error)
                continue
            self.recorder.record(action, decision, produced)
            lane = self.dispatch.served.pop(action, None)
            if lane is not None:
                self.result.cached.append(action)
                self.events.cached(action, decision, produced, run.start_time or time.time(), lane)
            else:
                self.result.built.append(action)
                self.events.finished(action, decision, produced)
            self.ready.succeed(action)

    def _fail(self, action: BuildAction, decision: Decision, error: BaseException) -> None:
        """Report ``action``'s failure (an ``UnchangedFailure``: it was not run again),
        and everything that will not run because of it."""
        runs = self.result.runs
        runs[action].failure = error
        self.result.failed.append(action)
        self.result.errors[action] = error
        self.events.failed(action, decision, error)
        self.shared.failed_action()
        for consumer, cause in self.ready.cascade(action):
            failure = DependenceException(f"not run: it needs {node_name(cause)}, which failed")
            runs[consumer].failure = failure
            if isinstance(consumer, BuildAction):
                self.result.errors[consumer] = failure
                self.events.not_run(consumer, str(failure), root=action)

    def _device_absent(self, action: BuildAction, decision: Decision) -> bool:
        """Whether ``action``'s device is on no machine of the build and it was
        therefore failed (``--require-devices``) or skipped, with everything that
        needs it; False: it runs (its device is there, or it records its absence
        in its own result, as a verify does)."""
        devices = action.run_context.devices
        assert action.needs is not None
        if devices.resolve(action.needs) is not None:
            return False
        why = devices.absent_reason(action.needs)
        if devices.require:
            self._fail(action, decision, DeviceAbsent(f"{why} (--require-devices)"))
            return True
        if action.records_absence:
            return False
        self.result.absent[action] = why
        self.events.not_run(action, f"skipped: {why}")
        for consumer, cause in self.ready.cascade(action):
            if isinstance(consumer, BuildAction):
                self.result.absent[consumer] = f"it needs {node_name(cause)}, which was skipped"
                self.events.not_run(consumer, f"skipped: {self.result.absent[consumer]}")
        return True

    def _pretend(self, action: BuildAction, decision: Decision) -> None:
        """Dry run: count the action as run; its outputs' new digests are unknown."""
        if self.cache_step.would_serve(action, decision):
            decision = dataclasses.replace(
                decision, reason=f"{decision.reason}; would be served from cache"
            )
        else:
            decision = self.cache_step.noted(decision)
        self.result.would_run.append((action, decision.reason or ""))
        self.events.would_run(action, decision)
        for f in self.plan.outputs[action]:
            self.checker.digests[f] = f"{REBUILT_DIGEST}{action.desc}>"
        self.ready.succeed(action)

    @property
    def finished(self) -> set[BuildDependency]:
        """The nodes that succeeded, failed or were cascaded."""
        return self.ready.finished
