"""Which failures are remembered: the one place that decides whether an action that
failed will fail the same way when run again with the same key (``judge``).

A failure is remembered (``kiln.state``'s ``failures``, ``remembered``) only when
kiln can put it down to what is in the key: the action's code, parameters, inputs
and tools. Then the next build with that key does not run it again; it counts as
failed (unchanged), and ``--retry-failed`` runs it. Everything else is retried on
every build: retrying costs time, remembering wrongly hides a build that now works.
The default is to retry; a failure is remembered only when it is, positively,

- a program that exited with an ordinary status of its own (1 to 125), or an
  exception the action raised itself (its code's, or kiln's ``ActionFailed`` for
  it) that is not an error of the surroundings;

and none of these is true of it (each names the reason it is retried):

- kiln cannot key the action (it runs on every build anyway), or its type says so
  (``remember_failures = False``: ``fetch_http``);
- an interruption (Ctrl-C, a signal, ``SystemExit``), a timeout, a worker that
  died, the Dask cluster, an output kiln may not write, kiln's own errors that are
  not the action's (the state, a dependency that failed, a file of the wrong kind);
- an error of the surroundings: any ``OSError`` (the disk, the network,
  permissions, a limit, a file that is not there), ``MemoryError``, a module or
  tool that is not installed, an HTTP protocol error; or a type whose name says
  so (``failure_signs.environment_name``: httpx's ``ConnectError``...);
- an exit status that is not the program's own: 126 (it could not be executed),
  127 (not installed), 128 + N (a shell's report of signal N), -N (killed by
  signal N), or anything else above 125;
- a sign of the surroundings (``kiln.engine.failure_signs``) in the error's
  message or in a bounded tail of the action's log: a machine out of memory or
  disk, a network or server that failed (an HTTP 5xx, 429 or 408, a refused or
  reset connection, a name that did not resolve), a missing program, a killed
  one; a log kiln cannot read as a regular file counts as such a sign;
- keyed parameters that name a network URL: what a server answers is not in the
  key;
- the output directory's disk is full (``disk_full``: nearly no space or no inode
  free): a tool that found it full may have said so nowhere kiln can read. A
  command's failure is judged before its partial output is removed
  (``CommandAction``).

Each exception in the chain (``__cause__``, and ``__context__`` unless the raiser
suppressed it with ``from None``) counts, so an ``ActionFailed`` raised from, or
while handling, an ``OSError`` is retried. A failure that is retried is still
written down (not remembered) with the reason, so that ``kiln explain`` can say
why it runs again.
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

from kiln.base.errors import (
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
from kiln.engine.failure_signs import TEXT_TAIL_CHARS, environment_name, log_sign, sign_in
from kiln.engine.incremental import Decision
from kiln.graph import BuildAction, SpawnsCommand
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
# The exit statuses a program reports of its own: above them a shell reports that it
# could not run the program (126), found none (127) or saw it killed (128 + N).
_OWN_STATUSES = range(1, 126)
# A network URL in an action's keyed parameters (its command line...).
_URL = re.compile(r"\b(https?|ftps?|s3|gs|wss?|ssh|rsync|git)://", re.IGNORECASE)
_MAX_CHAIN = 32


@dataclass(frozen=True)
class Verdict:
    """Whether a failure is remembered, and ``why`` (said by ``kiln explain``)."""

    remembered: bool
    why: str


def judge(action: BuildAction, decision: Decision, error: BaseException) -> Verdict:
    """Whether ``action``'s failure (``error``, with its key in ``decision``) is
    remembered, and why: retried unless kiln can put it down to its key."""
    why = _retry_reason(action, decision, error)
    if why is not None:
        return Verdict(False, why)
    return Verdict(True, _own(action, error))


def retry_reason(action: BuildAction, decision: Decision, error: BaseException) -> str | None:
    """Why ``action``'s failure is retried on every build; None when it is
    remembered (it fails again with the same key)."""
    verdict = judge(action, decision, error)
    return None if verdict.remembered else verdict.why


def _retry_reason(action: BuildAction, decision: Decision, error: BaseException) -> str | None:
    if decision.params is None:
        return "kiln cannot key it"
    if not getattr(action, "remember_failures", True):
        return f"its type ({type(action).__name__}) sets remember_failures = False"
    chain = list(_chain(error))
    for e in chain:
        why = _transient(action, e)
        if why is not None:
            return why
    for e in chain:
        why = _said(e)
        if why is not None:
            return why
    log = getattr(action, "log_path", None)
    if isinstance(log, str) and log:
        why = log_sign(log)
        if why is not None:
            return why
    url = _URL.search(json.dumps(decision.params))
    if url is not None:
        scheme = url.group(1).lower()
        return f"its parameters name a {scheme} URL: what a server answers is not in its key"
    return _disk_full(action)


def _own(action: BuildAction, error: BaseException) -> str:
    """Why ``error``, retried for none of the reasons, is ``action``'s own."""
    code = getattr(error, "returncode", None)
    if type(code) is int and code in _OWN_STATUSES:
        return (
            f"{_program(action)} exited with status {code}, and nothing it printed points "
            "at its surroundings"
        )
    return (
        f"it raised {type(error).__name__} itself, and nothing in its error points at its "
        "surroundings"
    )


