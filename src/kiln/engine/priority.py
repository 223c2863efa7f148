"""Critical-path priorities: which ready action to start first.

When more actions are ready than can run, the one with the longest remaining
path (its own expected duration plus the longest chain of expected durations
of what consumes its outputs, down to the targets) starts first, so the chain
that bounds the build's wall time is never left waiting behind short work.
Expected durations come from past builds (``StateStore.durations``); an action
without history counts as the median of those with one, or as 1 when there is
no history at all, which makes the order longest-chain-first.
"""

from __future__ import annotations

from collections.abc import Mapping

from kiln.graph import BuildAction, BuildDependency
from kiln.planning.plan import Plan


def remaining_paths(
    plan: Plan, ids: Mapping[BuildAction, str], durations: Mapping[str, float]
) -> dict[BuildDependency, float]:
    """For every node of ``plan``, the expected length of the longest path from its
    start to the end of the build. O(nodes + edges)."""
    known = sorted(durations[i] for i in ids.values() if i in durations)
    default = known[len(known) // 2] if known else 1.0
    length: dict[BuildDependency, float] = {}
    consumers = plan.consumers
    for node in reversed(plan.order):  # every consumer comes before its dependencies
        below = max((length[c] for c in consumers[node]), default=0.0)
        if isinstance(node, BuildAction):
            below += durations.get(ids[node], default)
        length[node] = below
    return length
