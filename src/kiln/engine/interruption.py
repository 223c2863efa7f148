"""Stopping a build (Ctrl-C, a stopping signal): nothing more starts, what runs
is killed (commands, worker processes, the cluster's tasks), the completions
that come within a bounded time are taken (an action that finished is recorded),
and what the actions that did not finish half-wrote is removed."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from kiln.engine.action_outputs import ActionOutputs
from kiln.engine.dispatch import Dispatcher
from kiln.engine.result import BuildResult
from kiln.engine.shared import ENDED, Done, Shared

WAIT_S = 5.0


def interrupt(
    shared: Shared,
    dispatcher: Dispatcher,
    result: BuildResult,
    kill: Callable[[], None],
    complete: Callable[[Done], None],
) -> None:
    """Stop everything running (``kill``: the build's subprocesses and commands) and
    remove what it half-wrote; ``complete`` takes the completion of an action that
    finished meanwhile, which stays built."""
    shared.stopping = True
    kill()
    dispatcher.stop()
    # A second signal cuts the wait short, not the clean-up.
    with contextlib.suppress(KeyboardInterrupt):
        _drain(shared, dispatcher, complete, time.monotonic() + WAIT_S)
    done = {*result.built, *result.cached}
    for action in shared.plan.actions:
        if shared.runs[action].start_time is not None and action not in done:
            ActionOutputs.remove_partial(shared.plan.outputs[action])


def _drain(
    shared: Shared, dispatcher: Dispatcher, complete: Callable[[Done], None], deadline: float
) -> None:
    """Until ``deadline``, collect what running actions report; those that finished
    successfully despite the interrupt are completed."""
    while shared.running and time.monotonic() < deadline:
        dispatcher.lanes.finish_reaped()
        for item in shared.done.take(0.1):
            if item[2] is None:
                complete(item)
            elif item[2] is not ENDED:
                shared.running.discard(item[0])
