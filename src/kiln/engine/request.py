"""What one build is asked to do, as one frozen value: the engine's front door.

``SchedulerOptions`` are the knobs of the scheduling loop; ``BuildRequest`` holds
them with everything else a build runs with (the actions' environment, the keys'
strictness, read-only, the devices, the cache, the cluster, the event readers).
The command line makes the request once from its options and hands it to
``Executor.run``, which returns the ``BuildResult`` (``kiln.engine.result``);
nothing configures the facade by assignment in between.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from kiln.base.action_env import ActionEnvironment
from kiln.base.cpus import usable_cpus

if TYPE_CHECKING:
    from kiln.base.events import EventReader
    from kiln.cache import BuildCache
    from kiln.devices.identity import DeviceSet
    from kiln.execution.cluster.offload import ClusterOffload

__all__ = ["BuildRequest", "SchedulerOptions"]


@dataclass(frozen=True)
class SchedulerOptions:
    """How the scheduling loop runs one plan (``kiln.engine.scheduler``)."""

    jobs: int = field(default_factory=usable_cpus)
    pools: Mapping[str, int] = field(default_factory=dict)
    fail_fast: bool = False
    dry_run: bool = False
    explain: bool = False
    # Start the ready action with the longest remaining path first (else: FIFO).
    critical_path: bool = True
    # Run every action a second time and compare (``kiln.engine.reproducible``); nothing
    # goes into the shared cache before its second run agreed.
    check_reproducible: bool = False
    # Run again the actions that failed with the same key before (else they count
    # as failed, unchanged: ``kiln.engine.failures``).
    retry_failed: bool = False


@dataclass(frozen=True)
class BuildRequest:
    """Everything one build runs with besides its graph and output directory.

    Invariant: frozen; what it holds by reference (the cache, the cluster, the
    event readers) the caller opened and closes, and the build only uses.
    ``devices`` None: the devices the executor already has (this machine's).
    """

    options: SchedulerOptions = field(default_factory=SchedulerOptions)
    # What every command and worker process of the build sees (``--action-env``).
    environment: ActionEnvironment = field(default_factory=ActionEnvironment)
    # True: an action kiln cannot key stops the build (``--strict-keys``); False: it
    # runs on every build, never cached, and kiln says so.
    strict_keys: bool = False
    # Nothing under the output directory is written; the state is a snapshot (the
    # commands that must create nothing, and dry runs).
    read_only: bool = False
    verbose: int = 0
    devices: DeviceSet | None = None
    cache: BuildCache | None = None  # the shared cache builds read and fill; None: off
    remote: ClusterOffload | None = None  # where remotable actions run; None: here
    # Extra readers of the build's events (``--events``, ``--profile``).
    readers: tuple[EventReader, ...] = ()

    def connected(
        self,
        remote: ClusterOffload | None,
        devices: DeviceSet,
        readers: tuple[EventReader, ...],
    ) -> BuildRequest:
        """This request with what exists only once the build holds its output
        directory: the cluster connected, its devices, the event files opened."""
        return replace(self, remote=remote, devices=devices, readers=readers)
