"""What the nodes of a build graph reach outside the graph, as interfaces.

The graph model holds definitions only and imports nothing of running a build:
a node keeps the ``GraphHost`` it was declared with (``kiln.executor.Executor``
is one), and reaches through it the registry of its graph (``NodeRegistry``:
``kiln.graph.registry.GraphRegistry``), the layout of its output directory, and,
for an action, the services of the build that runs it (``RunServices``:
``kiln.execution.run_context.RunContext``). What happened to a node in a build is a
``RunRecord`` (``kiln.engine.result.NodeRun``) that the registry's ``runs`` show.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from kiln.base.action_env import ActionEnvironment
from kiln.devices.identity import DeviceSet
from kiln.graph.meta import BuildFileMetadata
from kiln.output_dir.layout import LaidOut, OutputLayout

# The nodes of a graph (``kiln.graph.nodes``, ``kiln.graph.context``) are named
# ``Any`` here: they are defined above this module, which must not import them.
Node = Any


class KeyedFile(LaidOut, Protocol):
    """A file of the graph as the run services take it (``kiln.graph.BuildFile``)."""

    @property
    def key(self) -> str: ...


class RunRecord(Protocol):
    """What happened to one node in one build (wall-clock times)."""

    @property
    def start_time(self) -> float | None: ...
    @property
    def invoke_time(self) -> float | None: ...
    @property
    def finish_time(self) -> float | None: ...
    @property
    def failure(self) -> BaseException | None: ...


class RunView(Protocol):
    """The latest run of each node, across the builds of one graph."""

    def get(self, node: Node) -> RunRecord | None: ...


class NodeRegistry(Protocol):
    """Every node of one graph by its path (``kiln.graph.registry.GraphRegistry``)."""

    @property
    def all(self) -> dict[str, Node]: ...
    @property
    def entrypoints(self) -> list[Node]: ...
    @property
    def actions(self) -> list[Node]: ...
    @property
    def source_root(self) -> str: ...
    @property
    def layout(self) -> OutputLayout: ...
    @property
    def runs(self) -> RunView: ...

    def register(self, path: str, node: Node) -> None: ...
    def add_entrypoint(self, bep: Node) -> None: ...
    def add_action(self, action: Node) -> None: ...
    def get_context(self, path: str) -> Node: ...
    def get_file(self, path: str) -> Node: ...
    def files(self) -> list[Node]: ...


class CommandStarter(Protocol):
    """Starts an action's command without a thread (``kiln.execution.process.CommandRunner``)."""

    def spawn(
        self,
        argv: list[str],
        *,
        env: Sequence[bytes],
        path: str,
        cwd: str,
        log_fd: int,
        tag: str,
        timeout: float | None,
        on_exit: Callable[[Any], None],
    ) -> int: ...


class Spools(Protocol):
    """The files commands print into while they run (``kiln.execution.command_logs.LogSpools``)."""

    def take(self) -> int: ...
    def give(self, spool: int) -> None: ...
    def settle(
        self,
        spool: int,
        log: Callable[[], str],
        header: Callable[[], str],
        old_log: Callable[[], str | None],
    ) -> str | None: ...


class RunServices(Protocol):
    """What a running action reaches besides its own definition
    (``kiln.execution.run_context.RunContext``)."""

    layout: OutputLayout
    environment: ActionEnvironment
    devices: DeviceSet  # where its device-bound actions run (``kiln.devices.identity``)

    @property
    def work_dir(self) -> str: ...
    @property
    def commands(self) -> CommandStarter: ...
    @property
    def spools(self) -> Spools: ...
    def log_path(self, f: LaidOut) -> str: ...
    def old_log(self, f: LaidOut) -> str | None: ...
    def write_status(self, message: str) -> None: ...
    def progress(self, action: Node, done: int, total: int | None) -> None: ...
    def track(self, proc: subprocess.Popen[bytes], running: bool) -> None: ...
    def process_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]: ...
    def command_env(self, extra: Mapping[str, str] | None = None) -> tuple[list[bytes], str]: ...
    def file_metadata(
        self, f: KeyedFile, mutate: Callable[[BuildFileMetadata], bool] | None
    ) -> BuildFileMetadata: ...


class GraphHost(Protocol):
    """What a node is declared with (``kiln.executor.Executor``, iree.build's
    ``executor``): the graph's registry, the output layout, the run services."""

    @property
    def graph(self) -> NodeRegistry: ...
    @property
    def layout(self) -> OutputLayout: ...
    @property
    def run_context(self) -> RunServices: ...
    @property
    def read_only(self) -> bool:
        """True for the commands that must write nothing (list, graph, explain,
        ``--dry-run``)."""
        ...
