"""``kiln list``: the entrypoints, or with ``--all`` every file and action.

``--bare`` prints graph paths alone, one a line, as iree.build's ``--list`` and
``--list-all`` do, for scripts that read the listing.
"""

from __future__ import annotations

import json
from typing import Any

from kiln.base.errors import UsageError
from kiln.cli.invocation import Invocation
from kiln.graph import BuildAction, BuildFile


def run(inv: Invocation) -> int:
    if inv.ns.targets:
        words = " ".join(repr(t) for t in inv.ns.targets)
        raise UsageError(
            f"kiln list takes no TARGET (got {words}): it lists every entrypoint; to see "
            "what a target builds, use 'kiln explain MODULE TARGET' or 'kiln graph MODULE TARGET'"
        )
    executor = inv.executor
    if inv.ns.json:
        print(json.dumps(_listing(executor, inv.ns.all), indent=2), file=inv.stdout)
        return 0
    if inv.ns.bare:
        paths = [ep.path for ep in executor.entrypoints] if not inv.ns.all else executor.all
        for path in paths:
            if path:
                print(path, file=inv.stdout)
        return 0
    if not inv.ns.all:
        for ep in executor.entrypoints:
            desc = ep.entrypoint.description
            print(f"{ep.path}  {desc}".rstrip() if desc else ep.path, file=inv.stdout)
        return 0
    actions: dict[BuildAction, None] = {}
    for path, node in sorted(executor.all.items()):
        if not path or node is None:  # None: a module took the path back (``all[p] = None``)
            continue
        kind = "file" if isinstance(node, BuildFile) else "context"
        print(f"{kind:8} {path}", file=inv.stdout)
        for dep in node.deps:
            if isinstance(dep, BuildAction):
                actions[dep] = None
    for action in actions:
        print(f"action   {action}", file=inv.stdout)
    return 0


def _listing(executor: Any, everything: bool) -> dict[str, Any]:
    """``--json``: the entrypoints, and with ``--all`` every file and action."""
    doc: dict[str, Any] = {
        "entrypoints": [
            {"name": ep.path, "description": ep.entrypoint.description or ""}
            for ep in executor.entrypoints
        ]
    }
    if not everything:
        return doc
    files: list[dict[str, Any]] = []
    actions: dict[BuildAction, list[str]] = {}
    for path, node in sorted(executor.all.items()):
        if not path or node is None:
            continue
        if isinstance(node, BuildFile):
            files.append({"path": path, "source": node.source is not None})
        for dep in node.deps:
            if isinstance(dep, BuildAction):
                outputs = actions.setdefault(dep, [])
                if isinstance(node, BuildFile):
                    outputs.append(path)
    doc["files"] = files
    doc["actions"] = [
        {
            "description": a.desc,
            "type": a.action_type,
            "outputs": outputs,
            "inputs": sorted(d.path for d in a.deps if isinstance(d, BuildFile)),
            "defined_at": str(a.def_site),
        }
        for a, outputs in actions.items()
    ]
    return doc
