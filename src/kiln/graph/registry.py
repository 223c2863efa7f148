"""The registry of one build graph: every node by its graph path, the called
entrypoints, the output names already taken, and close-match suggestions for a
path that is not there.

Nodes register themselves here when they are made; the executor, the command
line and the actions look nodes up here.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Mapping

from kiln.base.errors import BuildDefinitionError
from kiln.graph.context import BuildContext, BuildEntrypoint
from kiln.graph.host import RunRecord
from kiln.graph.nodes import BuildDependency, BuildFile
from kiln.output_dir.layout import OutputLayout
from kiln.output_dir.names import OutputNames

# A mark to roll back to: (nodes, entrypoints, output names, actions).
Checkpoint = tuple[int, int, int, int]


class GraphRegistry:
    """The nodes of one graph, by path.

    Invariants: ``all`` maps every graph path to the single file or context defined
    there (the root context has the empty path); ``entrypoints`` lists the called
    entrypoints in call order; ``actions`` every action declared, in order (an
    action has no path of its own); every output file's place under the output
    directory is in ``_names``, which refuses two outputs at one place (or one
    under another).
    """

    def __init__(self, layout: OutputLayout) -> None:
        self.layout = layout
        self.all: dict[str, BuildContext | BuildFile] = {}
        self.entrypoints: list[BuildEntrypoint] = []
        self.actions: list[BuildDependency] = []
        self.runs = RunLog()
        # What source files' keys are relative to: the build module's directory
        # (the command line sets it), else the working directory.
        self.source_root = os.getcwd()
        self._names = OutputNames(str(layout.output_dir))

    def register(self, path: str, node: BuildContext | BuildFile) -> None:
        """Add ``node`` at ``path``; a path defined twice is a definition error."""
        existing = self.all.get(path)
        if existing is not None:
            raise BuildDefinitionError(
                f"duplicate path '{path}': defined at {node.def_site} and already at "
                f"{existing.def_site}; give one of them another name"
            )
        if isinstance(node, BuildFile) and node.source is None:
            self._names.add(self.layout.relative_path(node), node.def_site)
        self.all[path] = node

    def add_entrypoint(self, bep: BuildEntrypoint) -> None:
        self.entrypoints.append(bep)

    def add_action(self, action: BuildDependency) -> None:
        self.actions.append(action)

    def checkpoint(self) -> Checkpoint:
        """A mark to ``rollback`` to: undoes what an entrypoint that failed declared."""
        return len(self.all), len(self.entrypoints), self._names.mark(), len(self.actions)

    def rollback(self, mark: Checkpoint) -> None:
        for path in list(self.all)[mark[0] :]:
            del self.all[path]
        del self.entrypoints[mark[1] :]
        del self.actions[mark[3] :]
        self._names.undo(mark[2])

    def get_context(self, path: str) -> BuildContext:
        node = self.all.get(path)
        if not isinstance(node, BuildContext):
            raise BuildDefinitionError(f"no build context '{path}'{self.suggest(path)}")
        return node

    def get_file(self, path: str) -> BuildFile:
        node = self.all.get(path)
        if not isinstance(node, BuildFile):
            raise BuildDefinitionError(
                f"file '{path}' is not known in the build graph{self.suggest(path, files=True)}"
            )
        return node

    def files(self) -> list[BuildFile]:
        return [n for n in self.all.values() if isinstance(n, BuildFile)]

    def suggest(self, path: str, files: bool = False) -> str:
        """``; did you mean: ...?`` naming the paths close to ``path``, or nothing."""
        names = [p for p, n in self.all.items() if p and (not files or isinstance(n, BuildFile))]
        close = difflib.get_close_matches(path, names, n=5, cutoff=0.5)
        return f"; did you mean: {', '.join(close)}?" if close else ""


class RunLog:
    """The latest run of each node of one graph, across its builds: the read-only
    view behind ``dep.failure``, ``dep.start_time``, ... that reporters written for
    iree.build read.

    Invariant: a node of the current build is looked up in its runs only, so a
    failure of an earlier build never shows on a node the current one planned.
    """

    def __init__(self) -> None:
        self._current: Mapping[BuildDependency, RunRecord] = {}
        self._past: dict[BuildDependency, RunRecord] = {}

    def begin(self, runs: Mapping[BuildDependency, RunRecord]) -> None:
        """A build starts that writes into ``runs`` (holding every node it plans)."""
        self._past.update(self._current)
        self._current = runs

    def get(self, node: BuildDependency) -> RunRecord | None:
        run = self._current.get(node)
        return run if run is not None else self._past.get(node)
