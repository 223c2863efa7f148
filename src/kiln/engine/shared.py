"""What the scheduler's loop and the dispatch of its actions share: the inbox of
completions, the run records, the event emitter, the cache step and the flag
that stops the build."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

from kiln.base.errors import ActionFailed
from kiln.engine.build_events import BuildEmitter
from kiln.engine.cache_step import CacheStep
from kiln.engine.inbox import Completions
from kiln.engine.incremental import Decision
from kiln.engine.result import NodeRun
from kiln.graph import BuildAction, BuildDependency
from kiln.planning.plan import Plan
from kiln.state import Produced

# One completion: the action, its decision, its error (None: it succeeded) and
# what it wrote.
Done = tuple[BuildAction, Decision, BaseException | None, Produced]

# The "error" of a queued action that the build stopped before it started.
CANCELLED = ActionFailed("not started: the build stopped")
# Not an error: what the reaper says first when a command ended, before it commits
# and hashes the outputs, so that the next command takes its place at once.
ENDED = ActionFailed("its command ended")


@dataclass
class Shared:
    """Invariants: every action the dispatch takes posts exactly one completion to
    ``done`` (a command an ``ENDED`` first); ``running`` holds exactly the
    launched actions whose completion the loop has not processed; once
    ``stopping`` is set it stays set, and nothing starts."""

    plan: Plan
    runs: dict[BuildDependency, NodeRun]
    events: BuildEmitter
    cache: CacheStep
    fail_fast: bool
    done: Completions[Done] = field(default_factory=Completions)
    running: set[BuildAction] = field(default_factory=set)
    stopping: bool = False
    # The scheduler's own thread (set again when the build runs).
    thread: int = field(default_factory=threading.get_ident)

    def on_scheduler_thread(self) -> bool:
        return threading.get_ident() == self.thread

    def failed_action(self) -> None:
        """An action failed: with ``--fail-fast`` nothing starts from now on."""
        if self.fail_fast:
            self.stopping = True
