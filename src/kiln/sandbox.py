"""Where an action's files lie when it runs somewhere else than the output
directory: a Dask worker's sandbox (``kiln.remote_exec``) and the scratch
directory of ``--check-reproducible`` (``kiln.reproducible``).

Such a directory is laid out as the output directory: every file at the path the
action is given for it here (``BuildFile.action_path``, relative to the output
directory; a source file's in ``.kiln/src``), the action running in it. So the
action is given exactly the same paths as in the output directory, and whatever
it writes is the same bytes.
"""

from __future__ import annotations

import posixpath

from kiln.graph import BuildAction, BuildFile


def remotable(action: BuildAction) -> bool:
    """Whether ``action`` can say where its files are in a sandbox: a command
    (``_sandbox_command()``), or an action that makes its thunk for given paths
    (``_sandbox_thunk(path)``)."""
    return callable(getattr(action, "_sandbox_command", None)) or callable(
        getattr(action, "_sandbox_thunk", None)
    )


def sandbox_paths(
    action: BuildAction, inputs: list[BuildFile], outputs: list[BuildFile]
) -> dict[BuildFile, str]:
    """Where each file of ``action`` lies in its sandbox, relative to it: where it
    lies here relative to the output directory (``BuildFile.action_path``); a
    command's output where the command writes it (its temporary)."""
    paths = {f: posixpath.normpath(f.action_path) for f in [*inputs, *outputs]}
    command = getattr(action, "_sandbox_command", None)
    if callable(command):
        paths.update(command()[1])
    return paths
