"""Contexts: the scopes of a graph under construction (``BuildContext``, entered
while an entrypoint declares its nodes; ``BuildEntrypoint``, one per called
entrypoint), and the names they give files."""

from __future__ import annotations

import os
import posixpath
from collections.abc import Collection
from contextvars import ContextVar
from pathlib import Path
from typing import Any

from kiln.base.errors import BuildDefinitionError
from kiln.graph.definition_site import DefinitionSite
from kiln.graph.host import GraphHost, NodeRegistry
from kiln.graph.nodes import BuildDependency, BuildFile, as_namespace, join_namespace
from kiln.output_dir.layout import FileNamespace

_CURRENT_CONTEXT: ContextVar[BuildContext | None] = ContextVar("kiln_context", default=None)


class BuildContext(BuildDependency):
    """A scope of the graph under construction; files allocated in it are named
    relative to its ``path``. ``BuildContext.current()`` is the innermost one
    entered (held in a ``ContextVar``)."""

    def __init__(self, path: str, executor: GraphHost, site: DefinitionSite | None = None):
        super().__init__(executor=executor)
        self.def_site = site or DefinitionSite.capture(self)
        self.path = path
        self._tokens: list[Any] = []
        self._graph.register(path, self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(path='{self.path}')"

    @property
    def registry(self) -> NodeRegistry:
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
        found: BuildFile = self._graph.get_file(path)
        return found

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

    def __init__(self, path: str, executor: GraphHost, entrypoint: Any):
        # Its site is the entrypoint's ``def``: kiln calls it, no line of the user's does.
        super().__init__(path, executor, DefinitionSite.of_function(entrypoint))
        self.entrypoint = entrypoint
        self.outputs: list[BuildFile] = []
