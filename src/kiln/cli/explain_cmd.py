"""``kiln explain``: which actions would run and why; runs nothing."""

from __future__ import annotations

import time

from kiln.cli.build_cmd import options_from
from kiln.cli.invocation import Invocation
from kiln.cli.requested import check_compile_targets, resolve_targets
from kiln.reporting import error_line


def run(inv: Invocation) -> int:
    executor = inv.executor
    targets = resolve_targets(executor, inv.ns.targets)
    plan = executor.checked_plan(targets)
    check_compile_targets(executor, plan.actions)
    result = executor.run(targets, options_from(inv, dry_run=True), plan)
    for action, reason in result.would_run:
        print(f"{action}: {reason}", file=inv.stdout)
    for action in result.unchanged():
        print(f"{action}: {_not_again(result.errors[action])}", file=inv.stdout)
    for action in result.not_run:
        why = str(result.errors.get(action)).removeprefix("not run: ")
        print(f"{action}: would not run: {why}", file=inv.stdout)
    if inv.ns.verbose:
        for action in result.skipped:
            print(f"{action}: up to date", file=inv.stdout)
    if not result.would_run and not result.failed:
        print("everything is up to date", file=inv.stdout)
    return 0


def _not_again(error: BaseException) -> str:
    """Why an action that failed unchanged would not run, and where its error is."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(getattr(error, "failed_at", 0)))
    log = getattr(error, "log", None)
    where = f"its log is {log}" if log else f"its error was: {error_line(str(error))}"
    return (
        f"would not run: it failed with this same key in the build of {when} ({where}); "
        "--retry-failed runs it"
    )
