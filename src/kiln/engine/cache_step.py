"""What the scheduler asks of the shared cache for one action: may it use the
cache at all, restore its outputs (a hit), save them after a run, and whether a
dry run would be served. This is the one place that decides what is shared:
nothing without a key, nothing found not reproducible, nothing that reached files
its key does not cover while it ran (``Decision.run_deps``, ``kiln.planning.run_deps``),
and what an action says is not reproducible (a benchmark times its machine) never
beyond this machine. After ``--check-reproducible`` it settles what the check
found (``settle``): what was not reproduced is withdrawn from every cache the
build can write to, what was reproduced goes in (replacing a withdrawal).

The scheduler reaches the cache only through ``CacheStep``, on its worker threads
and its own: an exception of any kind in a cache step (a bug, a library raising
what nobody expected) is reported once, turns the cache off for the rest of the
build and counts as a miss. It never escapes into a worker thread, where it would
end the thread before the action's completion is posted and leave the build
waiting for it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping

from kiln.cache import BuildCache, ReadOutput, cacheable, known_digests
from kiln.engine.incremental import Decision
from kiln.graph import BuildAction, BuildFile
from kiln.planning.plan import Plan
from kiln.state import Produced


class CacheStep:
    """The shared cache as one build's plan uses it (``cache`` None: no cache).

    Invariant: an action goes to or comes from the cache only when ``applies`` says
    so: a cache is set, the action, its parameters and its outputs are cacheable
    (``kiln.cache.cacheable``), its key is not among those found not
    reproducible (``avoid``), and it has no run-time dependencies (its last
    record's, before it runs; this run's, after); to or from the remote cache only
    when ``shared`` says so too. With ``defer`` (a check follows the build), every
    cacheable action's save waits in ``deferred`` until ``settle``, which stores
    only what the check reproduced.
    """

    def __init__(
        self,
        cache: BuildCache | None,
        plan: Plan,
        avoid: frozenset[str] | set[str] = frozenset(),
        defer: bool = False,
    ) -> None:
        self.cache = cache
        self._plan = plan
        self._avoid = avoid
        self._defer = defer
        self.deferred: list[tuple[BuildAction, Decision, Produced]] = []
        # What ran in a checked build and no cache takes (no key, cacheable = False).
        self._never_cached: set[BuildAction] = set()

    def applies(self, action: BuildAction, decision: Decision) -> bool:
        return (
            self._cacheable(action, decision)
            and decision.key not in self._avoid
            and not decision.run_deps
        )

    def _cacheable(self, action: BuildAction, decision: Decision) -> bool:
        return self.cache is not None and cacheable(
            action, decision.params, self._plan.outputs[action]
        )

    def noted(self, decision: Decision) -> Decision:
        """``decision``, its reason saying why the cache did not serve it when the
        cache withdrew its key (found not reproducible)."""
        why = self.cache.withdrawn(decision.key) if self.cache is not None else None
        if why is None or decision.reason is None:
            return decision
        note = f"not served from the cache: --check-reproducible found it not reproducible ({why})"
        return dataclasses.replace(decision, reason=f"{decision.reason}; {note}")

    @staticmethod
    def shared(action: BuildAction) -> bool:
        """Whether ``action``'s results may leave this machine (the remote cache)."""
        return getattr(action, "reproducible", True) is not False

    def restore(self, action: BuildAction, decision: Decision) -> Produced | None:
        """The outputs of ``action`` materialized from the cache, or None (a miss)."""
        if self.cache is None or not self.applies(action, decision):
            return None
        outputs = self._plan.outputs[action]
        try:
            known = known_digests(action, outputs)
            return self.cache.restore(decision.key, outputs, known, share=self.shared(action))
        except Exception as e:  # noqa: BLE001 - a cache step never fails or hangs a build
            self.cache.failed(e)
            return None

    def restore_small(
        self, action: BuildAction, decision: Decision
    ) -> tuple[bool, Produced | None]:
        """``BuildCache.restore_small`` for ``action``: ``(False, None)`` also when its
        outputs may be served by digest (``known_digests``: blobs), never decided
        here; ``(True, None)`` when the cache does not apply."""
        if self.cache is None or not self.applies(action, decision):
            return True, None
        outputs = self._plan.outputs[action]
        try:
            if known_digests(action, outputs) is not None:
                return False, None
            return self.cache.restore_small(decision.key, outputs)
        except Exception as e:  # noqa: BLE001 - a cache step never fails or hangs a build
            self.cache.failed(e)
            return True, None

    def save(
        self,
        action: BuildAction,
        decision: Decision,
        produced: Produced,
        read: Mapping[BuildFile, ReadOutput] | None = None,
    ) -> None:
        """Put what ``action`` produced into the cache; ``read``: what hashing its
        outputs read of them (``BuildCache.save``)."""
        if self._defer:
            if not self._cacheable(action, decision):
                self._never_cached.add(action)
            elif not decision.run_deps:  # one that reached more: withdrawn, never stored
                self.deferred.append((action, decision, produced))
        elif self.applies(action, decision):
            self._store(action, decision.key, produced, read)

    def _store(
        self,
        action: BuildAction,
        key: str,
        produced: Produced,
        read: Mapping[BuildFile, ReadOutput] | None = None,
        reproduced: bool = False,
    ) -> None:
        assert self.cache is not None
        try:
            self.cache.save(
                key, action.desc, produced, self.shared(action), read, reproduced=reproduced
            )
        except Exception as e:  # noqa: BLE001 - a cache step never fails a build
            self.cache.failed(e)

    def settle(
        self,
        checked: list[BuildAction],
        found: Mapping[BuildAction, str],
        keys: Mapping[BuildAction, str],
        outputs: Callable[[BuildAction], Produced | None],
    ) -> None:
        """After ``--check-reproducible`` checked ``checked`` and found ``found`` (why,
        by action) not reproduced: withdraw those from the caches; store what the
        build ran and the check reproduced (``save`` deferred it), and what it did
        not run but a cache holds withdrawn (its ``outputs`` here), replacing the
        withdrawal: it reproduces now."""
        deferred, self.deferred = self.deferred, []
        self._defer = False
        cache = self.cache
        if cache is None:
            return
        try:
            for action, why in found.items():
                if action in keys and action not in self._never_cached:
                    cache.withdraw(keys[action], action.desc, why)
            done = found.keys() | self._never_cached
            for action, decision, produced in deferred:
                if action not in found:
                    self._store(action, decision.key, produced, reproduced=True)
                    done.add(action)
            for action in checked:  # served, or up to date here: stored if withdrawn
                key = keys.get(action)
                if action in done or key is None or not cache.marked(key):
                    continue
                if not cacheable(action, key, self._plan.outputs[action]):
                    continue  # its key is a real one (it was served or up to date)
                here = outputs(action)
                if here is not None:
                    self._store(action, key, here, reproduced=True)
        except Exception as e:  # noqa: BLE001 - a cache step never fails a build
            cache.failed(e)

    def would_serve(self, action: BuildAction, decision: Decision) -> bool:
        """Whether a real build would take ``action``'s outputs from the cache."""
        if self.cache is None or not self.applies(action, decision):
            return False
        outputs = self._plan.outputs[action]
        try:
            known = known_digests(action, outputs)
            return self.cache.would_serve(decision.key, outputs, known, share=self.shared(action))
        except Exception as e:  # noqa: BLE001 - a cache step never fails a build
            self.cache.failed(e)
            return False
