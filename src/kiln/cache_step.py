"""What the scheduler asks of the shared cache for one action: may it use the
cache at all, restore its outputs (a hit), save them after a run, and whether a
dry run would be served. This is the one place that decides what is shared:
nothing without a key, nothing found not reproducible, nothing that reached files
its key does not cover while it ran (``Decision.run_deps``, ``kiln.run_deps``),
and what an action says is not reproducible (a benchmark times its machine) never
beyond this machine.

The scheduler reaches the cache only through ``CacheStep``, on its worker threads
and its own: an exception of any kind in a cache step (a bug, a library raising
what nobody expected) is reported once, turns the cache off for the rest of the
build and counts as a miss. It never escapes into a worker thread, where it would
end the thread before the action's completion is posted and leave the build
waiting for it."""

from __future__ import annotations

from collections.abc import Mapping

from kiln.cache import BuildCache, ReadOutput, cacheable, known_digests
from kiln.graph import BuildAction, BuildFile
from kiln.incremental import Decision
from kiln.plan import Plan
from kiln.state import Produced


class CacheStep:
    """The shared cache as one build's plan uses it (``cache`` None: no cache).

    Invariant: an action goes to or comes from the cache only when ``applies`` says
    so: a cache is set, the action, its parameters and its outputs are cacheable
    (``kiln.cache.cacheable``), its key is not among those found not
    reproducible (``avoid``), and it has no run-time dependencies (its last
    record's, before it runs; this run's, after); to or from the remote cache only when ``shared``
    says so too. With ``defer``, saves wait in ``deferred`` until ``flush``.
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

    def applies(self, action: BuildAction, decision: Decision) -> bool:
        return (
            self.cache is not None
            and cacheable(action, decision.params, self._plan.outputs[action])
            and decision.key not in self._avoid
            and not decision.run_deps
        )

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
        if self.cache is not None and self.applies(action, decision):
            if self._defer:
                self.deferred.append((action, decision, produced))
                return
            try:
                self.cache.save(
                    decision.key, action.desc, produced, share=self.shared(action), read=read
                )
            except Exception as e:  # noqa: BLE001 - a cache step never fails a build
                self.cache.failed(e)

    def flush(self, skip: set[BuildAction]) -> None:
        """Save what ``save`` deferred, but the actions in ``skip``."""
        deferred, self.deferred = self.deferred, []
        self._defer = False
        for action, decision, produced in deferred:
            if action not in skip:
                self.save(action, decision, produced)

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
