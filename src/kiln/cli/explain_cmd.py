"""``kiln explain``: which actions would run and why; runs nothing."""

from __future__ import annotations

import json
import time
from typing import Any

from kiln.base.terminal import printable
from kiln.cli.invocation import Invocation
from kiln.cli.requested import check_compile_targets, resolve_targets
from kiln.engine.result import BuildResult
from kiln.observe.summary import error_line


def run(inv: Invocation) -> int:
    executor = inv.executor
    targets = resolve_targets(executor, inv.ns.targets)
    plan = executor.checked_plan(targets)
    check_compile_targets(executor, plan.actions)
    result = executor.run(targets, inv.request, plan)

    if inv.ns.json:
        print(json.dumps(_explained(result), indent=2), file=inv.stdout)
        return 0

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


def _explained(result: BuildResult) -> dict[str, Any]:
    """``--json``: each action of the plan, what a build would do with it, and why."""
    rows: list[dict[str, str]] = []
    for action, reason in result.would_run:
        rows.append({"action": action.desc, "decision": "run", "why": reason})
    for action in result.unchanged():
        why = _not_again(result.errors[action])
        rows.append({"action": action.desc, "decision": "failed unchanged", "why": why})
    for action in result.not_run:
        why = str(result.errors.get(action)).removeprefix("not run: ")
        rows.append({"action": action.desc, "decision": "not run", "why": why})
    for action in result.skipped:
        rows.append({"action": action.desc, "decision": "up to date", "why": ""})
    return {"up_to_date": not result.would_run and not result.failed, "actions": rows}


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
