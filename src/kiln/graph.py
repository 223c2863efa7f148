"""The build graph: files, actions, contexts and entrypoints.

Nothing here does I/O beyond computing paths. Calling actions inside an
entrypoint declares nodes; the executor (``kiln.executor``) analyses and runs
them. Edges point from a consumer to what it needs: a file's ``deps`` hold the
action that produces it, an action's ``deps`` hold its input files, and a
context's ``deps`` hold the files it exports.
"""

from __future__ import annotations

import enum
import os
import posixpath
import time
from collections.abc import Callable, Collection, Iterable
from contextvars import ContextVar
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

from kiln.definition_site import DefinitionSite
from kiln.errors import BuildDefinitionError, DependenceException
from kiln.layout import (
    FileNamespace,
    OutputLayout,
    namespace_dir,
    platform_tag,
    source_view_path,
)
from kiln.meta import BuildFileMetadata, BuildMeta
from kiln.modnames import stable_module_name
from kiln.terminal import printable

if TYPE_CHECKING:
    from kiln.executor import Executor
    from kiln.graph_registry import GraphRegistry
    from kiln.result import NodeRun
    from kiln.run_context import RunContext

__all__ = [
    "KEYING_ONLY",
    "ActionConcurrency",
    "BuildAction",
    "BuildContext",
    "BuildDependency",
    "BuildEntrypoint",
    "BuildFile",
    "BuildFileMetadata",
    "BuildMeta",
    "DefinitionSite",
    "FileNamespace",
    "as_namespace",
    "join_namespace",
    "namespace_dir",
    "platform_tag",
]

_CURRENT_CONTEXT: ContextVar[BuildContext | None] = ContextVar("kiln_context", default=None)
# True while kiln makes thunks only to key them: paths are computed, nothing is created.
KEYING_ONLY: ContextVar[bool] = ContextVar("kiln_keying_only", default=False)


def as_namespace(namespace: Any) -> FileNamespace:
    """``namespace`` as kiln's ``FileNamespace``: a member of another enum of the same
    values (IREE's own ``iree.build.executor.FileNamespace``, imported by a library
    before kiln ran) is taken by its value."""
    if isinstance(namespace, FileNamespace):
        return namespace
    try:
        return FileNamespace(getattr(namespace, "value", namespace))
    except ValueError:
        names = ", ".join(f"FileNamespace.{n.name}" for n in FileNamespace)
        raise BuildDefinitionError(f"unknown file namespace {namespace!r}; use {names}") from None


def join_namespace(prefix: str, suffix: str) -> str:
    """Join two graph path components; the root context's path is empty."""
    return f"{prefix}/{suffix}" if prefix else suffix


class BuildDependency:
    """A node of the build graph. ``deps`` are the nodes it needs first.

    A node holds its definition only. What happened to it in a build is in that
    build's ``BuildResult``; ``start_time``, ``invoke_time``, ``finish_time`` and
    ``failure`` read the latest build's record (for reporters written for
    iree.build) and cannot be set.

    ``executor`` is the facade the node was declared with (kept for user code);
    kiln itself reaches the graph registry and the output layout it composes.
    """

    def __init__(self, *, executor: Executor, deps: Iterable[BuildDependency] | None = None):
        self.executor = executor
        self._graph: GraphRegistry = executor.graph
        self.deps: set[BuildDependency] = set(deps) if deps else set()

    @property
    def _metadata(self) -> dict[str, BuildMeta]:
        """``BuildMeta`` attached to this node, by key (made on first use: few nodes
        carry any, and a graph has many nodes)."""
        values = self.__dict__.get("_meta")
        if values is None:
            values = self.__dict__["_meta"] = {}
        return values

    @_metadata.setter
    def _metadata(self, values: dict[str, BuildMeta]) -> None:
        self.__dict__["_meta"] = values

    def _last_run(self) -> NodeRun | None:
        return self._graph.runs.get(self)

    @property
    def start_time(self) -> float | None:
        run = self._last_run()
        return run.start_time if run is not None else None

    @property
    def invoke_time(self) -> float | None:
        run = self._last_run()
        return run.invoke_time if run is not None else None

    @property
    def finish_time(self) -> float | None:
        run = self._last_run()
        return run.finish_time if run is not None else None

    @property
    def failure(self) -> BaseException | None:
        run = self._last_run()
        return run.failure if run is not None else None

    @property
    def is_dependence_failure(self) -> bool:
        return isinstance(self.failure, DependenceException)

    @property
    def execution_time(self) -> float:
        """Seconds from invocation to finish (or to now while running)."""
        invoked = self.invoke_time
        if invoked is None:
            return 0.0
        finished = self.finish_time
        return (finished if finished is not None else time.time()) - invoked


