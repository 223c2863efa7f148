"""kiln's exceptions, all of them, and the exit status each one means.

Library code raises these; only the command line turns them into exit codes,
reading each exception's ``exit_code`` (0 built, 1 an action failed, 2 the build
definition, the command line or kiln's own state must be fixed, 128 + N stopped
by signal N).

    KilnError                      base of everything kiln raises on purpose (1)
    ├── BuildDefinitionError       the build module is wrong (2; also a
    │   │                          RuntimeError, as iree.build's): cycle,
    │   │                          duplicate path, escaping path, unknown file,
    │   │                          missing source, conflicting cl_arg, a timeout
    │   │                          on an action that cannot be stopped, ...
    │   └── UsageError             the command line is wrong (2)
    ├── ActionFailed               an action ran and failed (1)
    │   ├── ToolError              an external tool (compiler, importer,
    │   │   │                      downloader, command) reported a failure
    │   │   ├── VerificationFailed a compiled module's outputs differ from
    │   │   │                      the reference
    │   │   └── ToolMissing        a tool it runs is not installed or not found
    │   ├── WorkerCrashed          its worker process died (signal, os._exit)
    │   ├── ActionTimeout          it ran past its timeout and was stopped
    │   ├── RemoteError            a worker's exception that could not travel
    │   │                          back as itself
    │   ├── ClusterFailure         it failed on the Dask cluster, or the
    │   │                          cluster failed it
    │   ├── ConfinementError       a write would leave the output tree (a
    │   │                          link, the wrong kind of file, a user's
    │   │                          file in the way)
    │   └── UnchangedFailure       not run: it failed with the same key in an
    │                              earlier build (kiln.engine.failures)
    ├── DependenceException        not run because something it depends on failed (1)
    ├── StateError                 the state database (or another of kiln's
    │                              own files) cannot be used (2)
    ├── OutputDirLocked            another build holds the output directory (2)
    ├── OutputLost                 kiln's standard output cannot be written (1)
    ├── NotRegularFile             a file kiln would read is not a regular file (1)
    └── HelpShown                  ``--help`` was answered; not an error (its status)

    BuildInterrupted (a KeyboardInterrupt)   stopped by signal N (128 + N)

``BuildInterrupted`` (SIGHUP, SIGINT, SIGPIPE or SIGTERM) derives from
``KeyboardInterrupt``, so code that stops on Ctrl-C stops on it too; a
``KeyboardInterrupt`` that is not a ``BuildInterrupted`` was raised by code, not
by a signal.

Three signals never leave kiln: ``Unkeyable`` (a parameter value has no canonical
form; turned into a ``BuildDefinitionError`` naming the action and parameter),
``BadNeed`` (a device need that is not ``kind[:arch]``; turned into a
``BuildDefinitionError`` or ``UsageError`` naming where it was given) and
``Untrusted`` (the state database failed kiln's integrity check; it is moved
aside). They are plain exceptions so that no ``except KilnError`` takes them for
a user-facing error.
"""

from __future__ import annotations

import signal
import traceback
from typing import Any


class KilnError(Exception):
    """Base class of the exceptions kiln raises deliberately. ``exit_code`` is the
    command line's exit status when this error ends it."""

    exit_code: int = 1


class BuildDefinitionError(KilnError, RuntimeError):
    """The build definition is invalid; the message says what to change. Also a
    ``RuntimeError``, as iree.build's are: build modules written for it catch
    ``RuntimeError`` from ``allocate_file`` (a path defined twice) and ``file``."""

    exit_code = 2


class UsageError(BuildDefinitionError):
    """The command line is invalid; the message says which option to fix."""

    exit_code = 2


class ActionFailed(KilnError):
    """An action ran and failed; the message says why."""

    exit_code = 1


class ToolError(ActionFailed):
    """An external tool failed; the message carries its diagnostics. ``returncode``
    is the tool's exit status when it ran and failed (``-N``: killed by signal N),
    else None; it survives pickling (a worker process sends it back)."""

    def __init__(self, message: str, returncode: int | None = None):
        super().__init__(message)
        self.returncode = returncode


class VerificationFailed(ToolError):
    """A compiled module's outputs differ from a reference; ``result`` is the
    verification's JSON result."""

    def __init__(self, message: str, result: dict[str, Any]):
        super().__init__(message)
        self.result = result

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.result))


class ToolMissing(ToolError):
    """A tool the action runs is not installed, or not where it should be: the
    machine, not the action, must change (so the failure is never remembered)."""


class WorkerCrashed(ActionFailed):
    """The worker process running an action died (signal, os._exit, OOM)."""


class ActionTimeout(ActionFailed):
    """An action ran past its timeout and was stopped (its process killed, or its
    thread abandoned)."""


