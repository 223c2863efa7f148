"""What an entrypoint declared but does not lead to: the actions its return value
does not reach (they would never run), and the outputs it hands out that nothing
produces (kiln would print the path of a file it never built).

A build runs what the requested entrypoints return and what that needs, as
iree.build does; these checks make the rest visible instead of silently skipped.
"""

from __future__ import annotations

from collections.abc import Iterable

from kiln.graph.action import BuildAction
from kiln.graph.context import BuildEntrypoint
from kiln.graph.nodes import BuildDependency, BuildFile


def reachable(roots: Iterable[BuildDependency]) -> set[BuildDependency]:
    """Every node ``roots`` depend on, the roots included (iterative: a long chain
    must not reach the recursion limit)."""
    seen: set[BuildDependency] = set()
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(node.deps)
    return seen


def unreturned_actions(
    declared: Iterable[BuildDependency], entrypoints: Iterable[BuildEntrypoint]
) -> list[BuildAction]:
    """The actions among ``declared`` that no entrypoint of ``entrypoints`` reaches
    through what it returned (an entrypoint may use another's files), in order."""
    reached = reachable(entrypoints)
    return [n for n in declared if isinstance(n, BuildAction) and n not in reached]


def unproduced_outputs(entrypoint: BuildEntrypoint) -> list[BuildFile]:
    """The files in the output directory that ``entrypoint`` returns though no
    action produces them (a file placed there by hand, which a builder written for
    iree.build may hand out, is the caller's to tell apart: this reads no file)."""
    found = [
        f
        for f in entrypoint.outputs
        if f.source is None and not any(isinstance(d, BuildAction) for d in f.deps)
    ]
    return sorted(found, key=lambda f: f.path)