class BuildFile(BuildDependency):
    """A file of the build: produced by the action in ``deps``, or a source file.

    Invariant: ``path`` is normalised; it is relative, and stays inside its
    namespace, unless ``source`` is set: then the file lies outside the output
    directory, at ``source``, and ``path`` is its graph name (for a file named by
    an absolute path, as iree.build names it, that path). Such a file is an input
    kiln reads (a file, or a directory keyed by its tree); when an action claims it
    as an output (in its ``deps``), kiln runs that action but never owns the file:
    it never prepares, deletes or caches it.
    """

    def __init__(
        self,
        *,
        executor: Executor,
        path: str,
        namespace: FileNamespace = FileNamespace.GEN,
        deps: Iterable[BuildDependency] | None = None,
        source: Path | None = None,
    ):
        super().__init__(executor=executor, deps=deps)
        self.def_site = DefinitionSite.capture(self)
        self.path = path
        self.namespace = namespace
        self.source = source  # absolute path of a source-tree file, else None
        self._key = (
            f"src:{posixpath.relpath(source, self._graph.source_root)}"
            if source is not None
            else f"{namespace._value_}/{path}"  # ``value`` is a slower descriptor
        )
        self._fs_path: Path | None = source
        self._fs_str: str | None = None
        self._parent_made = False
        self._layout: OutputLayout = executor.layout
        self._run_context: RunContext = executor.run_context
        self._graph.register(path, self)

    @property
    def runfiles(self) -> set[BuildFile]:
        """Files that go with this one (as in iree.build); made on first use."""
        files = self.__dict__.get("_runfiles")
        if files is None:
            files = self.__dict__["_runfiles"] = set()
        return files

    @runfiles.setter
    def runfiles(self, files: set[BuildFile]) -> None:
        self.__dict__["_runfiles"] = files

    @property
    def layout(self) -> OutputLayout:
        """The layout of the output directory this file is built into."""
        return self._layout

    @property
    def key(self) -> str:
        """Stable identity in the state store and in keys: ``<namespace>/<path>``, or
        ``src:<path>`` with a source file's path relative to the graph's
        ``source_root`` (the build module's directory), so that keys, and the shared
        cache, do not depend on where the checkout lies."""
        return self._key

    @property
    def fs_path(self) -> Path:
        """Where the file lives on disk."""
        path = self._fs_path
        if path is None:
            path = self._fs_path = Path(self.fs_str)
        return path

    @property
    def fs_str(self) -> str:
        """``fs_path`` as a string, made without a Path object: up-to-date checks
        only stat it."""
        text = self._fs_str
        if text is None:
            root = self._layout.root(self.namespace)
            text = self._fs_str = str(self.source) if self.source else f"{root}/{self.path}"
        return text

    @property
    def action_path(self) -> str:
        """How the programs kiln runs for actions name this file: a path relative to
        the output directory, where they run, so that nothing they write depends on
        where the output directory or the checkout is. An output by its place
        there; a source file through kiln's link to it in ``.kiln/src``, by its path
        relative to the build module's directory (``source_view_path``)."""
        path = self.__dict__.get("_action_path")
        if path is None:
            if self.source is None:
                path = self._layout.relative_path(self)
            else:
                path = source_view_path(self._key[4:])
            self.__dict__["_action_path"] = path
        return path

    def get_fs_path(self) -> Path:
        """Where the file lives on disk, its parent directory created for writing."""
        path = self.fs_path
        if not self._parent_made and self.source is None and not KEYING_ONLY.get():
            self._layout.ensure_dir(path.parent)
            self._parent_made = True
        return path

    def access_metadata(
        self, mutation_callback: Callable[[BuildFileMetadata], bool] | None = None
    ) -> BuildFileMetadata:
        """Small persistent per-file metadata; the callback mutates it under a lock and
        returns True to persist the change."""
        return self._run_context.file_metadata(self, mutation_callback)

    def __repr__(self) -> str:
        return f"BuildFile[{self.namespace}]({self.path})"


class ActionConcurrency(enum.Enum):
    """Where an action runs: a worker thread, a worker process, or in-line."""

    THREAD = "thread"
    PROCESS = "process"
    NONE = "none"

    def __str__(self) -> str:
        return self.value


_BASE_ATTRS = frozenset(
    {
        "executor",
        "deps",
        "start_time",
        "invoke_time",
        "finish_time",
        "failure",
        "_metadata",
        "desc",
        "concurrency",
        "def_site",
        "timeout",
        "pool",
        "always_run",
        "exclusive",
        "cacheable",
        "reproducible",
    }
)


