"""``kiln explain``: which actions would run and why; runs nothing."""

from __future__ import annotations

from kiln.cli.build_cmd import options_from
from kiln.cli.invocation import Invocation
from kiln.cli.requested import check_compile_targets, resolve_targets


def run(inv: Invocation) -> int:
    executor = inv.executor
    targets = resolve_targets(executor, inv.ns.targets)
    plan = executor.checked_plan(targets)
    check_compile_targets(executor, plan.actions)
    result = executor.run(targets, options_from(inv, dry_run=True), plan)
    for action, reason in result.would_run:
        print(f"{action}: {reason}", file=inv.stdout)
    if inv.ns.verbose:
        for action in result.skipped:
            print(f"{action}: up to date", file=inv.stdout)
    if not result.would_run:
        print("everything is up to date", file=inv.stdout)
    return 0
