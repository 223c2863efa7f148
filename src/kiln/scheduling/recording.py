"""The records of finished actions, written in groups.

The records of the actions that finished since the last transaction go to the
build state with the next round's claims, in one transaction, before any
dependent starts (``Scheduler._launch``), or alone within ``GROUP_COMMIT_S``
when the round starts nothing. A dependent never runs on an output whose record
a kill could lose; a kill loses at most ``GROUP_COMMIT_S`` of finished work.
"""

from __future__ import annotations

import math
import time

from kiln.graph import BuildAction, BuildFile
from kiln.incremental import Decision
from kiln.result import NodeRun
from kiln.state import ActionRecord, Produced, StateStore

GROUP_COMMIT_S = 0.05


class Recorder:
    """Invariant: ``unrecorded`` holds the records of the actions that finished
    since the last transaction; ``due`` is when they must be written at the latest
    (infinity when none wait)."""

    def __init__(self, store: StateStore, digests: dict[BuildFile, str | None]) -> None:
        self.store = store
        self._digests = digests  # every file's digest known this build
        self.unrecorded: list[tuple[str, ActionRecord]] = []
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
        if not self.unrecorded:
            self.due = time.monotonic() + GROUP_COMMIT_S
        record = ActionRecord(decision.key, decision.params, decision.inputs, outputs)
        self.unrecorded.append((decision.action_id, record))

    def take(self) -> list[tuple[str, ActionRecord]]:
        """The records waiting to be written; none wait afterwards."""
        finished, self.unrecorded, self.due = self.unrecorded, [], math.inf
        return finished

    def write(self) -> None:
        """Write the records waiting, in one transaction."""
        if self.unrecorded:
            self.store.commit_round(self.take(), [], [])
