"""What came of a build (``BuildResult``; what it was asked is a
``kiln.engine.request.BuildRequest``): the scheduler returns the result, and the
summary, the manifest and the command line read it. Graph nodes hold definitions
only; what happened to a node in a build is its ``NodeRun`` in the result.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kiln.base.errors import UnchangedFailure

if TYPE_CHECKING:
    from kiln.graph import BuildAction, BuildDependency, BuildFile


@dataclass(slots=True)
class NodeRun:
    """What happened to one node in one build (wall-clock times, ``time.time()``).

    Invariant: ``failure`` is a ``DependenceException`` exactly when the node never
    ran because a dependency failed; ``invoke_time`` is set only for an action that
    was started."""

    start_time: float | None = None
    invoke_time: float | None = None
    finish_time: float | None = None
    failure: BaseException | None = None
    worker: str | None = None  # the Dask worker it ran on, when it ran on a cluster


@dataclass
class BuildResult:
    """What happened to each action of a plan."""

    built: list[BuildAction] = field(default_factory=list)
    cached: list[BuildAction] = field(default_factory=list)  # served from the cache
    skipped: list[BuildAction] = field(default_factory=list)
    # Root causes only; with those not run again because they failed with the same
    # key before (their error an ``UnchangedFailure``: ``unchanged()``).
    failed: list[BuildAction] = field(default_factory=list)
    not_run: list[BuildAction] = field(default_factory=list)
    # Skipped, why: their device is on no machine of the build (``kiln.devices.identity``),
    # or an action they need was skipped so. Neither failed nor not run.
    absent: dict[BuildAction, str] = field(default_factory=dict)
    would_run: list[tuple[BuildAction, str]] = field(default_factory=list)  # dry runs
    interrupted: bool = False
    wall_s: float = 0.0
    # The current digest of every file of the plan that is built (now or before):
    # outputs of built and skipped actions, and source files.
    digests: dict[BuildFile, str] = field(default_factory=dict)
    # Why each failed action failed, and why each cascaded one did not run.
    errors: dict[BuildAction, BaseException] = field(default_factory=dict)
    # Every node of the plan, with its times and failure in this build.
    runs: dict[BuildDependency, NodeRun] = field(default_factory=dict)
    # The key of every action decided in this build (``kiln.engine.incremental``).
    keys: dict[BuildAction, str] = field(default_factory=dict)
    # What ``--check-reproducible`` found not reproduced (``kiln.engine.reproducible``).
    not_reproducible: list[Any] = field(default_factory=list)
    # The actions of the graph this build did not plan: "stale" or "not built"
    # (``kiln.engine.unrequested``), for the manifest.
    unrequested: dict[BuildAction, str] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return (
            not self.failed
            and not self.not_run
            and not self.interrupted
            and not self.not_reproducible
        )

    def unchanged(self) -> list[BuildAction]:
        """The failed actions that did not run: they failed with the same key in an
        earlier build (``--retry-failed`` runs them)."""
        return [a for a in self.failed if isinstance(self.errors.get(a), UnchangedFailure)]

    def failure(self, node: BuildDependency) -> BaseException | None:
        """Why ``node`` failed or did not run in this build; None if it did not fail."""
        run = self.runs.get(node)
        return run.failure if run is not None else None
