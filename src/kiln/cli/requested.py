"""Turning the command line's TARGET words into graph nodes."""

from __future__ import annotations

import difflib
import os
from pathlib import Path

from kiln.base.errors import UsageError
from kiln.engine.result import BuildResult
from kiln.executor import Executor
from kiln.graph import BuildAction, BuildDependency, BuildEntrypoint, BuildFile


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


def check_compile_targets(executor: Executor, actions: list[BuildAction]) -> None:
    """A ``--target`` that no compile among ``actions`` compiles for is a usage error
    (``kiln.actions.compile_target_use``), spelled as this module's command line spells it;
    compiles that fix targets leaving out one asked for are named in a warning."""
    if not actions:
        return
    from kiln.actions.compile_target_use import check_compile_targets_used

    module_flags = {
        d.flag
        for ep in executor.entrypoints
        for d in getattr(getattr(ep, "entrypoint", None), "cl_arg_defs", ())
    }
    flag = "--kiln-target" if "--target" in module_flags else "--target"
    warning = check_compile_targets_used(actions, flag)
    if warning is not None:
        executor.reporter.message(warning)


def output_paths(
    requested: list[BuildDependency], result: BuildResult, output_dir: Path | None = None
) -> list[str]:
    """The files the build that gave ``result`` hands to the user: those of the
    ``requested`` nodes that did not fail, nor were skipped (``BuildResult.absent``). An
    output is shown under ``output_dir`` as the user gave it (a relative one gives
    relative paths, as iree.build prints them), else by its absolute path."""
    files: list[BuildFile] = []
    for node in requested:
        if result.failure(node) is not None:
            continue
        if isinstance(node, BuildEntrypoint):
            files += node.outputs
        elif isinstance(node, BuildFile):
            files.append(node)
    skipped = set(result.absent)  # their device is absent: no file to hand out
    files = [f for f in files if not any(d in skipped for d in f.deps)]
    return [_shown(f, output_dir) for f in files]


def _shown(f: BuildFile, output_dir: Path | None) -> str:
    if output_dir is None or f.source is not None:
        return str(f.fs_path)
    return os.path.join(output_dir, f.layout.relative_path(f))


def graph_outputs(executor: Executor, produced: bool = False) -> list[BuildFile]:
    """The files of ``executor``'s graph that lie in the output directory (with
    ``produced``: only those an action writes, not a file placed there by hand)."""
    return [
        node
        for node in executor.all.values()
        if isinstance(node, BuildFile)
        and node.source is None
        and (not produced or any(isinstance(d, BuildAction) for d in node.deps))
    ]
