"""Commands without a thread each (``run_command``): started by the build's
``CommandRunner`` (``kiln.execution.process.commands``), reaped on the scheduler's own
thread while it waits, or on the runner's reaper thread. ``CommandLanes`` is the
build's runner (``kiln.engine.runner``) for every action that spawns a command.

A running command holds a lane (``kiln-N``, the lowest free: fewer than ``-j``
run at once), which names its slice in the trace. When it ends, its lane is
free and an ``ENDED`` note lets the next command start at once; the rest of its
work (its own checks, committing and hashing its output) follows: on the
scheduler's thread after the next command started, on a worker thread for a
large output, or on the reaper thread.
"""

from __future__ import annotations

import functools
import itertools
import threading
import time
from collections.abc import Callable

from kiln.cache import ReadOutput
from kiln.engine.action_outputs import ActionOutputs
from kiln.engine.incremental import Decision
from kiln.engine.runner import Placement, Runner
from kiln.engine.shared import ENDED, Shared
from kiln.execution.process.commands import CommandRunner
from kiln.execution.threads import ThreadWorkers
from kiln.graph import ActionConcurrency, BuildAction, BuildFile, Finish, SpawnsCommand
from kiln.state import Produced

# A command whose output is at most this large is finished on the reaper thread.
FINISH_INLINE_BYTES = 1 << 20
# A command is started by a worker thread (which returns as soon as it is spawned)
# and holds its place until it is reaped: no queuing ahead for it. 10,000 trivial
# commands at -j 2 took 1.7x the wall time when the scheduler's thread started each.
_LANE = Placement(holds_place=True)
_IN_LINE_LANE = Placement(in_line=True, holds_place=True)


def _reraise(error: BaseException) -> None:
    raise error


class CommandLanes(Runner):
    """The runner of the actions that spawn a command. Invariants: ``_slots`` maps
    each running command to its lane number, no two the same; ``_reaped`` holds
    the rest of the work of commands reaped on the scheduler's thread, done by
    ``finish_reaped`` once the next command started."""

    def __init__(
        self,
        shared: Shared,
        workers: Callable[[], ThreadWorkers],
        commands: Callable[[], CommandRunner] | None,
    ) -> None:
        self.shared = shared
        self._workers = workers
        self._commands = commands  # the build's runner, which the scheduler drives
        self._lock = threading.Lock()
        self._slots: dict[BuildAction, int] = {}
        self._reaped: list[Callable[[], None]] = []

    def takes(self, action: BuildAction) -> bool:
        return isinstance(action, SpawnsCommand)

    def placement(self, action: BuildAction) -> Placement:
        return _IN_LINE_LANE if action.concurrency is ActionConcurrency.NONE else _LANE

    def start(self, action: BuildAction, decision: Decision) -> None:
        """Start ``action``'s command in the lowest free lane."""
        lane = self.lane(action)
        run = self.shared.runs[action]
        run.start_time = run.invoke_time = time.time()  # within its lane
        self.shared.events.started(action, decision, lane)
        self.spawn(action, decision)

    def lane(self, action: BuildAction) -> str:
        """Take the lowest free lane for ``action``'s command; its name."""
        with self._lock:
            taken = set(self._slots.values())
            slot = next(i for i in itertools.count() if i not in taken)
            self._slots[action] = slot
        return f"kiln-{slot}"

    def spawn(self, action: BuildAction, decision: Decision) -> None:
        """Start ``action``'s command; ``_finished`` is called when it ended."""
        assert isinstance(action, SpawnsCommand)
        shared = self.shared

        def finished(finish: Finish, size: int) -> None:
            self._end_lane(action)
            shared.done.put((action, decision, ENDED, {}))  # the next command may start
            rest = functools.partial(self._finish, action, decision, finish)
            if size > FINISH_INLINE_BYTES:  # a large output: hashed off the reaper
                self._workers().submit(rest)
            elif shared.on_scheduler_thread():  # reaped here: after the next starts
                self._reaped.append(rest)
            else:
                rest()

        if shared.on_scheduler_thread() and self._commands is not None:
            shared.done.drive(self._commands())
        try:
            action.spawn(finished)
        except KeyboardInterrupt:  # Ctrl-C on the scheduler's thread: stop the build
            shared.running.discard(action)
            raise
        except BaseException as e:  # noqa: BLE001 - the failure belongs to the action
            self._end_lane(action)
            self._finish(action, decision, functools.partial(_reraise, e))

    def finish_reaped(self) -> None:
        """The rest of the work of the commands reaped on this thread."""
        reaped, self._reaped = self._reaped, []
        for finish in reaped:
            finish()

    def _end_lane(self, action: BuildAction) -> None:
        """The command of ``action`` ended (or never started): its slice of its lane
        ends, and its lane is free."""
        self.shared.runs[action].finish_time = time.time()
        with self._lock:
            self._slots.pop(action, None)

    def _finish(self, action: BuildAction, decision: Decision, finish: Finish) -> None:
        """After a command ended: the action's own checks, then hash its outputs."""
        shared = self.shared
        error: BaseException | None = None
        produced: Produced = {}
        try:
            finish()
            read: dict[BuildFile, ReadOutput] = {}
            produced = ActionOutputs.hash(action, shared.plan.outputs[action], read)
            shared.cache.save(action, decision, produced, read)
        except BaseException as e:  # noqa: BLE001 - the failure belongs to the action
            error = e
            shared.failed_action()
        shared.done.put((action, decision, error, produced))
