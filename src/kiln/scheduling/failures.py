"""Which failures are remembered: the one place that decides whether an action that
failed will fail the same way when run again with the same key.

A failure is remembered (``kiln.state``'s ``failures``) only when everything it
depended on is in the key: the action's code, parameters, inputs and tools. Then
the next build with that key does not run it again; it counts as failed
(unchanged), and ``--retry-failed`` runs it. Whatever may pass by itself next
time is retried on every build, and so is anything kiln cannot tell apart from
that: retrying costs time, remembering wrongly would hide a build that now works.
Never remembered:

- an action kiln cannot key (it runs on every build anyway), and one whose type
  says so (``remember_failures = False``: ``fetch_http``, anything that reaches
  the network);
- an interruption (Ctrl-C, a signal, ``SystemExit``), a timeout, a worker that
  died, a program killed by a signal (exit status ``-N``, or 137: a shell's
  report of a SIGKILL, the out-of-memory killer's signal);
- anything the operating system reports (``OSError``: the disk, the network,
  permissions, a limit), ``MemoryError``, an HTTP protocol error, a tool or a
  Python module that is not installed (``ToolMissing``, ``ImportError``), a
  failure on the Dask cluster, an output kiln may not write,
  kiln's own errors that are not the action's (the state, a dependency that
  failed, a file of the wrong kind);
- a failure whose message carries the operating system's words for a machine
  that ran out of something or a network that failed (a tool that found the
  disk full exits 1 like any other failure, but says so);
- any failure while the output directory's disk is full (``disk_full``: nearly no
  space or no inode free): a tool that found it full may have said so nowhere kiln
  can read (its log is on that disk too). A command's failure is judged before its
  partial output is removed (``CommandAction``).

Each exception in the chain (``__cause__``, and ``__context__`` unless the raiser
suppressed it with ``from None``) counts, so an ``ActionFailed`` raised from, or
while handling, an ``OSError`` is retried.
"""

from __future__ import annotations

import concurrent.futures
import errno
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

from kiln.errors import (
    ActionFailed,
    ActionTimeout,
    ClusterFailure,
    ConfinementError,
    KilnError,
    RemoteError,
    ToolMissing,
    UnchangedFailure,
    WorkerCrashed,
    error_text,
)
from kiln.graph import BuildAction
from kiln.incremental import Decision
from kiln.output_dir.writing import disk_full
from kiln.state import FailureRecord

# Exception types whose failure may pass by itself, with why.
_TRANSIENT: tuple[tuple[type[BaseException], str], ...] = (
    (ActionTimeout, "it ran past its timeout"),
    (WorkerCrashed, "its worker process died"),
    (RemoteError, "its worker's exception did not come back as itself"),
    (ClusterFailure, "it failed on the Dask cluster"),
    (ToolMissing, "a tool it runs is not installed here"),
    (ConfinementError, "its output could not be written where it belongs"),
    (UnchangedFailure, "it did not run"),
    (MemoryError, "it ran out of memory"),
    (ImportError, "a module it imports is not installed here"),
    (OSError, "the operating system reported an error"),
    (subprocess.TimeoutExpired, "a program it ran timed out"),
    (concurrent.futures.CancelledError, "it was cancelled"),
    (concurrent.futures.BrokenExecutor, "its worker pool broke"),
)
# The same, for types of modules that a build need not import (http.client brings
# ssl: ~10 ms of every start). An exception of such a type exists only once its
# module is imported, so one not in ``sys.modules`` cannot match.
_TRANSIENT_ELSEWHERE = (("http.client", "HTTPException", "an HTTP connection failed"),)
_ERRNOS_SAID = (
    errno.ENOSPC,
    errno.EDQUOT,
    errno.ENOMEM,
    errno.EMFILE,
    errno.ENFILE,
    errno.EAGAIN,
    errno.ECONNREFUSED,
    errno.ECONNRESET,
    errno.ECONNABORTED,
    errno.ETIMEDOUT,
    errno.EHOSTUNREACH,
    errno.ENETUNREACH,
    errno.ENETDOWN,
)
# What a program that ran out of something, or lost the network, prints (lower case).
RESOURCE_WORDS = (
    *(os.strerror(e).lower() for e in _ERRNOS_SAID),
    "out of memory",
    "std::bad_alloc",
    "temporary failure in name resolution",
    "name or service not known",
)
_SIGKILL_BY_SHELL = 128 + signal.SIGKILL
_MAX_CHAIN = 32