class RemoteError(ActionFailed):
    """An exception raised in a worker process that could not be sent back as itself."""

    def __init__(self, type_name: str, message: str, remote_traceback: str):
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.remote_traceback = remote_traceback

    def __reduce__(self) -> tuple[Any, ...]:
        message = str(self).removeprefix(f"{self.type_name}: ")
        return (type(self), (self.type_name, message, self.remote_traceback))


class ConfinementError(ActionFailed):
    """Writing an output would go through a link, over the wrong kind of file, or
    over a file of the user's."""


class ClusterFailure(ActionFailed):
    """An action sent to the Dask cluster failed there, or the cluster failed it (a
    worker died, the scheduler was lost, a sandbox could not be made). What a worker
    reports comes back as text, so the action's own failure cannot be told from
    the worker's machine: such a failure is never remembered."""


class DeviceAbsent(ActionFailed):
    """An action needs a device that no machine of the build has, and
    ``--require-devices`` makes that a failure (``kiln.devices.identity``)."""


class UnchangedFailure(ActionFailed):
    """Set as an action's failure when it was not run because it failed with the
    same key in an earlier build (``kiln.engine.failures``). The message is that
    failure's, as it was shown; ``log`` the path of that run's log (or None),
    ``failed_at`` when it failed (epoch seconds), ``result`` the JSON result the
    failure carried (a verification's), if any, ``detail`` what ``-v`` showed of
    it (its traceback) when that said more than the message, ``why`` why that
    failure was remembered."""

    def __init__(
        self,
        message: str,
        log: str | None = None,
        failed_at: float = 0.0,
        result: dict[str, Any] | None = None,
        detail: str | None = None,
        why: str = "",
    ):
        super().__init__(message)
        self.log = log
        self.failed_at = failed_at
        self.result = result
        self.detail = detail
        self.why = why


class DependenceException(KilnError):
    """Set as an action's failure when a dependency of it failed, so it never ran."""

    exit_code = 1


class StateError(KilnError):
    """The state database is unusable (corrupt, foreign, or unwritable), or one of
    kiln's own files is a link or the wrong kind of file."""

    exit_code = 2


class OutputDirLocked(KilnError):
    """Another build holds the output directory and the caller chose not to wait."""

    exit_code = 2


class OutputLost(KilnError):
    """kiln's standard output cannot be written (closed, a full disk): what it had to
    say is lost, and the command says so rather than end in a traceback."""

    exit_code = 1


class NotRegularFile(KilnError):
    """A file kiln would read (an output, a state file) is not a regular file."""

    exit_code = 1


class HelpShown(KilnError):
    """``--help`` (or argparse's own exit) was answered; the command ends with
    ``exit_code``, which is this instance's status."""

    def __init__(self, status: int):
        super().__init__(status)
        self.exit_code = status


def signal_name(signum: int) -> str:
    """``SIGTERM``, ``SIGRTMIN+3``; ``signal N`` for a number no name is known for."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        low, high = getattr(signal, "SIGRTMIN", 0), getattr(signal, "SIGRTMAX", -1)
        return f"SIGRTMIN+{signum - low}" if low < signum < high else f"signal {signum}"


class BuildInterrupted(KeyboardInterrupt):
    """The build was stopped by a signal; ``signum`` says which, ``exit_code``
    is 128 + ``signum``."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal_name(signum)}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class BadNeed(ValueError):
    """A device need (or a ``KILN_DEVICES`` entry) that is not ``kind[:arch]``."""


class Unkeyable(Exception):
    """A value with no canonical form; ``where`` is its place inside the parameter
    (``[2].name``), ``type_name`` its type, ``hint`` a more precise fix if any."""

    def __init__(self, type_name: str, where: str = "", hint: str = ""):
        super().__init__(type_name)
        self.type_name = type_name
        self.where = where
        self.hint = hint

    def inside(self, step: str) -> Unkeyable:
        """This error, found one step (``[2]``, ``.name``) further out."""
        self.where = step + self.where
        return self


class Untrusted(Exception):
    """The state database failed kiln's integrity check; it is moved aside."""


class TemplateGone(Exception):
    """The template process is not there to fork a worker (``kiln.execution.process.pool``
    starts another)."""


class SandboxFailure(Exception):
    """A Dask worker could not prepare an action's sandbox or store its outputs
    (``kiln.execution.cluster.task``; Dask retries it on another worker)."""


def error_text(error: BaseException | None, verbose: int = 0) -> str:
    """How a failure reads: kiln's own errors by message, others with a traceback."""
    if error is None:
        return ""
    if isinstance(error, UnchangedFailure):  # not run: the failure it had, as then
        return (error.detail or str(error)) if verbose else str(error)
    remote = getattr(error, "remote_traceback", None)
    if remote is not None:  # raised in a worker process: the exception, or its traceback
        if verbose:
            return str(remote).rstrip()
        if isinstance(error, KilnError):
            return str(error)
        return f"{type(error).__name__}: {error}"
    if isinstance(error, KilnError) and not verbose:
        return str(error)
    return "".join(traceback.format_exception(error)).rstrip()
