"""``kiln graph``: the targets' graph in Graphviz dot format on stdout.

kiln writes the text itself; rendering it takes Graphviz's ``dot`` (``kiln graph
m.py | dot -Tsvg > graph.svg``), which kiln names on stderr when it is missing.
"""

from __future__ import annotations

import shutil

from kiln.cli.invocation import Invocation
from kiln.cli.requested import resolve_targets
from kiln.graph import BuildAction
from kiln.planning.plan import node_name


def run(inv: Invocation) -> int:
    executor = inv.executor
    plan = executor.plan(resolve_targets(executor, inv.ns.targets))
    ids = {node: f"n{i}" for i, node in enumerate(plan.order)}
    lines = ["digraph kiln {", "  rankdir=LR;"]
    for node, nid in ids.items():
        shape = "box" if isinstance(node, BuildAction) else "ellipse"
        lines.append(f"  {nid} [label={dot_string(node_name(node))}, shape={shape}];")
    for node, nid in ids.items():
        for dep in node.deps:
            lines.append(f"  {ids[dep]} -> {nid};")
    lines.append("}")
    print("\n".join(lines), file=inv.stdout)
    if shutil.which("dot") is None:
        print(
            "kiln: note: this is Graphviz dot text; Graphviz's dot, which draws it "
            "(kiln graph ... | dot -Tsvg > graph.svg), is not installed here "
            "(apt-get install graphviz, brew install graphviz)",
            file=inv.stderr,
        )
    return 0


def dot_string(text: str) -> str:
    """``text`` as a DOT quoted string that Graphviz reads back as ``text``: the
    characters as they are (DOT files are UTF-8; a JSON ``\\uXXXX`` escape would be
    drawn literally), a backslash and a quote escaped, a line break as DOT's
    centred line break. Other control characters are escaped by kiln's output."""
    escaped = text.replace("\\", "\\\\").replace('"', '\\"')
    return '"' + escaped.replace("\r\n", "\\n").replace("\n", "\\n").replace("\r", "\\n") + '"'
