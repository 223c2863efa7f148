"""The runner protocol: one place an action's work can run, or be served from.

The dispatcher (``kiln.engine.dispatch``) holds an ordered list of runners and
gives each started action to the first that ``takes`` it, as Ninja's
``Builder`` hands each edge to the ``CommandRunner`` it owns. The build's list,
best first (``kiln.engine.runners``): the cache, the cluster, a command, a
worker process, in-line, a worker thread. ``--check-reproducible`` picks its
second runs from its own list the same way (``first_taking``). A new backend
is one more class in the list; nothing else asks what kind of runner it is.

Invariants every runner keeps:

- ``takes`` is a judgement of the action alone (its type, concurrency, timeout,
  what the build is configured with, what the runner learned of its type), with
  no I/O, callable from any thread; the last runner of a list takes every action.
- ``placement`` says where the action's run goes: in-line on the scheduler's
  thread, or handed to a worker thread (which may be queued ahead of a free
  ``-j`` place unless the run ``holds_place`` until it is reaped, as a command
  does); ``off_machine``: its work runs elsewhere (the cluster). A runner that
  runs nothing itself (the cache) has ``AHEAD``: it is asked before the first
  runner after it that takes the action, on that runner's thread.
- ``start`` is called once per action, on the thread its placement chose (or a
  worker thread when an ``offer`` said so). It returns None when the action is
  now the runner's: exactly one completion of it is posted to the scheduler's
  inbox (``Shared.done``; a command an ``ENDED`` first), whatever goes wrong.
  Only a runner ``AHEAD`` may return a ``Decision`` instead: it passes the
  action on (a cache miss; the decision may say why it did not serve it).
- ``offer`` is asked on the scheduler's thread when an action is started, for
  each runner ``AHEAD`` in turn: None, it took the action (as ``start``); a
  ``Decision``, it passed it on; ``Later``, it is asked again by ``start``,
  where the run goes or on a worker thread. A runner that is not ahead is never
  offered an action.
- ``cancel`` stops what runs out of kiln's process (the build was interrupted);
  ``shutdown`` releases what the runner holds at the end of every build. Both are
  called in list order; neither raises for a runner that never started anything.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol, TypeVar

from kiln.engine.incremental import Decision
from kiln.graph import BuildAction


@dataclass(frozen=True)
class Placement:
    """Where a runner's run of one action goes (see the module's invariants)."""

    in_line: bool = False
    holds_place: bool = False
    off_machine: bool = False
    ahead: bool = False


ON_A_WORKER = Placement()
AHEAD = Placement(ahead=True)


class Later(enum.Enum):
    """An ``offer`` not decided on the scheduler's thread: asked again by ``start``
    where the run goes (``WHERE_IT_RUNS``) or on a worker thread (``ON_A_WORKER``,
    even for an in-line run: what it would do there is too long for that thread)."""

    WHERE_IT_RUNS = "where it runs"
    ON_A_WORKER = "on a worker"


class Takes(Protocol):
    """What picking a runner asks of it."""

    def takes(self, action: BuildAction) -> bool: ...


class Runner(Takes, Protocol):
    """One place an action's work can run (see the module's invariants). A class
    may inherit from it for the defaults: never offered, nothing to cancel or
    release."""

    def placement(self, action: BuildAction) -> Placement: ...

    def start(self, action: BuildAction, decision: Decision) -> Decision | None: ...

    def offer(
        self, action: BuildAction, decision: Decision, place: Placement
    ) -> Decision | Later | None:
        """Asked on the scheduler's thread, for a runner ``AHEAD`` only, of an action
        that runs as ``place`` says."""
        return Later.WHERE_IT_RUNS

    def cancel(self) -> None:
        """The build was interrupted: stop what runs out of kiln's process."""
        return

    def shutdown(self, interrupted: bool) -> None:
        """The build ended: release what this runner holds."""
        return


T = TypeVar("T", bound=Takes)


def first_taking(runners: Iterable[T], action: BuildAction) -> T:
    """The first of ``runners`` that takes ``action`` (the last takes every one)."""
    for runner in runners:
        if runner.takes(action):
            return runner
    raise LookupError(f"no runner takes '{action.desc}'")  # a list without a last resort