class BuildAction(BuildDependency):
    """Work that produces files. Override ``_invoke`` (runs in kiln's process) or
    ``_remotable_thunk`` (returns a picklable no-argument callable run in a worker).

    Class attributes a subclass may set: ``VERSION`` (bump to invalidate old
    results), ``key_exclude`` (names of attributes kept out of the key),
    ``always_run`` (never skipped, never cached), ``cacheable`` (False: its results
    never go into nor come from the shared cache), ``timeout`` (seconds), ``pool``
    (name of a resource pool bounding how many run at once: ``--pool NAME=N``),
    ``exclusive`` (with a pool: run alone in it, never beside another member),
    ``reproducible`` (False: its outputs are expected to differ from run to run or
    machine to machine, as a benchmark's timings do: ``--check-reproducible``
    skips it, and its results never leave this machine's cache).

    ``timeout`` holds for every THREAD and PROCESS action: a process is killed, a
    thread abandoned (it cannot be killed). An in-line (NONE) action runs on the
    scheduler's own thread, which kiln cannot abandon: a timeout on one is refused
    before the build starts, unless the action enforces it itself
    (``enforces_own_timeout``, as ``run_command`` does by killing its command).
    """

    VERSION: ClassVar[int] = 1
    # Attributes left out of the default params(): what cannot change the outputs.
    key_exclude: ClassVar[tuple[str, ...]] = ()
    always_run: bool = False
    cacheable: bool = True
    reproducible: bool = True
    timeout: float | None = None
    enforces_own_timeout: ClassVar[bool] = False
    pool: str | None = None
    exclusive: bool = False

    def __init__(
        self,
        *,
        desc: str,
        executor: Executor,
        concurrency: ActionConcurrency = ActionConcurrency.THREAD,
        deps: Iterable[BuildDependency] | None = None,
    ):
        super().__init__(executor=executor, deps=deps)
        self.desc = desc
        self.concurrency = concurrency
        self.def_site = DefinitionSite.capture(self)
        self._run_context: RunContext = executor.run_context

    @property
    def run_context(self) -> RunContext:
        """The reporter, the logs and the subprocess tracking of the build running
        this action."""
        return self._run_context

    def __str__(self) -> str:
        # How the action reads wherever kiln shows it: one line, no raw control.
        return printable(self.desc, one_line=True)

    def __repr__(self) -> str:
        return f"Action[{type(self).__name__}]('{self}')"

    @property
    def action_type(self) -> str:
        """The class's module and name (a build module's by its file's name: the
        same in every checkout)."""
        cls = type(self)
        return f"{stable_module_name(cls.__module__)}.{cls.__qualname__}"

    def params(self) -> dict[str, Any] | None:
        """The parameters that, with the inputs' contents and the action's code,
        decide the outputs. Return None to always run.

        The default takes every attribute the instance holds, except kiln's own,
        those named with a leading underscore and those the class lists in
        ``key_exclude``. Each value is put in canonical form (``kiln.canonical``);
        one that has none is a build-definition error, never silently left out.
        """
        if self.always_run:
            return None
        exclude = self.key_exclude
        out: dict[str, Any] = {"desc": self.desc}
        for name, value in vars(self).items():
            if name in _BASE_ATTRS or name[0] == "_" or name in exclude:
                continue
            out[name] = value
        return out

    def check_timeout(self) -> None:
        """Raise BuildDefinitionError unless ``timeout`` is None or a positive number
        that kiln can enforce for this action's concurrency."""
        if self.timeout is None:
            return
        if (
            isinstance(self.timeout, bool)
            or not isinstance(self.timeout, int | float)
            or not (self.timeout > 0)
        ):
            raise BuildDefinitionError(
                f"{self.def_site}: '{self.desc}': timeout must be a positive number of "
                f"seconds or None, got {self.timeout!r}"
            )
        if self.concurrency is ActionConcurrency.NONE and not self.enforces_own_timeout:
            raise BuildDefinitionError(
                f"{self.def_site}: '{self.desc}' is an in-line (ActionConcurrency.NONE) "
                f"action with a timeout of {self.timeout:g} s, which kiln cannot enforce: "
                "it runs on the scheduler's own thread; use ActionConcurrency.THREAD or "
                "PROCESS, or drop the timeout"
            )

    def check_runnable(self) -> None:
        """Raise BuildDefinitionError if this action cannot run as declared. Called
        before a build that needs it starts; listing the graph never calls it."""

    def _invoke(self) -> None:
        self._remotable_thunk()()

    def _remotable_thunk(self) -> Callable[[], None]:
        """A picklable no-argument callable that performs the action out of process."""
        raise NotImplementedError(f"Action '{self}' does not implement remotable invocation")


