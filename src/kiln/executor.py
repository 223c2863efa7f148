"""The executor: owns one build graph, analyses entrypoints and builds targets.

The names a build module written for ``iree.build.executor`` imports are
re-exported here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from kiln.base.errors import DependenceException, NotRegularFile
from kiln.base.events import EventReader
from kiln.base.gc_pause import gc_paused
from kiln.devices.identity import UNDECIDED
from kiln.engine.incremental import action_id
from kiln.engine.request import BuildRequest, SchedulerOptions
from kiln.engine.result import BuildResult
from kiln.engine.scheduler import Scheduler
from kiln.engine.unrequested import judge as judge_unrequested
from kiln.execution.process.reaper import BuildReaper
from kiln.execution.run_context import RunContext
from kiln.graph import (
    ActionConcurrency,
    BuildAction,
    BuildContext,
    BuildDependency,
    BuildEntrypoint,
    BuildFile,
    BuildFileMetadata,
    BuildMeta,
    FileNamespace,
    as_namespace,
    join_namespace,
)
from kiln.graph.args import ClArg
from kiln.graph.entrypoints import Entrypoint
from kiln.graph.progress import ProgressReporter
from kiln.graph.registry import Checkpoint, GraphRegistry
from kiln.observe.event_log import LastBuild
from kiln.observe.manifest import ManifestInputs
from kiln.output_dir.layout import OutputLayout
from kiln.output_dir.lock import OutputLock
from kiln.output_dir.ownership import claim_output_dir, output_dir_state
from kiln.output_dir.tree import OutputTree
from kiln.planning.checked_plan import PlanChecker
from kiln.planning.plan import Plan, make_plan
from kiln.state import Produced, StateStore, stat_key

if TYPE_CHECKING:
    from kiln.cache import BuildCache
    from kiln.execution.cluster.offload import ClusterOffload
    from kiln.planning.action_key import KeyMaker

__all__ = [
    "ActionConcurrency",
    "BuildAction",
    "BuildContext",
    "BuildDependency",
    "BuildEntrypoint",
    "BuildFile",
    "BuildFileLike",
    "BuildFileMetadata",
    "BuildMeta",
    "ClArg",
    "DependenceException",
    "Entrypoint",
    "Executor",
    "FileNamespace",
    "ProgressReporter",
    "join_namespace",
]

# What actions accept for a file: the file, or its path in the current context.
BuildFileLike = BuildFile | str


class Executor:
    """The iree.build-compatible facade of one build graph and the output directory
    it builds into: it composes the graph registry (``graph``), the output layout
    (``layout``), the run-time services actions reach (``run_context``) and the
    build state, and runs builds.

    A build runs with a ``BuildRequest`` (``run``): the command line gives the
    executor its request when it makes it, and each build the request completed
    with what it connected. The attributes a build module written for iree.build
    (or a test) may still set (``cache``, ``remote``, ``event_readers``,
    ``strict_keys``...) make the request of a build run with ``SchedulerOptions``
    alone (``request``).

    Invariant: ``all`` maps every graph path to the single file or context
    defined there; the root context has the empty path. With ``read_only`` (the
    commands that must create nothing) the state is a snapshot and nothing under
    the output directory is written.
    """

    def __init__(
        self,
        output_dir: Path | str,
        stderr: IO[str] | None = None,
        reporter: ProgressReporter | None = None,
        request: BuildRequest | None = None,
        source_root: str | None = None,
    ):
        request = request if request is not None else BuildRequest()
        self.stderr = stderr if stderr is not None else sys.stderr
        self.layout = OutputLayout(output_dir, warn=lambda m: self.reporter.message(m))
        self.run_context = RunContext(
            self.layout, reporter if reporter is not None else ProgressReporter(), self.store
        )
        self.run_context.environment = request.environment
        if request.devices is not None:
            self.run_context.devices = request.devices
        self.graph = GraphRegistry(self.layout)
        if source_root is not None:
            self.graph.source_root = source_root
        self.verbose_level = request.verbose
        self.read_only = request.read_only
        self.failed_deps: set[BuildDependency] = set()
        self.last_result: BuildResult | None = None
        # Extra readers of every build's events (``--events``, ``--profile``).
        self.event_readers: list[EventReader] = list(request.readers)
        # The shared cache builds read and fill (None: off).
        self.cache: BuildCache | None = request.cache
        # Where remotable actions run (``--executor dask...``); None: on this machine.
        self.remote: ClusterOffload | None = request.remote
        # True: an action kiln cannot key stops the build (``--strict-keys``);
        # False: it runs on every build, never cached, and kiln says so.
        self.strict_keys = request.strict_keys
        self._store: StateStore | None = None
        self._checker = PlanChecker()
        BuildContext("", self)

    @property
    def output_dir(self) -> Path:
        return self.layout.output_dir

    @property
    def source_root(self) -> str:
        """What source files' keys are relative to (``GraphRegistry.source_root``)."""
        return self.graph.source_root

    @source_root.setter
    def source_root(self, path: str) -> None:
        self.graph.source_root = path

    @property
    def reporter(self) -> ProgressReporter:
        return self.run_context.reporter

    @reporter.setter
    def reporter(self, reporter: ProgressReporter) -> None:
        self.run_context.reporter = reporter

    @property
    def outputs(self) -> OutputTree:
        return self.layout.tree

    # -- the graph (``GraphRegistry``) ------------------------------------------

    @property
    def all(self) -> dict[str, BuildContext | BuildFile]:
        return self.graph.all

    @property
    def entrypoints(self) -> list[BuildEntrypoint]:
        return self.graph.entrypoints

    def manifest_inputs(self) -> ManifestInputs:
        """The values this graph's manifest is written from."""
        return ManifestInputs(
            output_dir=str(self.output_dir),
            manifest_path=self.layout.manifest_path,
            entrypoints=tuple(self.entrypoints),
            nodes=tuple(self.all.values()),
            store=self.store(),
            warn=self.reporter.message,
        )

    def register(self, path: str, node: BuildContext | BuildFile) -> None:
        self.graph.register(path, node)

    def checkpoint(self) -> Checkpoint:
        """A mark to ``rollback`` to: undoes what an entrypoint that failed declared."""
        return self.graph.checkpoint()

    def rollback(self, mark: Checkpoint) -> None:
        self.graph.rollback(mark)

    def get_context(self, path: str) -> BuildContext:
        return self.graph.get_context(path)

    def get_file(self, path: str) -> BuildFile:
        return self.graph.get_file(path)

    # -- the output layout (``OutputLayout``) -------------------------------------

    def relative_path(self, f: BuildFile) -> str:
        """Where output ``f`` lives, relative to the output directory."""
        return self.layout.relative_path(f)

    def get_root(self, namespace: FileNamespace) -> Path:
        return self.layout.root(as_namespace(namespace))

    def ensure_dir(self, path: Path) -> None:
        self.layout.ensure_dir(path)

    def log_path(self, f: BuildFile) -> str:
        """The log file of the action producing ``f`` (its directory made)."""
        return self.layout.log_path(f)

    def output_digest(self, f: BuildFile) -> str | None:
        """The digest of output ``f`` when it is a regular file reached through real
        directories, else None."""
        if self.layout.tree.dir_problem(os.path.dirname(f.fs_str)) is not None:
            return None
        try:
            return self.store().digest(f.fs_str, output=True)
        except NotRegularFile:
            return None

    def write_status(self, message: str) -> None:
        self.run_context.write_status(message)

    def analyze(self, *entrypoints: Callable[[], Any]) -> None:
        """Call each entrypoint inside the root context, declaring its subgraph."""
        with self.get_context(""), gc_paused():
            for ep in entrypoints:
                ep()

    # -- building ------------------------------------------------------------

    def build(self, *targets: BuildDependency, **options: Any) -> bool:
        """Build ``targets`` and what they need; True when everything built."""
        return self.run(targets, SchedulerOptions(**options)).ok

    def request(self, options: SchedulerOptions) -> BuildRequest:
        """The request of a build run with ``options``, with what this executor is
        set to (for callers that set its attributes, as iree.build's do)."""
        return BuildRequest(
            options=options,
            environment=self.run_context.environment,
            strict_keys=self.strict_keys,
            read_only=self.read_only,
            verbose=self.verbose_level,
            devices=self.run_context.devices,
            cache=self.cache,
            remote=self.remote,
            readers=tuple(self.event_readers),
        )

    def plan(self, targets: Iterable[BuildDependency]) -> Plan:
        """What ``targets`` need, in order (cycle check included); runs nothing."""
        return make_plan(targets, self.graph.files())

    def checked_plan(self, targets: Iterable[BuildDependency]) -> Plan:
        """The plan of ``targets``, once every action in it says it can run."""
        plan = self.plan(targets)
        self._checker.check(plan, self.reporter.message)
        # With --strict-keys, an action kiln cannot key stops here. The build's
        # devices may not be chosen yet (a cluster is connected later): the keys'
        # device parts are made when it runs.
        self._checker.keys(
            plan, self.run_context.environment, self.strict_keys, UNDECIDED, self.reporter.message
        )
        return plan

    def run(
        self,
        targets: Iterable[BuildDependency],
        request: BuildRequest | SchedulerOptions,
        plan: Plan | None = None,
    ) -> BuildResult:
        """Build ``targets`` as ``request`` asks (``SchedulerOptions``: with what this
        executor is set to, ``request``); ``plan``: their ``checked_plan``, when
        already made. The actions reach the request's environment and devices
        through ``run_context``."""
        if isinstance(request, SchedulerOptions):
            request = self.request(request)
        plan = plan if plan is not None else self.checked_plan(targets)
        self.run_context.environment = request.environment
        if request.devices is not None:
            self.run_context.devices = request.devices
        keys = self._checker.keys(
            plan,
            request.environment,
            request.strict_keys,
            self.run_context.devices,
            self.reporter.message,
        )
        options = request.options
        if (options.dry_run or request.read_only) and self._store is None:
            self.read_only = True  # a dry run writes nothing, the state included
        if options.dry_run or request.read_only or self.read_only:  # the request counts too
            options = replace(options, dry_run=True)
            output_dir_state(self.output_dir)
        else:
            claim_output_dir(self.output_dir)
        store = self.store()
        readers = list(request.readers)
        # A dry run writes nothing, its events included.
        last = None if options.dry_run else LastBuild(store.path.parent, self.reporter.message)
        if last is not None:
            readers.append(last)
        self.run_context.start_dir = os.getcwd()  # as iree.build's workers inherit it
        scheduler = Scheduler(
            plan,
            store,
            self.reporter,
            options,
            keys,
            on_interrupt=self.run_context.kill_subprocesses,
            outputs=None if options.dry_run else self.layout.tree,
            readers=readers,
            cache=request.cache,
            remote=request.remote,
            environment=self.run_context.program_setting,
            commands=self.run_context.command_runner,
        )
        self.graph.runs.begin(scheduler.result.runs)
        try:
            if options.dry_run:
                result = scheduler.run()
            else:
                with BuildReaper(self.reporter.message):
                    result = scheduler.run()
                    if options.check_reproducible and not result.interrupted:
                        self._check_reproducible(plan, result, scheduler, options.jobs, keys)
                result.unrequested = judge_unrequested(
                    self.entrypoints, self.graph.files(), plan, keys, result.digests, store
                )
        finally:
            self.failed_deps.update(
                n for n, run in scheduler.result.runs.items() if run.failure is not None
            )
            self.run_context.end_build()
            if last is not None:
                last.close()
            if request.cache is not None and not options.dry_run:
                request.cache.end_build()
        self.last_result = result
        return result

    def _check_reproducible(
        self, plan: Plan, result: BuildResult, scheduler: Scheduler, jobs: int, keys: KeyMaker
    ) -> None:
        """``--check-reproducible``: run the build's actions again (``kiln.engine.reproducible``);
        then withdraw from the caches what they did not reproduce, and put in what
        they did (``CacheStep.settle``)."""
        from kiln.engine.reproducible import check_build, checked_actions

        self.reporter.message("kiln: checking that every action reproduces its outputs ...")
        store = self.store()
        found = check_build(
            plan, result, self.run_context, jobs, store.mark_nonreproducible, keys.keys_conventions
        )
        result.not_reproducible = found
        why = {d.action: str(d) for d in reversed(found)}  # the first difference of each
        checked = checked_actions(plan, result)
        reproduced = [a for a in checked if a not in why and a in result.keys]
        store.clear_nonreproducible([result.keys[a] for a in reproduced])

        records = store.records()

        def outputs(action: BuildAction) -> Produced | None:
            """What ``action`` has here, as a build records it (None: not all there,
            or its record holds run-time dependencies, which no cache may take)."""
            files = plan.outputs[action]
            if not all(f in result.digests for f in files):
                return None
            record = records.get(action_id(action, files))
            if record is None or record.run_deps():
                return None
            try:
                return {f: (stat_key(os.lstat(f.fs_str)), result.digests[f]) for f in files}
            except OSError:
                return None

        scheduler.cache_step.settle(checked, why, result.keys, outputs)

    def store(self) -> StateStore:
        """The build state: a snapshot (in memory) when ``read_only``, else the database."""
        if self._store is None:
            if self.read_only:
                from kiln.state.snapshot import StateSnapshot

                self._store = StateSnapshot(self.output_dir, warn=self.reporter.message)
            else:
                self._store = StateStore(self.output_dir, warn=self.reporter.message)
        return self._store

    def lock(self, wait: bool = True) -> OutputLock:
        """The lock that keeps two builds off this output directory (which it claims)."""
        return OutputLock(self.output_dir, wait=wait, notify=self.reporter.message)

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
        if self.cache is not None:
            self.cache.close()

    def access_file_metadata(
        self, f: BuildFile, mutate: Callable[[BuildFileMetadata], bool] | None
    ) -> BuildFileMetadata:
        return self.run_context.file_metadata(f, mutate)

    # -- subprocesses (``RunContext``) -------------------------------------------

    def track(self, proc: subprocess.Popen[bytes], running: bool) -> None:
        """Note a subprocess started (or ended) by an action, to kill it on interrupt."""
        self.run_context.track(proc, running)

    def kill_subprocesses(self) -> None:
        self.run_context.kill_subprocesses()
