"""``kiln graph``: the targets' graph in Graphviz dot format on stdout."""

from __future__ import annotations

import json

from kiln.cli.invocation import Invocation
from kiln.cli.requested import resolve_targets
from kiln.graph import BuildAction
from kiln.plan import node_name


def run(inv: Invocation) -> int:
    executor = inv.executor
    plan = executor.plan(resolve_targets(executor, inv.ns.targets))
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
