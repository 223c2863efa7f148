"""Turning the command line's TARGET words into graph nodes."""

from __future__ import annotations

import difflib

from kiln.errors import UsageError
from kiln.executor import Executor
from kiln.graph import BuildDependency, BuildEntrypoint, BuildFile
from kiln.result import BuildResult


def resolve_targets(executor: Executor, names: list[str]) -> list[BuildDependency]:
    """Entrypoint names or graph paths; none means every top-level entrypoint."""
    if not names:
        return [ep for ep in executor.entrypoints if "/" not in ep.path]
    found: list[BuildDependency] = []
    for name in names:
        if not name.strip().strip("/"):
            raise UsageError(
                f"empty target {name!r}: give an entrypoint name or a file path "
                "(see 'kiln list --all')"
            )
        node = executor.all.get(name.strip("/"))
        if node is None:
            known = [p for p in executor.all if p]
            close = difflib.get_close_matches(name, known, n=5, cutoff=0.5)
            hint = f"; did you mean: {', '.join(close)}?" if close else "; see 'kiln list --all'"
            raise UsageError(f"unknown target '{name}'{hint}")
        found.append(node)
    return list(dict.fromkeys(found))  # a target named twice is built and printed once


def output_paths(targets: list[BuildDependency], result: BuildResult) -> list[str]:
    """The files the build that gave ``result`` hands to the user: those of the
    ``targets`` that did not fail."""
    paths: list[str] = []
    for t in targets:
        if result.failure(t) is not None:
            continue
        if isinstance(t, BuildEntrypoint):
            paths += [str(f.fs_path) for f in t.outputs]
        elif isinstance(t, BuildFile):
            paths.append(str(t.fs_path))
    return paths
