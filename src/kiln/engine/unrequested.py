"""What became of the actions a build did not plan: each output of an entrypoint
that was not requested this time is ``stale`` (the copy an earlier build left no
longer matches that build's record, or may not: decided from the stat cache,
reading no file) or ``not built``.

Judged once, in the build's own pass (``Executor.run``), with the build's keys
and digests: the manifest reads the answers from the ``BuildResult`` and plans
and keys nothing itself. An action that cannot be keyed here (its tool is not
installed, say) is ``not built``, never an error: nothing of it was asked for.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from pathlib import Path

from kiln.base.errors import KilnError
from kiln.engine.incremental import UpToDateChecker
from kiln.graph import BuildAction, BuildDependency, BuildFile
from kiln.planning.action_key import KeyMaker
from kiln.planning.plan import Plan, make_plan
from kiln.state import ActionRecord, FailureRecord, StateStore

# Stands for the digest of an output whose copy is stale, so its consumers are too.
_STALE = "<stale>"


class _StatCacheOnly:
    """The state store as the up-to-date check reads it, but answering a digest
    only from the stat cache: a changed file counts as changed, unread."""

    def __init__(self, store: StateStore):
        self._store = store

    def digest(self, path: Path | str, output: bool = False) -> str | None:
        return self._store.cached_digest(path, output)

    def cached_digest(self, path: Path | str, output: bool = False) -> str | None:
        return self._store.cached_digest(path, output)

    def records(self) -> Mapping[str, ActionRecord]:
        return self._store.records()

    def failures(self) -> Mapping[str, FailureRecord]:
        return self._store.failures()


def judge(
    roots: Iterable[BuildDependency],
    files: Iterable[BuildFile],
    plan: Plan,
    keys: KeyMaker,
    digests: dict[BuildFile, str],
    store: StateStore,
) -> dict[BuildAction, str]:
    """``stale`` or ``not built`` for each action under ``roots`` that ``plan`` (the
    build's) did not hold; ``digests`` are the build's, ``keys`` its keys."""
    roots = list(roots)
    if all(r in plan.consumers for r in roots):
        return {}  # the build reached every root (the usual build): no second walk
    rest = make_plan(roots, files, known=plan.consumers)
    if not rest.actions:
        return {}
    for action in rest.actions:
        if action not in keys.params_of:
            try:
                keys.params_of[action] = keys.params(action)
            except KilnError:  # cannot be keyed here: never judged up to date
                keys.params_of[action] = None
    checker = UpToDateChecker(rest, _StatCacheOnly(store), keys)
    checker.digests.update(digests)
    judged: dict[BuildAction, str] = {}
    for action in rest.actions:
        outputs = rest.outputs[action]
        decision = checker.decide(action)
        exists = all(os.path.lexists(f.fs_str) for f in outputs)
        if decision.up_to_date or decision.reason == "never built" or not exists:
            judged[action] = "not built"
        else:
            judged[action] = "stale"
        if not decision.up_to_date:
            checker.digests.update((f, _STALE) for f in outputs)
    return judged
