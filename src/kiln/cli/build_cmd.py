"""``kiln build``: build targets, print their outputs on stdout, summarise on stderr."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from kiln.base.errors import UsageError
from kiln.base.events import EventReader
from kiln.base.terminal import user_streams
from kiln.cli.destinations import check_destinations
from kiln.cli.executor_options import build_devices, open_remote
from kiln.cli.invocation import Invocation
from kiln.cli.options import DEFAULT_OUTPUT_DIR
from kiln.cli.requested import (
    check_compile_targets,
    graph_outputs,
    output_paths,
    resolve_targets,
)
from kiln.cli.stale import settle_stale
from kiln.engine.request import SchedulerOptions
from kiln.engine.result import BuildResult
from kiln.graph import BuildDependency, BuildFile
from kiln.observe.event_log import EventLog, TraceFile
from kiln.observe.summary import format_root_causes, format_success, format_summary
from kiln.output_dir.ownership import check_takeover


def check_event_files(inv: Invocation) -> None:
    """``--events`` and ``--profile`` name each a regular file or a new one, none of
    kiln's own (in ``.kiln/`` or the cache, the manifest, the build's files), none
    the build reads (the module, its sources, the pyproject.toml of its settings),
    not both the same one (``check_destinations``; before the lock, so that a refused
    build writes nothing)."""
    executor = inv.executor
    cache = inv.request.cache.local.root if inv.request.cache is not None else None
    named = [
        (f"--{option}", path)
        for option in ("events", "profile")
        if (path := getattr(inv.ns, option, None)) is not None
    ]
    if not named:
        return

    def declared() -> list[str]:
        return [executor.relative_path(f) for f in graph_outputs(executor)]

    def inputs() -> list[str | Path]:
        sources: list[str | Path] = [inv.module_file] if inv.module_file else []
        if getattr(inv.ns, "project_file", None) is not None:
            sources.append(inv.ns.project_file)
        for node in executor.all.values():
            if isinstance(node, BuildFile) and node.source is not None:
                sources.append(node.source)
        return sources

    check_destinations(
        named,
        executor.output_dir,
        cache_dir=cache,
        declared=declared,
        inputs=inputs,
        warn=executor.reporter.message,
    )


@contextlib.contextmanager
def event_readers(inv: Invocation) -> Iterator[tuple[EventReader, ...]]:
    """``--events`` and ``--profile``: readers of this build's events; the event log
    is closed after the build."""
    ns = inv.ns
    readers: list[EventReader] = []
    if getattr(ns, "profile", None) is not None:
        readers.append(TraceFile(ns.profile, inv.executor.reporter.message))
    log = EventLog.open(ns.events) if getattr(ns, "events", None) is not None else None
    if log is not None:
        readers.append(log)
    try:
        yield tuple(readers)
    finally:
        if log is not None:
            log.close()


def check_mp_context() -> None:
    """``IREE_BUILD_MP_CONTEXT``, iree.build's choice of multiprocessing start method,
    is accepted when it names one (kiln's workers are always forked from a clean
    template, which isolates actions as ``spawn`` does); another value is an error,
    as it is for iree.build."""
    value = os.environ.get("IREE_BUILD_MP_CONTEXT")
    if value is None:
        return
    import multiprocessing  # its import costs a start ~10 ms: only when asked

    if value not in multiprocessing.get_all_start_methods():
        methods = ", ".join(multiprocessing.get_all_start_methods())
        raise UsageError(f"IREE_BUILD_MP_CONTEXT={value!r} is not a start method: use {methods}")


def run(inv: Invocation) -> int:
    targets = resolve_targets(inv.executor, inv.ns.targets)
    result = build(inv, targets)
    if getattr(inv.ns, "dry_run", False):
        return 0
    given = getattr(inv.ns, "output_dir_given", None)
    given = None if given is None or given is DEFAULT_OUTPUT_DIR else given
    for path in output_paths(targets, result, given):
        print(path, file=inv.stdout)
    return 0 if result.ok else 1


def build(inv: Invocation, targets: list[BuildDependency]) -> BuildResult:
    """Build ``targets`` as ``inv`` asks, write the manifest, say on stderr how it
    went; the result (the command line prints the outputs' paths from it)."""
    check_mp_context()
    executor = inv.executor
    options = inv.request.options
    skipped: list[str] = []
    over_budget: list[str] = []
    plan = executor.checked_plan(targets)  # before the lock: an error creates nothing
    check_compile_targets(executor, plan.actions)
    check_event_files(inv)
    if not options.dry_run:
        check_takeover(
            executor.output_dir,
            lambda: [executor.relative_path(f) for f in graph_outputs(executor, produced=True)],
        )
    # A dry run writes nothing, not even the lock: it reads a snapshot of the state.
    lock = contextlib.nullcontext() if options.dry_run else executor.lock(wait=not inv.ns.no_wait)
    remote = open_remote(inv.ns, inv.request.cache, executor.reporter.message)
    # The cluster first: an executor that cannot be used leaves no output directory.
    # Then the lock, before any file is opened: a build that waits for (or gives up
    # on) another truncates none of that build's files, --events included.
    with remote as offload, lock, event_readers(inv) as readers:
        devices = build_devices(offload, getattr(inv.ns, "require_devices", False))
        request = inv.request.connected(offload, devices, readers)
        # What actions print goes to stderr, escaped: stdout carries only the paths
        # printed below.
        with user_streams(inv.stderr):
            result: BuildResult = executor.run(targets, request, plan)
        if not options.dry_run:
            from kiln.observe.manifest import skipped_checks, write_manifest

            inputs = executor.manifest_inputs()
            statuses = write_manifest(inputs, result)
            skipped, over_budget = skipped_checks(inputs, result, statuses)
            if not inv.broken:
                settle_stale(
                    executor, bool(getattr(inv.ns, "prune", False)), executor.reporter.message
                )
    skipped += [f"{a.desc}: skipped: {why}" for a, why in result.absent.items()]
    _report(inv, result, options, skipped, over_budget)
    return result


def _report(
    inv: Invocation,
    result: BuildResult,
    options: SchedulerOptions,
    skipped: list[str],
    over_budget: list[str],
) -> None:
    reporter = inv.executor.reporter
    if result.failed and not options.dry_run:  # a dry run explained each already
        reporter.message(
            format_root_causes(result, inv.ns.verbose, getattr(inv.ns, "failures", "full"))
        )
    if result.not_reproducible:
        reporter.message(
            "not reproducible (never shared through a cache):\n"
            + "\n".join(f"  {d}" for d in result.not_reproducible)
        )
    if skipped:
        shown = [f"  {line}" for line in skipped[:10]]
        if len(skipped) > 10:
            shown.append(f"  ... and {len(skipped) - 10} more (see manifest.json)")
        reporter.message(f"{len(skipped)} check(s) skipped:\n" + "\n".join(shown))
    if over_budget:
        reporter.message(
            f"{len(over_budget)} benchmark(s) over budget:\n"
            + "\n".join(f"  {line}" for line in over_budget)
        )
    success = format_success(result) if result.ok and not options.dry_run else None
    if success is not None:
        reporter.message(success)
    reporter.message(format_summary(result))
