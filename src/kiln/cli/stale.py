"""Files that earlier builds made and the build module no longer declares: an
action renamed or removed left them. A build names them; ``--prune`` removes them.

Only files kiln recorded as an action's outputs count, and ``--prune`` removes one
only when it is still what kiln wrote (its digest is the recorded one), a regular
file, on a path without a link: anything changed since is the user's and stays.
Nothing is judged while an entrypoint is broken: its files are then missing from
the graph without having been renamed.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from kiln.base.errors import NotRegularFile
from kiln.cli.requested import graph_outputs
from kiln.output_dir.writing import remove_quietly

_SHOWN = 5


def settle_stale(executor: Any, prune: bool, say: Callable[[str], None]) -> None:
    """Name (or, with ``prune``, remove) the outputs earlier builds left that no
    node of ``executor``'s graph declares now."""
    outputs = graph_outputs(executor)
    declared = {executor.relative_path(f) for f in outputs}
    root = str(executor.output_dir)
    left = {
        rel: digest
        for rel, digest in executor.store()
        .undeclared_outputs(declared, {f.key for f in outputs})
        .items()
        if os.path.lexists(os.path.join(root, rel))
    }
    if not left:
        return
    if not prune:
        say(
            f"kiln: {len(left)} file(s) that earlier builds made are no longer declared "
            f"(an action renamed or removed): {_shown(sorted(left))}; they stay: "
            "'kiln build --prune' removes them"
        )
        return
    kept = []
    for rel, digest in sorted(left.items()):
        path = os.path.join(root, rel)
        if not _still_kilns(executor, path, digest):
            kept.append(rel)
            continue
        remove_quietly(path)
    removed = len(left) - len(kept)
    say(f"kiln: removed {removed} file(s) that earlier builds made and no action declares now")
    if kept:
        say(
            f"kiln: kept {len(kept)} such file(s) changed since kiln wrote them, or behind "
            f"a link: {_shown(kept)}"
        )


def _still_kilns(executor: Any, path: str, digest: str) -> bool:
    """Whether ``path`` is a regular file, reached without a link, holding ``digest``."""
    if executor.layout.tree.dir_problem(os.path.dirname(path)) is not None:
        return False
    try:
        return bool(executor.store().digest(path, output=True) == digest)
    except (NotRegularFile, OSError):
        return False


def _shown(paths: list[str]) -> str:
    more = f" and {len(paths) - _SHOWN} more" if len(paths) > _SHOWN else ""
    return ", ".join(paths[:_SHOWN]) + more
