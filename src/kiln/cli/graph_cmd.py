"""``kiln graph``: the targets' graph in Graphviz dot format on stdout."""

from __future__ import annotations

import json

from kiln.cli.main import Invocation
from kiln.cli.targets import resolve_targets
from kiln.graph import BuildAction, BuildFile
from kiln.plan import make_plan, node_name


def run(inv: Invocation) -> int:
    executor = inv.executor
    files = [n for n in executor.all.values() if isinstance(n, BuildFile)]
    plan = make_plan(resolve_targets(executor, inv.ns.targets), files)
    ids = {node: f"n{i}" for i, node in enumerate(plan.order)}
    lines = ["digraph kiln {", "  rankdir=LR;"]
    for node, nid in ids.items():
        shape = "box" if isinstance(node, BuildAction) else "ellipse"
        lines.append(f"  {nid} [label={json.dumps(node_name(node))}, shape={shape}];")
    for node, nid in ids.items():
        for dep in node.deps:
            lines.append(f"  {ids[dep]} -> {nid};")
    lines.append("}")
    print("\n".join(lines), file=inv.stdout)
    return 0
