"""kiln's exceptions.

Library code raises these; only the command line turns them into exit codes.

    KilnError                      base of everything kiln raises on purpose
    ├── BuildDefinitionError       the build module is wrong (exit 2): cycle,
    │   │                          duplicate path, escaping path, unknown file,
    │   │                          missing source, conflicting cl_arg, ...
    │   └── UsageError             the command line is wrong (exit 2)
    ├── ActionFailed               an action ran and failed (exit 1)
    │   ├── ToolError              an external tool (compiler, importer,
    │   │                          downloader) reported a failure
    │   ├── WorkerCrashed          its worker process died (signal, os._exit)
    │   ├── ActionTimeout          it ran past its timeout and was killed
    │   └── ConfinementError       a write would leave the output tree (a
    │                              link, or the wrong kind of file, in the way)
    ├── DependenceException        not run because something it depends on failed
    ├── StateError                 the state database (or another of kiln's
    │                              own files) cannot be used
    └── NotRegularFile             a file kiln would read is not a regular file

``BuildInterrupted`` (SIGHUP, SIGINT, SIGPIPE or SIGTERM) derives from
``KeyboardInterrupt``, so code that stops on Ctrl-C stops on it too; a
``KeyboardInterrupt`` that is not a ``BuildInterrupted`` was raised by code, not
by a signal.
"""

from __future__ import annotations


class KilnError(Exception):
    """Base class of the exceptions kiln raises deliberately."""


class BuildDefinitionError(KilnError):
    """The build definition is invalid; the message says what to change."""


class UsageError(BuildDefinitionError):
    """The command line is invalid; the message says which option to fix."""


class ActionFailed(KilnError):
    """An action ran and failed; the message says why."""


class ToolError(ActionFailed):
    """An external tool failed; the message carries its diagnostics."""


class WorkerCrashed(ActionFailed):
    """The worker process running an action died (signal, os._exit, OOM)."""


class ActionTimeout(ActionFailed):
    """An action ran past its timeout and was killed."""


class DependenceException(KilnError):
    """Set as an action's failure when a dependency of it failed, so it never ran."""


class ConfinementError(ActionFailed):
    """Writing an output would go through a link or over the wrong kind of file."""


class StateError(KilnError):
    """The state database is unusable (corrupt, foreign, or unwritable), or one of
    kiln's own files is a link or the wrong kind of file."""


class NotRegularFile(KilnError):
    """A file kiln would read (an output, a state file) is not a regular file."""


class BuildInterrupted(KeyboardInterrupt):
    """The build was stopped by a signal; ``signum`` says which."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by signal {signum}")
        self.signum = signum
