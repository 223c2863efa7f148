"""Graph analysis: what the requested nodes need, in what order.

Everything here is O(nodes + edges): one iterative depth-first walk collects the
nodes, finds a cycle if there is one, and yields a topological order.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from operator import attrgetter

from kiln.base.errors import BuildDefinitionError
from kiln.base.gc_pause import gc_paused
from kiln.graph import BuildAction, BuildContext, BuildDependency, BuildFile


def node_name(node: BuildDependency) -> str:
    if isinstance(node, BuildFile):
        return node.path
    if isinstance(node, BuildContext):
        return node.path or "<root>"
    return str(node)


@dataclass
class Plan:
    """The subgraph needed by the ``requested`` nodes (entrypoints, files).

    Invariants: ``order`` is topological (every node after all its deps);
    ``consumers[n]`` lists the nodes whose ``deps`` contain ``n``; ``outputs[a]``
    are the files produced by action ``a``, ``inputs[a]`` the files it reads.
    """

    requested: list[BuildDependency]
    order: list[BuildDependency] = field(default_factory=list)
    consumers: dict[BuildDependency, list[BuildDependency]] = field(default_factory=dict)
    outputs: dict[BuildAction, list[BuildFile]] = field(default_factory=dict)
    inputs: dict[BuildAction, list[BuildFile]] = field(default_factory=dict)

    @property
    def actions(self) -> list[BuildAction]:
        return [n for n in self.order if isinstance(n, BuildAction)]


def make_plan(
    requested: Iterable[BuildDependency],
    files: Iterable[BuildFile],
    known: Collection[BuildDependency] = (),
) -> Plan:
    """Analyse the graph under the ``requested`` nodes; a cycle is a BuildDefinitionError.

    ``files`` are all files of the graph: an action's outputs are the files that
    depend on it, whether or not the requested nodes need them. Nodes in ``known`` (another
    plan's) are not walked again: they are left out of this plan, as are the nodes
    only they lead to.
    """
    with gc_paused():
        return _make_plan(requested, files, known)


def _make_plan(
    requested: Iterable[BuildDependency],
    files: Iterable[BuildFile],
    known: Collection[BuildDependency],
) -> Plan:
    plan = Plan([n for n in dict.fromkeys(requested) if n not in known])
    # A node is reached once it has an entry in ``consumers``; ``on_path`` holds the
    # nodes on the walk's stack (few, whatever the graph's size), so meeting one of
    # them again closes a cycle. One dict per node keeps the walk's memory traffic
    # low: on a graph larger than the CPU's caches, each lookup is a cache miss.
    consumers = plan.consumers
    order = plan.order
    on_path: set[BuildDependency] = set()
    for root in plan.requested:
        if root in consumers:
            continue
        consumers[root] = []
        on_path.add(root)
        stack: list[tuple[BuildDependency, list[BuildDependency]]] = [(root, list(root.deps))]
        while stack:
            node, pending = stack[-1]
            if not pending:
                stack.pop()
                on_path.discard(node)
                order.append(node)
                continue
            dep = pending.pop()
            users = consumers.get(dep)
            if users is None and known and dep in known:
                continue
            if users is None:
                consumers[dep] = [node]
                on_path.add(dep)
                stack.append((dep, list(dep.deps)))
            else:
                users.append(node)
                if dep in on_path:
                    raise BuildDefinitionError(_cycle_message([n for n, _ in stack], dep))
    _link_files(plan, files)
    return plan


def _link_files(plan: Plan, files: Iterable[BuildFile]) -> None:
    """Fill ``plan.inputs`` and ``plan.outputs``, each list sorted by file key."""
    by_key = attrgetter("_key")
    inputs, outputs = plan.inputs, plan.outputs
    for node in plan.order:
        if isinstance(node, BuildAction):
            read = [d for d in node.deps if isinstance(d, BuildFile)]
            if len(read) > 1:
                read.sort(key=by_key)
            inputs[node] = read
            outputs[node] = []
    for f in files:
        for producer in f.deps:
            produced = outputs.get(producer)  # type: ignore[call-overload]
            if produced is not None:
                produced.append(f)
    for produced in outputs.values():
        if len(produced) > 1:
            produced.sort(key=by_key)


def _cycle_message(path: list[BuildDependency], back_to: BuildDependency) -> str:
    start = path.index(back_to)
    # The walk goes from consumer to dependency; a cycle reads best as "needs".
    cycle = [*path[start:], back_to]
    names = " -> ".join(node_name(n) for n in cycle)
    return f"dependency cycle: {names} (each needs the next); break one of these edges"