class BuildContext(BuildDependency):
    """A scope of the graph under construction; files allocated in it are named
    relative to its ``path``. ``BuildContext.current()`` is the innermost one
    entered (held in a ``ContextVar``)."""

    def __init__(self, path: str, executor: Executor):
        super().__init__(executor=executor)
        self.def_site = DefinitionSite.capture(self)
        self.path = path
        self._tokens: list[Any] = []
        self._graph.register(path, self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(path='{self.path}')"

    @property
    def registry(self) -> GraphRegistry:
        """The registry of the graph this context belongs to."""
        return self._graph

    def allocate_file(self, path: str, namespace: FileNamespace = FileNamespace.GEN) -> BuildFile:
        """Declare a new file named ``path`` relative to this context. An absolute
        path outside the output directory (as iree.build takes one) is a file there:
        an input, or the output of the action that claims it (``BuildFile``)."""
        namespace = as_namespace(namespace)
        if os.path.isabs(path):
            outside = self._outside(path)
            if outside is not None:
                return BuildFile(
                    executor=self.executor, path=outside, namespace=namespace, source=Path(outside)
                )
        rel = self._resolve_new_path(path, namespace)
        return BuildFile(executor=self.executor, path=rel, namespace=namespace)

    def _outside(self, path: str) -> str | None:
        """``path`` normalised, when it lies outside the output directory; else None."""
        normal = os.path.normpath(path)
        root = os.path.realpath(self._graph.layout.output_dir)
        real = os.path.realpath(normal)
        if real == root or real.startswith(root + os.sep):
            return None
        return normal

    def _resolve_new_path(self, path: str, namespace: FileNamespace) -> str:
        if os.path.isabs(path):
            root = self._graph.layout.root(namespace)
            try:
                path = Path(path).resolve().relative_to(root.resolve()).as_posix()
            except ValueError:
                raise BuildDefinitionError(
                    f"absolute path '{path}' is outside the output root {root} of "
                    f"namespace '{namespace}'; use a path relative to the context"
                ) from None
            joined = posixpath.normpath(path)
        else:
            joined = posixpath.normpath(join_namespace(self.path, path))
        if joined == ".." or joined.startswith("../") or joined in ("", "."):
            root = self._graph.layout.root(namespace)
            where = DefinitionSite.capture()
            raise BuildDefinitionError(
                f"path '{path}' (in '{self.path or '/'}', at {where}) leaves the "
                f"'{namespace}' output root {root}; output paths must stay inside it"
            )
        return joined

    def file(self, file: str | BuildFile) -> BuildFile:
        """The known file ``file``: a BuildFile, a path relative to this context, a
        graph path starting with ``/``, or an absolute path declared before; an
        absolute path of an existing file outside the output directory is an input."""
        if isinstance(file, BuildFile):
            return file
        if file.startswith("/"):
            declared = self._graph.all.get(os.path.normpath(file))
            if isinstance(declared, BuildFile):
                return declared
            path = posixpath.normpath(file.lstrip("/"))
            if not isinstance(self._graph.all.get(path), BuildFile) and os.path.lexists(file):
                outside = self._outside(file)
                if outside is not None:
                    return BuildFile(executor=self.executor, path=outside, source=Path(outside))
        else:
            path = posixpath.normpath(join_namespace(self.path, file))
        return self._graph.get_file(path)

    def files(self, files: str | BuildFile | Collection[str | BuildFile]) -> list[BuildFile]:
        """``file`` applied to one name or a collection of names."""
        if isinstance(files, str | BuildFile):
            return [self.file(files)]
        return [self.file(f) for f in files]

    @staticmethod
    def current() -> BuildContext:
        context = _CURRENT_CONTEXT.get()
        if context is None:
            raise BuildDefinitionError(
                "no active BuildContext: actions can only be declared inside an "
                "@entrypoint function while kiln analyses the build"
            )
        return context

    def __enter__(self) -> BuildContext:
        self._tokens.append(_CURRENT_CONTEXT.set(self))
        return self

    def __exit__(self, *exc: object) -> None:
        _CURRENT_CONTEXT.reset(self._tokens.pop())


class BuildEntrypoint(BuildContext):
    """The context of one called entrypoint; ``outputs`` are the files it returned."""

    def __init__(self, path: str, executor: Executor, entrypoint: Any):
        super().__init__(path, executor)
        self.entrypoint = entrypoint
        self.outputs: list[BuildFile] = []
