"""Where an action's files lie when it runs somewhere else than the output
directory: a Dask worker's sandbox (``kiln.execution.cluster``) and the scratch
directory of ``--check-reproducible`` (``kiln.engine.reproducible``).

Such a directory is laid out as the output directory: every file at the path the
action is given for it here (``BuildFile.action_path``, relative to the output
directory; a source file's in ``.kiln/src``), the action running in it. So the
action is given exactly the same paths as in the output directory, and whatever
it writes is the same bytes.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from kiln.graph import BuildAction, BuildFile

# Where a file of the action lies in the sandbox, relative to it.
PathOf = Callable[[BuildFile], str]
Thunk = Callable[[], None]


@runtime_checkable
class RemotableCommand(Protocol):
    """An action that runs one command and can say how it runs in a sandbox
    (``CommandAction``): a Dask worker runs that command line there."""

    def sandbox_command(self) -> tuple[list[str], dict[BuildFile, str]]:
        """The command line, every path relative to the sandbox, and where the
        command writes each of its outputs (when not at its own path)."""
        ...


@runtime_checkable
class RemotableThunk(Protocol):
    """An action that runs a Python callable and can make it for given paths (the
    built-in ONNX, compile, verify and benchmark actions; any user action): a
    Dask worker runs the callable, pickled, in a sandbox."""

    def sandbox_thunk(self, path: PathOf) -> Thunk:
        """A picklable callable that does the action's work, reading and writing
        each file at ``path(file)``."""
        ...


@runtime_checkable
class _EarlierRemotableThunk(Protocol):
    """``RemotableThunk`` under the name kiln documented first; still honoured."""

    def _sandbox_thunk(self, path: PathOf) -> Thunk: ...


def sandbox_command(action: BuildAction) -> tuple[list[str], dict[BuildFile, str]] | None:
    """The command ``action`` runs in a sandbox, or None when it runs no command."""
    return action.sandbox_command() if isinstance(action, RemotableCommand) else None


def sandbox_thunk(action: BuildAction, path: PathOf) -> Thunk | None:
    """The callable ``action`` runs in a sandbox, or None when it makes none."""
    if isinstance(action, RemotableThunk):
        return action.sandbox_thunk(path)
    if isinstance(action, _EarlierRemotableThunk):
        return action._sandbox_thunk(path)
    return None


def remotable(action: BuildAction) -> bool:
    """Whether ``action`` can say where its files are in a sandbox: a
    ``RemotableCommand`` or a ``RemotableThunk``."""
    return isinstance(action, RemotableCommand | RemotableThunk | _EarlierRemotableThunk)


def runs_in_output_dir(action: BuildAction, named_relative: bool = False) -> bool:
    """Whether the PROCESS ``action`` runs in the output directory (a sandbox
    elsewhere) rather than in the directory the build runs from. An action that
    names its files relative to where it runs (``BuildFile.action_path``) needs the
    output directory: kiln's own, a ``RemotableThunk``, one that says so
    (``BuildAction.relative_paths``), or one whose thunk asked for an
    ``action_path`` while it was made (``named_relative``). Any other is
    iree.build's kind: its files are absolute (``get_fs_path()``), and a relative
    path of its own (an export writing ``model.mlir``) means, as under iree.build,
    where its worker process runs: the directory the build was started in."""
    return (
        action.relative_paths
        or named_relative
        or isinstance(action, RemotableThunk | _EarlierRemotableThunk)
    )


def sandbox_paths(
    action: BuildAction, inputs: list[BuildFile], outputs: list[BuildFile]
) -> dict[BuildFile, str]:
    """Where each file of ``action`` lies in its sandbox, relative to it: where it
    lies here relative to the output directory (``BuildFile.action_path``); a
    command's output where the command writes it (its temporary)."""
    paths = {f: posixpath.normpath(f.action_path) for f in [*inputs, *outputs]}
    command = sandbox_command(action)
    if command is not None:
        paths.update(command[1])
    return paths
