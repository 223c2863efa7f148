"""What a running action reaches besides its own definition: the reporter, the
place of its log, its files' persistent metadata, the environment and directory
its programs run in, and the tracking of the subprocesses it starts (so that
Ctrl-C kills them)."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from kiln.base.action_env import ActionEnvironment
from kiln.devices.identity import DeviceSet, local_set
from kiln.execution.command_logs import LogSpools
from kiln.execution.process.commands import CommandRunner
from kiln.execution.process.groups import kill_group
from kiln.graph.progress import ProgressReporter
from kiln.output_dir.layout import LaidOut, OutputLayout

if TYPE_CHECKING:
    from kiln.graph.host import KeyedFile, Node
    from kiln.graph.meta import BuildFileMetadata
    from kiln.state import StateStore


class RunContext:
    """The run-time services of one executor's builds.

    Invariant: ``_subprocesses`` holds exactly the tracked subprocesses that an
    action started and has not yet said ended; it is read and written under
    ``_lock`` (actions run on several threads).
    """

    def __init__(
        self,
        layout: OutputLayout,
        reporter: ProgressReporter,
        store: Callable[[], StateStore],
    ) -> None:
        self.layout = layout
        self.reporter = reporter
        self._store = store
        self._subprocesses: set[subprocess.Popen[bytes]] = set()
        self._commands: CommandRunner | None = None
        self._spools: LogSpools | None = None
        self._lock = threading.Lock()
        self._metadata_lock = threading.RLock()
        # What every command and worker process of a build sees (``kiln.base.action_env``).
        self.environment = ActionEnvironment()
        # The devices this build's checks run on: this machine's, or the cluster's.
        self.devices: DeviceSet = local_set()
        self._scratch: str | None = None
        # The directory the build runs from (this process's working directory when
        # it starts): where a PROCESS action of iree.build's kind runs
        # (``kiln.planning.sandbox.runs_in_output_dir``).
        self.start_dir = os.getcwd()
        self._encoded: dict[frozenset[tuple[str, str]], tuple[list[bytes], str]] = {}

    @property
    def output_dir(self) -> Path:
        return self.layout.output_dir

    def log_path(self, f: LaidOut) -> str:
        """The log file of the action producing ``f`` (its directory made)."""
        return self.layout.log_path(f)

    def old_log(self, f: LaidOut) -> str | None:
        """The log an earlier build left for ``f``'s action, if any."""
        return self.layout.old_log(f)

    @property
    def work_dir(self) -> str:
        """Where commands and kiln's own worker processes run: the output directory,
        so that the relative paths they are given name their files."""
        return str(self.layout.output_dir)

    def scratch_dir(self) -> str:
        """The ``HOME`` and ``TMPDIR`` of the build's programs: ``.kiln/tmp``, made
        empty when a build first asks (what an earlier build's programs left there
        goes)."""
        with self._lock:
            if self._scratch is None:
                path = self.layout.kiln_dir / "tmp"
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                self.layout.ensure_dir(path)
                self._scratch = str(path)
            return self._scratch

    def process_env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """The whole environment of a program run for an action (``extra``: the
        action's own variables)."""
        return self.environment.variables(self.scratch_dir(), extra)

    def command_env(self, extra: Mapping[str, str] | None = None) -> tuple[list[bytes], str]:
        """``process_env(extra)`` as ``NAME=VALUE`` entries, and its PATH (made once
        per build and set of extra variables: commands are many)."""
        key = frozenset(extra.items()) if extra else frozenset()
        found = self._encoded.get(key)
        if found is None:
            env = self.process_env(extra)
            entries = [os.fsencode(f"{k}={v}") for k, v in env.items()]
            found = self._encoded[key] = (entries, env.get("PATH", ""))
        return found

    def progress(self, action: Node, done: int, total: int | None) -> None:
        """Byte progress of a running action (a download), for the display."""
        self.reporter.progress(action, done, total)

    def write_status(self, message: str) -> None:
        self.reporter.message(message)

    def file_metadata(
        self, f: KeyedFile, mutate: Callable[[BuildFileMetadata], bool] | None
    ) -> BuildFileMetadata:
        """``f``'s small persistent metadata, changed by ``mutate`` under a lock."""
        with self._metadata_lock:
            return self._store().file_metadata(f.key, mutate)

    def track(self, proc: subprocess.Popen[bytes], running: bool) -> None:
        """Note a subprocess started (or ended) by an action, to kill it on interrupt."""
        with self._lock:
            if running:
                self._subprocesses.add(proc)
            else:
                self._subprocesses.discard(proc)

    @property
    def commands(self) -> CommandRunner:
        """What starts and reaps the commands of actions (``run_command``)."""
        with self._lock:
            if self._commands is None:
                self._commands = CommandRunner()
            return self._commands

    def command_runner(self) -> CommandRunner:
        """``commands``, as a callable the engine is handed."""
        return self.commands

    def program_setting(self) -> tuple[dict[str, str], str, str]:
        """Where an action's programs run: their environment, working directory and
        the directory the build runs from (``start_dir``)."""
        return self.process_env(), self.work_dir, self.start_dir

    @property
    def spools(self) -> LogSpools:
        """The files commands print into while they run (``.kiln/spool/``)."""
        with self._lock:
            if self._spools is None:
                self._spools = LogSpools(self._spool_dir)
            return self._spools

    def _spool_dir(self) -> Path:
        path = self.layout.kiln_dir / "spool"
        self.layout.ensure_dir(path)
        return path

    def end_build(self) -> None:
        """The build ended: its command runner goes (its reaper thread and
        descriptors with it), and its spools; the next build makes new ones."""
        with self._lock:
            commands, self._commands = self._commands, None
            spools, self._spools = self._spools, None
            self._scratch = None
            self._encoded = {}
        if commands is not None:
            commands.close()
        if spools is not None:
            spools.close()
        self.layout.end_build()

    def kill_subprocesses(self) -> None:
        with self._lock:
            procs = list(self._subprocesses)
            commands = self._commands
        for proc in procs:
            kill_group(proc.pid)
        if commands is not None:
            commands.kill_all()
