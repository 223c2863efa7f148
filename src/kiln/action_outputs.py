"""An action's outputs around its run: their places made ready before it starts
(claimed in the state, real directories above, nothing of the wrong kind there,
no old temporaries), hashed once it finished, removed when it was cut short."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable

from kiln.action_record import ActionRecord
from kiln.errors import ActionFailed
from kiln.graph import BuildAction, BuildFile
from kiln.output_tree import OutputTree
from kiln.outputs import TemporarySweeper, file_kind, remove_partial
from kiln.state import StateStore, StatKey, hash_file, stat_key

# What an action wrote: each output's stat key and digest.
Produced = dict[BuildFile, tuple[StatKey, str]]


class ActionOutputs:
    """The output side of one build's actions.

    Invariant: an output's place is prepared only after the state records it as
    kiln's to write (``claim_outputs``), so that a killed build can clean it up;
    ``_written`` is the state's ledger of what kiln wrote, read once, when first
    needed. Without a ``tree`` (a dry run) nothing on disk is touched but the
    temporaries kiln left.
    """

    def __init__(self, store: StateStore, tree: OutputTree | None) -> None:
        self._store = store
        self._tree = tree
        self._sweeper = TemporarySweeper()
        self._written: set[str] | None = None
        self._claimed: set[BuildFile] = set()  # claimed by ``claim``, not yet prepared

    def claim(
        self,
        runs: Iterable[tuple[str, Iterable[BuildFile]]],
        finished: list[tuple[str, ActionRecord]],
    ) -> None:
        """Before a round of actions (``(action id, outputs)``) starts, in one
        transaction with the records of the actions ``finished`` since the last
        round: drop their records and claim their outputs as kiln's to write."""
        ids, paths = [], []
        for action_id, outputs in runs:
            ids.append(action_id)
            for f in outputs:
                paths.append(f.layout.relative_path(f))
                self._claimed.add(f)
        self._store.commit_round(finished, ids, paths)

    def prepare(self, outputs: Iterable[BuildFile]) -> None:
        """Record ``outputs`` as kiln's to write (unless ``claim`` did), then make
        their places ready."""
        outputs = list(outputs)
        claimed = self._claimed
        unclaimed = [f.layout.relative_path(f) for f in outputs if f not in claimed]
        if unclaimed:
            self._store.claim_outputs(unclaimed)
        claimed.difference_update(outputs)
        for f in outputs:
            if self._tree is not None:
                self._tree.prepare_output(f.fs_str, self._kiln_wrote)
            self._sweeper.sweep(f.fs_str)

    def _kiln_wrote(self, rel: str) -> bool:
        if self._written is None:
            self._written = self._store.written_outputs()
        return rel in self._written

    @staticmethod
    def hash(action: BuildAction, outputs: Iterable[BuildFile]) -> Produced:
        """What ``action`` wrote; each output must be a regular file."""
        produced = {}
        for f in outputs:
            path = f.fs_str
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                raise ActionFailed(
                    f"'{action.desc}' finished without writing its output {path}"
                ) from None
            if not stat.S_ISREG(st.st_mode):
                raise ActionFailed(
                    f"'{action.desc}' left {file_kind(st.st_mode)} at its "
                    f"output {path}; outputs must be regular files"
                )
            produced[f] = (stat_key(st), hash_file(path))
        return produced

    @staticmethod
    def remove_partial(outputs: Iterable[BuildFile]) -> None:
        """Remove what an action that was cut short half-wrote."""
        for f in outputs:
            remove_partial(f.fs_str)
