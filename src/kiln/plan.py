"""Graph analysis: what the requested targets need, in what order.

Everything here is O(nodes + edges): one iterative depth-first walk collects the
nodes, finds a cycle if there is one, and yields a topological order.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from kiln._gc import gc_paused
from kiln.errors import BuildDefinitionError
from kiln.graph import BuildAction, BuildContext, BuildDependency, BuildFile

_WHITE, _GREY, _BLACK = 0, 1, 2


def node_name(node: BuildDependency) -> str:
    if isinstance(node, BuildFile):
        return node.path
    if isinstance(node, BuildContext):
        return node.path or "<root>"
    return str(node)


@dataclass
class Plan:
    """The subgraph needed by some targets.

    Invariants: ``order`` is topological (every node after all its deps);
    ``consumers[n]`` lists the nodes whose ``deps`` contain ``n``; ``outputs[a]``
    are the files produced by action ``a``, ``inputs[a]`` the files it reads.
    """

    targets: list[BuildDependency]
    order: list[BuildDependency] = field(default_factory=list)
    consumers: dict[BuildDependency, list[BuildDependency]] = field(default_factory=dict)
    outputs: dict[BuildAction, list[BuildFile]] = field(default_factory=dict)
    inputs: dict[BuildAction, list[BuildFile]] = field(default_factory=dict)

    @property
    def actions(self) -> list[BuildAction]:
        return [n for n in self.order if isinstance(n, BuildAction)]


def make_plan(targets: Iterable[BuildDependency], files: Iterable[BuildFile]) -> Plan:
    """Analyse the graph under ``targets``; a cycle is a BuildDefinitionError.

    ``files`` are all files of the graph: an action's outputs are the files that
    depend on it, whether or not the targets need them.
    """
    with gc_paused():
        return _make_plan(targets, files)


def _make_plan(targets: Iterable[BuildDependency], files: Iterable[BuildFile]) -> Plan:
    plan = Plan(list(dict.fromkeys(targets)))
    color: dict[BuildDependency, int] = {}
    consumers = plan.consumers
    order = plan.order
    for root in plan.targets:
        if color.get(root, _WHITE) != _WHITE:
            continue
        color[root] = _GREY
        consumers.setdefault(root, [])
        stack: list[tuple[BuildDependency, list[BuildDependency]]] = [(root, list(root.deps))]
        while stack:
            node, pending = stack[-1]
            if not pending:
                stack.pop()
                color[node] = _BLACK
                order.append(node)
                continue
            dep = pending.pop()
            consumers.setdefault(dep, []).append(node)
            state = color.get(dep, _WHITE)
            if state == _GREY:
                raise BuildDefinitionError(_cycle_message([n for n, _ in stack], dep))
            if state == _WHITE:
                color[dep] = _GREY
                stack.append((dep, list(dep.deps)))
    outputs = plan.outputs
    for node in order:
        if isinstance(node, BuildAction):
            plan.inputs[node] = sorted(
                (d for d in node.deps if isinstance(d, BuildFile)), key=lambda f: f.key
            )
            outputs[node] = []
    for f in files:
        for producer in f.deps:
            if producer in outputs:
                outputs[producer].append(f)
    for produced in outputs.values():
        produced.sort(key=lambda f: f.key)
    return plan


def _cycle_message(path: list[BuildDependency], back_to: BuildDependency) -> str:
    start = path.index(back_to)
    # The walk goes from consumer to dependency; a cycle reads best as "needs".
    cycle = [*path[start:], back_to]
    names = " -> ".join(node_name(n) for n in cycle)
    return f"dependency cycle: {names} (each needs the next); break one of these edges"
