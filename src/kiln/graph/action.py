"""Actions: the work that produces a graph's files (``BuildAction``), where they run
(``ActionConcurrency``), and the kind of action whose work is one command
(``SpawnsCommand``)."""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable
from typing import Any, ClassVar

from kiln.base.errors import BadNeed, BuildDefinitionError
from kiln.base.modnames import stable_module_name
from kiln.base.terminal import printable
from kiln.devices.identity import parse_need
from kiln.graph.definition_site import DefinitionSite
from kiln.graph.host import GraphHost, RunServices
from kiln.graph.nodes import BuildDependency


class ActionConcurrency(enum.Enum):
    """Where an action runs: a worker thread, a worker process, or in-line."""

    THREAD = "thread"
    PROCESS = "process"
    NONE = "none"

    def __str__(self) -> str:
        return self.value


_BASE_ATTRS = frozenset(
    {
        "executor",
        "deps",
        "start_time",
        "invoke_time",
        "finish_time",
        "failure",
        "_metadata",
        "desc",
        "concurrency",
        "def_site",
        "timeout",
        "pool",
        "always_run",
        "exclusive",
        "cacheable",
        "reproducible",
        "remember_failures",
        "needs",
    }
)


class BuildAction(BuildDependency):
    """Work that produces files. Override ``_invoke`` (runs in kiln's process) or
    ``_remotable_thunk`` (returns a picklable no-argument callable run in a worker).

    Class attributes a subclass may set: ``VERSION`` (bump to invalidate old
    results), ``key_exclude`` (names of attributes kept out of the key),
    ``always_run`` (never skipped, never cached), ``cacheable`` (False: its results
    never go into nor come from the shared cache), ``timeout`` (seconds), ``pool``
    (name of a resource pool bounding how many run at once: ``--pool NAME=N``),
    ``exclusive`` (with a pool: run alone in it, never beside another member),
    ``needs`` (a device it runs on, ``cuda:sm_90``: ``kiln.devices.identity``; its key holds
    the device's id, a cluster runs it where that device is, and where there is
    none it is skipped, or fails with ``--require-devices``),
    ``reproducible`` (False: its outputs are expected to differ from run to run or
    machine to machine, as a benchmark's timings do: ``--check-reproducible``
    skips it, and its results never leave this machine's cache),
    ``remember_failures`` (False: a failure may pass by itself, as a download's
    may, so it is retried on every build; by default a failure that will recur with
    the same key is not run again: ``kiln.engine.failures``),
    ``relative_paths`` (True: a PROCESS action's thunk names its files relative to
    the output directory, ``BuildFile.action_path``, and runs there, as kiln's own
    actions do; by default its worker runs in the directory the build was started
    in, as iree.build's workers do: ``kiln.planning.sandbox.runs_in_output_dir``).

    ``timeout`` holds for every THREAD and PROCESS action: a process is killed, a
    thread abandoned (it cannot be killed). An in-line (NONE) action runs on the
    scheduler's own thread, which kiln cannot abandon: a timeout on one is refused
    before the build starts, unless the action enforces it itself
    (``enforces_own_timeout``, as ``run_command`` does by killing its command).
    """

    VERSION: ClassVar[int] = 1
    # Attributes left out of the default params(): what cannot change the outputs.
    key_exclude: ClassVar[tuple[str, ...]] = ()
    always_run: bool = False
    cacheable: bool = True
    reproducible: bool = True
    remember_failures: bool = True
    relative_paths: ClassVar[bool] = False
    # True: an action whose device is absent runs anyway and says so in its own
    # result (verify, benchmark); False: the scheduler skips it.
    records_absence: ClassVar[bool] = False
    timeout: float | None = None
    enforces_own_timeout: ClassVar[bool] = False
    pool: str | None = None
    exclusive: bool = False
    needs: str | None = None

    def __init__(
        self,
        *,
        desc: str,
        executor: GraphHost,
        concurrency: ActionConcurrency = ActionConcurrency.THREAD,
        deps: Iterable[BuildDependency] | None = None,
        needs: str | None = None,
    ):
        super().__init__(executor=executor, deps=deps)
        self.desc = desc
        if needs is not None:
            try:
                parse_need(needs)
            except BadNeed as e:
                raise BuildDefinitionError(f"'{desc}': needs={needs!r}: {e}") from None
            self.needs = needs
        self.concurrency = concurrency
        self.def_site = DefinitionSite.capture(self)
        self._run_context: RunServices = executor.run_context
        self._graph.add_action(self)

    @property
    def run_context(self) -> RunServices:
        """The reporter, the logs and the subprocess tracking of the build running
        this action."""
        return self._run_context

    def __str__(self) -> str:
        # How the action reads wherever kiln shows it: one line, no raw control.
        return printable(self.desc, one_line=True)

    def __repr__(self) -> str:
        return f"Action[{type(self).__name__}]('{self}')"

    @property
    def action_type(self) -> str:
        """The class's module and name (a build module's by its file's name: the
        same in every checkout)."""
        cls = type(self)
        return f"{stable_module_name(cls.__module__)}.{cls.__qualname__}"

    def params(self) -> dict[str, Any] | None:
        """The parameters that, with the inputs' contents and the action's code,
        decide the outputs. Return None to always run.

        The default takes every attribute the instance holds, except kiln's own,
        those named with a leading underscore and those the class lists in
        ``key_exclude``. Each value is put in canonical form (``kiln.planning.canonical``);
        one that has none is a build-definition error, never silently left out.
        """
        if self.always_run:
            return None
        exclude = self.key_exclude
        out: dict[str, Any] = {"desc": self.desc}
        for name, value in vars(self).items():
            if name in _BASE_ATTRS or name[0] == "_" or name in exclude:
                continue
            out[name] = value
        return out

    def check_timeout(self) -> None:
        """Raise BuildDefinitionError unless ``timeout`` is None or a positive number
        that kiln can enforce for this action's concurrency."""
        if self.timeout is None:
            return
        if (
            isinstance(self.timeout, bool)
            or not isinstance(self.timeout, int | float)
            or not (self.timeout > 0)
        ):
            raise BuildDefinitionError(
                f"{self.def_site}: '{self.desc}': timeout must be a positive number of "
                f"seconds or None, got {self.timeout!r}"
            )
        if self.concurrency is ActionConcurrency.NONE and not self.enforces_own_timeout:
            raise BuildDefinitionError(
                f"{self.def_site}: '{self.desc}' is an in-line (ActionConcurrency.NONE) "
                f"action with a timeout of {self.timeout:g} s, which kiln cannot enforce: "
                "it runs on the scheduler's own thread; use ActionConcurrency.THREAD or "
                "PROCESS, or drop the timeout"
            )

    def check_runnable(self) -> None:
        """Raise BuildDefinitionError if this action cannot run as declared. Called
        before a build that needs it starts; listing the graph never calls it."""

    def _invoke(self) -> None:
        self._remotable_thunk()()

    def _remotable_thunk(self) -> Callable[[], None]:
        """A picklable no-argument callable that performs the action out of process."""
        raise NotImplementedError(f"Action '{self}' does not implement remotable invocation")


# What a command action hands back when its command ended: the rest of its work
# (the checks, committing its output), which raises the action's failure.
Finish = Callable[[], None]
# Called once when the command ended, with that rest and the bytes the command
# wrote (a hint: a large output is better committed and hashed off the reaper).
Finished = Callable[[Finish, int], None]


class SpawnsCommand:
    """An action whose work is one command run by the build's ``CommandStarter``
    (``kiln.execution.process.CommandRunner``): ``spawn`` starts it and returns at once; its
    ``finished`` is called once, on the runner's reaper thread, when the command
    ended. ``spawn`` raises (``ActionFailed``) when the command cannot start, and
    then never calls ``finished``."""

    def spawn(self, finished: Finished) -> None:
        raise NotImplementedError