def _program(action: BuildAction) -> str:
    return "the command" if isinstance(action, SpawnsCommand) else "a program it ran"


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


def _transient(action: BuildAction, e: BaseException) -> str | None:
    """Why ``e``'s type or exit status says the failure may pass by itself, or None."""
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
    if type(code) is int and code != 0 and code not in _OWN_STATUSES:
        return f"{_program(action)} {_abnormal(code)}"
    if isinstance(e, KilnError) and not isinstance(e, ActionFailed):  # not the action's
        return f"kiln stopped it ({type(e).__name__})"
    named = next((c.__name__ for c in type(e).__mro__ if environment_name(c.__name__)), None)
    if named is not None:
        return f"it raised {type(e).__name__}, an error of its surroundings ({named})"
    return None


def _abnormal(code: int) -> str:
    """What the exit status ``code`` (not 0, not 1 to 125) says of the program."""
    if code < 0:
        return f"was killed by {_signal_name(-code)}"
    if code == 126:
        return "exited with status 126 (a program it runs could not be executed)"
    if code == 127:
        return "exited with status 127 (a program it runs is not installed)"
    if code > 128 and _signal_name(code - 128, None):
        return (
            f"exited with status {code} (128 + {code - 128}: a program it runs was killed by "
            f"{_signal_name(code - 128)})"
        )
    return f"exited with status {code} (above 125: not a status a program gives of itself)"


def _signal_name(number: int, default: str | None = "") -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}" if default == "" else (default or "")


def _said(e: BaseException) -> str | None:
    """Why ``e``'s message shows a sign of the surroundings, or None. A message kiln
    cannot read (its ``__str__`` raised) rules nothing out."""
    try:
        text = str(e)[-TEXT_TAIL_CHARS:]
    except Exception:  # noqa: BLE001 - any failure of a foreign __str__
        return f"kiln cannot read its error ({type(e).__name__}): nothing is ruled out"
    said = sign_in(text)
    return None if said is None else f"its error says {said}"


def failure_record(
    action: BuildAction, decision: Decision, error: BaseException
) -> FailureRecord | None:
    """What to write down of ``action``'s failure (remembered or not, and why), or
    None for an action kiln cannot key (it has no key to compare)."""
    if decision.params is None:
        return None
    verdict = judge(action, decision, error)
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
        json.dumps({**decision.inputs, **decision.run_deps}),  # ``kiln.planning.run_deps``
        short,
        full if full != short else None,
        log,
        result,
        time.time(),
        verdict.why,
        verdict.remembered,
    )


def unchanged(failure: FailureRecord) -> UnchangedFailure:
    """The failure of an action not run again because of ``failure``."""
    return UnchangedFailure(
        failure.error, failure.log, failure.time, failure.carried(), failure.detail, failure.why
    )
