"""The records of finished actions, and their failures, written in groups.

The records of the actions that finished since the last transaction (and the
failures, remembered or not: ``kiln.engine.failures``) go to the
build state with the next round's claims, in one transaction, before any
dependent starts (``Scheduler._launch``), or alone within ``GROUP_COMMIT_S``
when the round starts nothing. A dependent never runs on an output whose record
a kill could lose; a kill loses at most ``GROUP_COMMIT_S`` of finished work.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable

from kiln.engine.failures import failure_record
from kiln.engine.incremental import Decision
from kiln.engine.result import NodeRun
from kiln.graph import BuildAction, BuildFile
from kiln.state import ActionRecord, FailureRecord, Produced, StateStore

# What one transaction writes: the records of the actions that succeeded, the
# failures (remembered or not).
Finished = tuple[list[tuple[str, ActionRecord]], list[tuple[str, FailureRecord]]]

GROUP_COMMIT_S = 0.05


class Recorder:
    """Invariant: ``unrecorded`` holds the records of the actions that finished
    since the last transaction, ``failures`` the failures since then,
    ``unwritten`` the actions of ``unrecorded``; ``due`` is when they must be
    written at the latest (infinity when none wait)."""

    def __init__(self, store: StateStore, digests: dict[BuildFile, str | None]) -> None:
        self.store = store
        self._digests = digests  # every file's digest known this build
        self.unrecorded: list[tuple[str, ActionRecord]] = []
        self.failures: list[tuple[str, FailureRecord]] = []
        self.unwritten: set[BuildAction] = set()
        self.due = math.inf

    def ran(self, decision: Decision, run: NodeRun) -> None:
        """Remember how long the action took (successful or not)."""
        if run.start_time is not None and run.finish_time is not None:
            self.store.remember_duration(decision.action_id, run.finish_time - run.start_time)

    def record(self, action: BuildAction, decision: Decision, produced: Produced) -> None:
        """``action`` succeeded, writing ``produced``: its record waits for the next
        transaction."""
        outputs = {}
        for f, (skey, digest) in produced.items():
            self.store.remember_digest(f.fs_str, skey, digest)
            self._digests[f] = digest
            outputs[f.key] = digest
        self._due()
        inputs = decision.inputs
        if decision.run_deps:  # recorded with its inputs (``kiln.planning.run_deps``)
            inputs = {**inputs, **decision.run_deps}
        record = ActionRecord(decision.key, decision.params, inputs, outputs)
        self.unrecorded.append((decision.action_id, record))
        self.unwritten.add(action)

    def failed(self, action: BuildAction, decision: Decision, error: BaseException) -> None:
        """``action`` ran and failed with ``error``: write it down with the next
        transaction, remembered or not (``kiln.engine.failures``)."""
        failure = failure_record(action, decision, error)
        if failure is not None:
            self._due()
            self.failures.append((decision.action_id, failure))

    def _due(self) -> None:
        if not self.unrecorded and not self.failures:
            self.due = time.monotonic() + GROUP_COMMIT_S

    def take(self) -> Finished:
        """The records and failures waiting to be written; none wait afterwards."""
        finished = (self.unrecorded, self.failures)
        self.unrecorded, self.failures, self.due = [], [], math.inf
        self.unwritten = set()
        return finished

    def read_by(self, actions: Iterable[BuildAction]) -> bool:
        """Whether one of ``actions`` depends on an action whose record waits (on it
        or on a file it produced): then that record must be written before it starts."""
        waiting = self.unwritten
        if not waiting:
            return False
        return any(
            dep in waiting or not waiting.isdisjoint(dep.deps)
            for action in actions
            for dep in action.deps
        )

    def write(self) -> None:
        """Write the records and failures waiting, in one transaction."""
        if self.unrecorded or self.failures:
            records, failures = self.take()
            self.store.commit_round(records, [], [], failures)
