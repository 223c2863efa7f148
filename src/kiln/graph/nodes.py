"""The nodes of a build graph: ``BuildDependency`` (any node) and ``BuildFile``.

Nothing here does I/O beyond computing paths (and, for a file an action is about
to write, making its directory). Edges point from a consumer to what it needs: a
file's ``deps`` hold the action that produces it, an action's ``deps`` its input
files, a context's ``deps`` the files it exports.
"""

from __future__ import annotations

import posixpath
import time
from collections.abc import Callable, Iterable
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from kiln.base.errors import BuildDefinitionError, DependenceException
from kiln.graph.definition_site import DefinitionSite
from kiln.graph.host import GraphHost, NodeRegistry, RunRecord, RunServices
from kiln.graph.meta import BuildFileMetadata, BuildMeta
from kiln.output_dir.layout import FileNamespace, OutputLayout, source_view_path

# True while kiln makes thunks only to key them: paths are computed, nothing is created.
KEYING_ONLY: ContextVar[bool] = ContextVar("kiln_keying_only", default=False)
# While kiln makes an action's thunk: the files whose ``action_path`` it asked for
# (a thunk that names files relative to the output directory must run there).
NAMED_RELATIVE: ContextVar[list[BuildFile] | None] = ContextVar("kiln_named_relative", default=None)


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

    def __init__(self, *, executor: GraphHost, deps: Iterable[BuildDependency] | None = None):
        self.executor = executor
        self._graph: NodeRegistry = executor.graph
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

    def _last_run(self) -> RunRecord | None:
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
        executor: GraphHost,
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
        self._run_context: RunServices = executor.run_context
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
        asked = NAMED_RELATIVE.get()
        if asked is not None:
            asked.append(self)
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
