"""``kiln explain``: which actions would run and why; runs nothing."""

from __future__ import annotations

import time

from kiln.cli.build_cmd import options_from
from kiln.cli.invocation import Invocation
from kiln.cli.requested import check_compile_targets, resolve_targets
from kiln.reporting import error_line
from kiln.terminal import printable


def run(inv: Invocation) -> int:
    executor = inv.executor
    targets = resolve_targets(executor, inv.ns.targets)
    plan = executor.checked_plan(targets)
    check_compile_targets(executor, plan.actions)
    result = executor.run(targets, options_from(inv, dry_run=True), plan)

    def say(line: str) -> None:
        # One line each, escaped: a reason or a remembered log path (state.db is
        # read as untrusted) cannot write a control sequence or forge a line.
        print(printable(line, one_line=True), file=inv.stdout)

    for action, reason in result.would_run:
        say(f"{action}: {reason}")
    for action in result.unchanged():
        say(f"{action}: {_not_again(result.errors[action])}")
    for action in result.not_run:
        why = str(result.errors.get(action)).removeprefix("not run: ")
        say(f"{action}: would not run: {why}")
    if inv.ns.verbose:
        for action in result.skipped:
            say(f"{action}: up to date")
    if not result.would_run and not result.failed:
        say("everything is up to date")
    return 0


def _not_again(error: BaseException) -> str:
    """Why an action that failed unchanged would not run, and where its error is
    (its time is one a clock shows: ``kiln.state.records.FailureRecord``)."""
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(getattr(error, "failed_at", 0)))
    log = getattr(error, "log", None)
    where = f"its log is {log}" if log else f"its error was: {error_line(str(error))}"
    why = getattr(error, "why", "")
    return (
        f"would not run: it failed with this same key in the build of {when} ({where}); "
        "--retry-failed runs it" + (f" (remembered: {why})" if why else "")
    )
