"""The executor: owns one build graph, analyses entrypoints and builds targets.

The names a build module written for ``iree.build.executor`` imports are
re-exported here.
"""

from __future__ import annotations

import difflib
import hashlib
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from kiln._gc import gc_paused
from kiln._reaper import BuildReaper
from kiln.actionkey import KeyMaker
from kiln.args import ClArg
from kiln.entrypoints import Entrypoint
from kiln.errors import BuildDefinitionError, DependenceException, NotRegularFile
from kiln.events import EventReader
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
    join_namespace,
    namespace_dir,
)
from kiln.lock import OutputLock
from kiln.output_names import OutputNames
from kiln.output_tree import OutputTree
from kiln.outputs import KILN_DIR, NAME_MAX, claim_output_dir, output_dir_state
from kiln.plan import Plan, make_plan
from kiln.reporting import ProgressReporter
from kiln.runners import kill_group
from kiln.scheduler import BuildResult, Scheduler, SchedulerOptions
from kiln.state import StateStore
from kiln.trace import LastBuild

if TYPE_CHECKING:
    from kiln.cache import BuildCache

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
    """One build graph and the output directory it builds into.

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
    ):
        self.output_dir = Path(output_dir).absolute()
        # What source files' keys are relative to: the build module's directory
        # (the command line sets it), else the working directory.
        self.source_root = os.getcwd()
        self.stderr = stderr if stderr is not None else sys.stderr
        self.reporter = reporter if reporter is not None else ProgressReporter()
        self.verbose_level = 0
        self.read_only = False
        self.all: dict[str, BuildContext | BuildFile] = {}
        self.entrypoints: list[BuildEntrypoint] = []
        self.failed_deps: set[BuildDependency] = set()
        self.last_result: BuildResult | None = None
        # Extra readers of every build's events (``--events``, ``--profile``).
        self.event_readers: list[EventReader] = []
        # The shared cache builds read and fill (the command line sets it; None: off).
        self.cache: BuildCache | None = None
        self._store: StateStore | None = None
        self._keyed: tuple[Plan, KeyMaker] | None = None  # the last plan checked, keyed
        self._metadata_lock = threading.RLock()
        self._subprocesses: set[subprocess.Popen[bytes]] = set()
        self._subprocess_lock = threading.Lock()
        self._ns_dirs = {ns: namespace_dir(ns) for ns in FileNamespace}
        self._roots = {ns: self.output_dir / d for ns, d in self._ns_dirs.items()}
        self.outputs = OutputTree(self.output_dir, warn=lambda m: self.reporter.message(m))
        self._names = OutputNames(str(self.output_dir))
        BuildContext("", self)

    # -- the graph -----------------------------------------------------------

    def register(self, path: str, node: BuildContext | BuildFile) -> None:
        existing = self.all.get(path)
        if existing is not None:
            raise BuildDefinitionError(
                f"duplicate path '{path}': defined at {node.def_site} and already at "
                f"{existing.def_site}; give one of them another name"
            )
        if isinstance(node, BuildFile) and node.source is None:
            self._names.add(self.relative_path(node), str(node.def_site))
        self.all[path] = node

    def relative_path(self, f: BuildFile) -> str:
        """Where output ``f`` lives, relative to the output directory."""
        return f"{self._ns_dirs[f.namespace]}/{f.path}"

    def checkpoint(self) -> tuple[int, int, int]:
        """A mark to ``rollback`` to: undoes what an entrypoint that failed declared."""
        return len(self.all), len(self.entrypoints), self._names.mark()

    def rollback(self, mark: tuple[int, int, int]) -> None:
        for path in list(self.all)[mark[0]:]:
            del self.all[path]
        del self.entrypoints[mark[1]:]
        self._names.undo(mark[2])

    def get_context(self, path: str) -> BuildContext:
        node = self.all.get(path)
        if not isinstance(node, BuildContext):
            raise BuildDefinitionError(f"no build context '{path}'{self._suggest(path)}")
        return node

    def get_file(self, path: str) -> BuildFile:
        node = self.all.get(path)
        if not isinstance(node, BuildFile):
            raise BuildDefinitionError(
                f"file '{path}' is not known in the build graph{self._suggest(path, files=True)}"
            )
        return node

    def _suggest(self, path: str, files: bool = False) -> str:
        names = [p for p, n in self.all.items() if p and (not files or isinstance(n, BuildFile))]
        close = difflib.get_close_matches(path, names, n=5, cutoff=0.5)
        return f"; did you mean: {', '.join(close)}?" if close else ""

    def get_root(self, namespace: FileNamespace) -> Path:
        return self._roots[namespace]

    def ensure_dir(self, path: Path) -> None:
        """Create the directory ``path`` below the output directory, never through a
        link (once per build: outputs share directories)."""
        self.outputs.make_dirs(path)

    def log_path(self, f: BuildFile) -> str:
        """The log file of the action producing ``f`` (its directory made)."""
        name = os.path.basename(f.path) + ".log"
        if len(os.fsencode(name)) > NAME_MAX:  # a long output name: shortened, kept unique
            name = f"{name[:64]}-{hashlib.sha256(name.encode()).hexdigest()[:16]}.log"
        path = self.output_dir / KILN_DIR / "logs" / os.path.dirname(f.path) / name
        self.outputs.make_dirs(path.parent)
        return str(path)

    def output_digest(self, f: BuildFile) -> str | None:
        """The digest of output ``f`` when it is a regular file reached through real
        directories, else None."""
        if self.outputs.dir_problem(os.path.dirname(f.fs_str)) is not None:
            return None
        try:
            return self.store().digest(f.fs_str, output=True)
        except NotRegularFile:
            return None

    def write_status(self, message: str) -> None:
        self.reporter.message(message)

    def analyze(self, *entrypoints: Callable[[], Any]) -> None:
        """Call each entrypoint inside the root context, declaring its subgraph."""
        with self.get_context(""), gc_paused():
            for ep in entrypoints:
                ep()

    # -- building ------------------------------------------------------------

    def build(self, *targets: BuildDependency, **options: Any) -> bool:
        """Build ``targets`` and what they need; True when everything built."""
        return self.run(targets, SchedulerOptions(**options)).ok

    def plan(self, targets: Iterable[BuildDependency]) -> Plan:
        """What ``targets`` need, in order (cycle check included); runs nothing."""
        return make_plan(targets, [n for n in self.all.values() if isinstance(n, BuildFile)])

    def checked_plan(self, targets: Iterable[BuildDependency]) -> Plan:
        """The plan of ``targets``, once every action in it says it can run."""
        plan = self.plan(targets)
        for action in plan.actions:
            action.check_runnable()
        self._keys_for(plan)  # an action kiln cannot key stops the build here
        return plan

    def _keys_for(self, plan: Plan) -> KeyMaker:
        """The keyed parameters of every action of ``plan``, made once per plan."""
        if self._keyed is None or self._keyed[0] is not plan:
            keys = KeyMaker()
            keys.all(plan.actions)
            self._keyed = (plan, keys)
        return self._keyed[1]

    def run(
        self,
        targets: Iterable[BuildDependency],
        options: SchedulerOptions,
        plan: Plan | None = None,
    ) -> BuildResult:
        """Build ``targets`` (``plan``: their ``checked_plan``, when already made)."""
        plan = plan if plan is not None else self.checked_plan(targets)
        keys = self._keys_for(plan)
        if options.dry_run and self._store is None:
            self.read_only = True  # a dry run writes nothing, the state included
        if options.dry_run or self.read_only:
            options.dry_run = True
            output_dir_state(self.output_dir)
        else:
            claim_output_dir(self.output_dir)
        store = self.store()
        readers = list(self.event_readers)
        # A dry run writes nothing, its events included.
        last = None if options.dry_run else LastBuild(store.path.parent, self.reporter.message)
        if last is not None:
            readers.append(last)
        scheduler = Scheduler(
            plan, store, self.reporter, options, keys, on_interrupt=self.kill_subprocesses,
            outputs=None if options.dry_run else self.outputs, readers=readers,
            cache=self.cache,
        )  # fmt: skip
        try:
            if options.dry_run:
                result = scheduler.run()
            else:
                with BuildReaper(self.reporter.message):
                    result = scheduler.run()
        finally:
            self.failed_deps.update(n for n in plan.order if n.failure is not None)
            if last is not None:
                last.close()
            if self.cache is not None and not options.dry_run:
                self.cache.end_build()
        self.last_result = result
        return result

    def store(self) -> StateStore:
        """The build state: a snapshot (in memory) when ``read_only``, else the database."""
        if self._store is None:
            if self.read_only:
                from kiln.state_snapshot import StateSnapshot

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

    def access_file_metadata(
        self, f: BuildFile, mutate: Callable[[BuildFileMetadata], bool] | None
    ) -> BuildFileMetadata:
        with self._metadata_lock:
            return self.store().file_metadata(f.key, mutate)

    # -- subprocesses --------------------------------------------------------

    def track(self, proc: subprocess.Popen[bytes], running: bool) -> None:
        """Note a subprocess started (or ended) by an action, to kill it on interrupt."""
        with self._subprocess_lock:
            if running:
                self._subprocesses.add(proc)
            else:
                self._subprocesses.discard(proc)

    def kill_subprocesses(self) -> None:
        with self._subprocess_lock:
            procs = list(self._subprocesses)
        for proc in procs:
            kill_group(proc.pid)
