"""The ``BuildRequest`` a command's options make (``kiln.engine.request``): made
once, when the command's session starts, and handed to the executor whole."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable

from kiln.base.action_env import ActionEnvironment
from kiln.cli.cache_options import open_cache
from kiln.engine.request import BuildRequest, SchedulerOptions

# The commands that must create nothing: their state is a snapshot.
_READ_ONLY = ("list", "graph", "explain")
# The commands that run a plan, and so have its scheduling options.
_RUNNING = ("build", "explain")


def options_from(ns: argparse.Namespace, dry_run: bool = False) -> SchedulerOptions:
    """The scheduling options of ``kiln build`` (``dry_run``: of ``kiln explain``)."""
    return SchedulerOptions(
        jobs=ns.jobs,
        pools=dict(ns.pool),
        fail_fast=getattr(ns, "fail_fast", False),
        dry_run=dry_run or getattr(ns, "dry_run", False),
        # A dry run of ``build`` lists what would run; ``explain`` prints it itself.
        explain=getattr(ns, "explain", False) or getattr(ns, "dry_run", False),
        check_reproducible=getattr(ns, "check_reproducible", False),
        retry_failed=getattr(ns, "retry_failed", False),
    )


def request_from(
    command: str, ns: argparse.Namespace, warn: Callable[[str], None], start_dir: str
) -> BuildRequest:
    """What ``kiln COMMAND`` with options ``ns`` asks of its builds; its cache opened
    (``warn``: for what the cache finds; ``start_dir``: where kiln started). The
    cluster, its devices and the event files are added when the build holds its
    output directory (``BuildRequest.connected``)."""
    dry_run = bool(getattr(ns, "dry_run", False))
    return BuildRequest(
        options=(
            options_from(ns, dry_run=command == "explain")
            if command in _RUNNING
            else SchedulerOptions()
        ),
        environment=ActionEnvironment.from_specs(getattr(ns, "action_env", []), os.environ),
        strict_keys=bool(getattr(ns, "strict_keys", False)),
        read_only=command in _READ_ONLY or dry_run,
        verbose=ns.verbose,
        cache=open_cache(ns, warn, start_dir),
    )