def retry_reason(action: BuildAction, decision: Decision, error: BaseException) -> str | None:
    """Why ``action``'s failure (``error``, with its key in ``decision``) is retried on
    every build; None when it is remembered (it fails again with the same key)."""
    if decision.params is None:
        return "kiln cannot key it"
    if not getattr(action, "remember_failures", True):
        return f"its type ({type(action).__name__}) sets remember_failures = False"
    for e in _chain(error):
        why = _transient(e)
        if why is not None:
            return why
    text = error_text(error).lower()
    said = next((words for words in RESOURCE_WORDS if words in text), None)
    if said is not None:
        return f"its error says {said!r}"
    return _disk_full(action)


def _disk_full(action: BuildAction) -> str | None:
    """Why the output directory's disk counts as full now, or None."""
    try:
        root = action.executor.layout.output_dir
    except AttributeError:
        return None
    return disk_full(root)


def _chain(error: BaseException) -> Iterator[BaseException]:
    """``error`` and the exceptions it was raised from or while handling."""
    seen: set[int] = set()
    todo = [error]
    while todo and len(seen) < _MAX_CHAIN:
        e = todo.pop()
        if id(e) in seen:
            continue
        seen.add(id(e))
        yield e
        context = None if e.__suppress_context__ else e.__context__
        todo += [c for c in (e.__cause__, context) if c is not None]


def _transient(e: BaseException) -> str | None:
    """Why ``e`` alone says the failure may pass by itself, or None."""
    if not isinstance(e, Exception):  # KeyboardInterrupt, SystemExit, ...
        return f"it was interrupted ({type(e).__name__})"
    for kind, why in _TRANSIENT:
        if isinstance(e, kind):
            return why
    for module, name, why in _TRANSIENT_ELSEWHERE:
        found = getattr(sys.modules.get(module), name, None)
        if isinstance(found, type) and isinstance(e, found):
            return why
    code = getattr(e, "returncode", None)
    if type(code) is int and (code < 0 or code == _SIGKILL_BY_SHELL):
        number = -code if code < 0 else signal.SIGKILL
        return f"a program it ran was killed by signal {number}"
    if isinstance(e, KilnError) and not isinstance(e, ActionFailed):  # not the action's
        return f"kiln stopped it ({type(e).__name__})"
    return None


def failure_record(
    action: BuildAction, decision: Decision, error: BaseException
) -> FailureRecord | None:
    """What to remember of ``action``'s failure, or None when it is retried."""
    if retry_reason(action, decision, error) is not None:
        return None
    log = getattr(action, "log_path", None)
    if not (isinstance(log, str) and os.path.isfile(log)):
        log = None  # no log of this run (a compile that could not start one, ...)
    carried = getattr(error, "result", None)
    try:
        result = json.dumps(carried) if isinstance(carried, dict) else None
    except (TypeError, ValueError):
        result = None
    short, full = error_text(error), error_text(error, verbose=1)
    return FailureRecord(
        decision.key,
        json.dumps(decision.params),
        json.dumps({**decision.inputs, **decision.run_deps}),  # ``kiln.run_deps``
        short,
        full if full != short else None,
        log,
        result,
        time.time(),
    )


def unchanged(failure: FailureRecord) -> UnchangedFailure:
    """The failure of an action not run again because of ``failure``."""
    return UnchangedFailure(
        failure.error, failure.log, failure.time, failure.carried(), failure.detail
    )
