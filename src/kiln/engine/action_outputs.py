"""An action's outputs around its run: their places made ready before it starts
(claimed in the state, real directories above, nothing of the wrong kind there,
no old temporaries), hashed once it finished, removed when it was cut short."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable
from pathlib import Path

from kiln.base.errors import ActionFailed, ConfinementError, NotRegularFile
from kiln.cache import ReadOutput
from kiln.cache.entry import INLINE_MAX
from kiln.graph import BuildAction, BuildFile
from kiln.output_dir.digests import hash_output
from kiln.output_dir.ownership import read_regular
from kiln.output_dir.prefilled import USER_FILES
from kiln.output_dir.tree import OutputTree
from kiln.output_dir.writing import TemporarySweeper, file_kind, remove_partial
from kiln.state import ActionRecord, FailureRecord, Produced, StateStore, stat_key


class ActionOutputs:
    """The output side of one build's actions.

    Invariant: an output's place is prepared only after the state records it as
    kiln's to write (``claim_outputs``), so that a killed build can clean it up;
    an output outside the output directory (``BuildFile.source`` set: a file an
    action of the user's writes where it chooses) is never claimed, prepared or
    removed: kiln only reads it; nor is a file the user placed in the output
    directory before kiln took it over (``kiln.output_dir.prefilled``) while kiln has not
    written it: an action that would write there fails, naming it;
    ``_written`` is the state's ledger of what kiln wrote, read once, when first
    needed. Without a ``tree`` (a dry run) nothing on disk is touched but the
    temporaries kiln left.
    """

    def __init__(self, store: StateStore, tree: OutputTree | None) -> None:
        self._store = store
        self._tree = tree
        self._sweeper = TemporarySweeper()
        self._written: set[str] | None = None
        self._user_files: frozenset[str] | None = None  # ``kiln.output_dir.prefilled``'s, read once
        self._claimed: set[BuildFile] = set()  # claimed by ``claim``, not yet prepared
        self._ahead: set[str] = set()  # actions claimed ahead of their round, not started

    def claim(
        self,
        runs: Iterable[tuple[str, Iterable[BuildFile]]],
        finished: tuple[list[tuple[str, ActionRecord]], list[tuple[str, FailureRecord]]],
        ahead: Iterable[tuple[str, Iterable[BuildFile]]] = (),
    ) -> None:
        """Before a round of actions (``(action id, outputs)``) starts, in one
        transaction with the records of the actions ``finished`` since the last
        round and the failures to remember: drop their records (and remembered
        failures) and claim their outputs as kiln's to write. The same is done for
        the actions ``ahead``, waiting to start in a later round: a round that
        starts only actions claimed so needs no transaction (``unclaimed``)."""
        ids: list[str] = []
        paths: list[str] = []
        now = list(runs)
        starting = {i for i, _ in now}
        later = [(i, f) for i, f in ahead if i not in starting and i not in self._ahead]
        for action_id, outputs in (*now, *later):
            ids.append(action_id)
            for f in outputs:
                if f.source is None and not self._users(f):
                    paths.append(f.layout.relative_path(f))
                    self._claimed.add(f)
        self._store.commit_round(finished[0], ids, paths, finished[1])
        self._ahead.update(i for i, _ in later)

    def unclaimed(self, ids: list[str]) -> set[str]:
        """Those of ``ids`` that no earlier ``claim`` claimed ahead. They are about to
        start: none of them counts as claimed ahead any more."""
        ahead = self._ahead
        missing = {i for i in ids if i not in ahead}
        ahead.difference_update(ids)
        return missing

    def prepare(self, outputs: Iterable[BuildFile]) -> None:
        """Record ``outputs`` as kiln's to write (unless ``claim`` did), then make
        their places ready."""
        outputs = [f for f in outputs if f.source is None]
        for f in outputs:
            if self._users(f):
                raise ConfinementError(
                    f"output {f.fs_str} is a file that was in the output directory before "
                    "kiln first built there: it is yours, and kiln never writes over it; "
                    "move it away, or leave the output undeclared to read it as an input"
                )
        claimed = self._claimed
        unclaimed = [f.layout.relative_path(f) for f in outputs if f not in claimed]
        if unclaimed:
            self._store.claim_outputs(unclaimed)
        claimed.difference_update(outputs)
        for f in outputs:
            if self._tree is not None:
                self._tree.prepare_output(f.fs_str, self._kiln_wrote)
            self._sweeper.sweep(f.fs_str)

    def _users(self, f: BuildFile) -> bool:
        """Whether output ``f`` is a file the user placed before kiln took the output
        directory over, still there, and never written by kiln since."""
        if self._user_files is None:
            self._user_files = _read_user_files(self._store.path.parent / USER_FILES)
        if not self._user_files:
            return False
        rel = f.layout.relative_path(f)
        return rel in self._user_files and not self._kiln_wrote(rel) and os.path.lexists(f.fs_str)

    def _kiln_wrote(self, rel: str) -> bool:
        if self._written is None:
            self._written = self._store.written_outputs()
        return rel in self._written

    @staticmethod
    def link_sources(inputs: Iterable[BuildFile]) -> None:
        """Give the source files among ``inputs`` their place in ``.kiln/src``, where
        the programs of actions find them (``BuildFile.action_path``)."""
        for f in inputs:
            if f.source is not None:
                f.layout.link_source(f.action_path, str(f.source))

    @staticmethod
    def hash(
        action: BuildAction,
        outputs: Iterable[BuildFile],
        read: dict[BuildFile, ReadOutput] | None = None,
    ) -> Produced:
        """What ``action`` wrote; each output must be a regular file. Each is opened
        once: into ``read`` go their modes and the bytes of the small ones, for the
        cache (``BuildCache.save``)."""
        produced = {}
        for f in outputs:
            path = f.fs_str
            try:
                st, digest, data = hash_output(path, INLINE_MAX)
            except FileNotFoundError:
                raise ActionFailed(
                    f"'{action.desc}' finished without writing its output {path}"
                ) from None
            except NotRegularFile:
                raise ActionFailed(
                    f"'{action.desc}' left {file_kind(os.lstat(path).st_mode)} at its "
                    f"output {path}; outputs must be regular files"
                ) from None
            produced[f] = (stat_key(st), digest)
            if read is not None:
                read[f] = (st.st_mode & 0o7777, data)
        return produced

    @staticmethod
    def remove_partial(outputs: Iterable[BuildFile]) -> None:
        """Remove what an action that was cut short half-wrote (in the output
        directory: never a file outside it)."""
        for f in outputs:
            if f.source is None:
                remove_partial(f.fs_str)


def _read_user_files(path: Path) -> frozenset[str]:
    """The user's files listed when kiln took a filled directory over (none when
    there is no list; an unreadable list protects nothing and is reported by
    nobody: it is only ever written by kiln)."""
    try:
        listed = json.loads(read_regular(path))
    except (OSError, NotRegularFile, ValueError):
        return frozenset()
    return (
        frozenset(p for p in listed if isinstance(p, str))
        if isinstance(listed, list)
        else frozenset()
    )
