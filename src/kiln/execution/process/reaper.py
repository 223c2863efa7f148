"""No process of a build outlives it.

While a build runs, kiln is a child subreaper on Linux (``prctl(PR_SET_CHILD_SUBREAPER)``):
a process an action started and left behind is re-parented to kiln rather than to
init when its parent exits, even when it daemonized (``setsid``, a double fork,
``&`` in a shell script). So every process of the build stays a descendant of
kiln, found by walking ``/proc``; kiln kills and reaps what is left when a command
ends and when the build ends, however it ends.

kiln reaps only processes it knows it did not start itself (adopted ones, or ones it
has just killed at the end), so that ``subprocess`` never loses the exit status of
a child it waits for.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time
from collections.abc import Callable, Collection, Iterable
from types import TracebackType

_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37
_REAP_WAIT_S = 2.0


def _prctl(option: int, arg: int | ctypes.c_int | object) -> int:
    libc = ctypes.CDLL(None, use_errno=True)
    return int(libc.prctl(option, arg, 0, 0, 0))


def set_subreaper(on: bool) -> bool | None:
    """Make this process a child subreaper (or stop); return the previous setting,
    or None where that is not possible (not Linux, or refused)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        previous = ctypes.c_int(0)
        if _prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(previous)) != 0:
            return None
        if _prctl(_PR_SET_CHILD_SUBREAPER, int(on)) != 0:
            return None
    except (OSError, AttributeError):
        return None
    return bool(previous.value)


def _stat(pid: int) -> tuple[str, int, int] | None:
    """(state, parent pid, process group) of ``pid``, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[1]), int(fields[2])


def _children_of(pid: int) -> list[int] | None:
    """The children of ``pid`` from ``/proc/PID/task/*/children``; None if the kernel
    does not provide those files."""
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return []
    kids: list[int] = []
    found = False
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children") as f:
                kids += [int(k) for k in f.read().split()]
            found = True
        except FileNotFoundError:
            continue
        except OSError:
            found = True
    return kids if found or not tasks else None


def _parents() -> dict[int, list[int]]:
    """Every process's children, from each process's ``stat`` (the slow way)."""
    tree: dict[int, list[int]] = {}
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                st = _stat(int(entry))
                if st is not None:
                    tree.setdefault(st[1], []).append(int(entry))
    return tree


def descendants(root: int, skip: Iterable[int] = ()) -> list[int]:
    """The live and zombie descendants of ``root``, not entering ``skip``'s subtrees."""
    skipped = set(skip)
    found: list[int] = []
    tree: dict[int, list[int]] | None = None
    todo = [root]
    while todo:
        pid = todo.pop()
        kids = _children_of(pid) if tree is None else tree.get(pid, [])
        if kids is None:
            tree = _parents()
            kids = tree.get(pid, [])
        for kid in kids:
            if kid not in skipped:
                found.append(kid)
                todo.append(kid)
    return found


def describe(pid: int) -> str:
    """``pid (command line)`` for a message."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().rstrip(b"\0").replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        argv = ""
    return f"{pid} ({argv[:120] or '?'})"


def _has_env(pid: int, entry: bytes) -> bool | None:
    """Whether ``pid``'s environment holds ``entry``; None when it cannot be told yet
    (a live process mid-``exec`` shows an empty environment for a moment)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            env = f.read()
    except OSError:
        env = b""
    if env:
        return entry in env.split(b"\0")
    return False if is_zombie(pid) else None


def is_zombie(pid: int) -> bool:
    st = _stat(pid)
    return st is None or st[0] in "ZX"


def kill_and_reap(pids: Iterable[int]) -> None:
    """SIGKILL ``pids`` and reap those that are (or become, by re-parenting) this
    process's children; wait a bounded time for them to go."""
    pending = set(pids)
    for pid in pending:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signal.SIGKILL)
    me = os.getpid()
    deadline = time.monotonic() + _REAP_WAIT_S
    while pending and time.monotonic() < deadline:
        for pid in list(pending):
            st = _stat(pid)
            if st is not None and st[0] in "ZX" and st[1] == me:
                with contextlib.suppress(ChildProcessError):
                    os.waitpid(pid, os.WNOHANG)
                st = _stat(pid)
            if st is None:
                pending.discard(pid)
        if pending:
            time.sleep(0.01)


def kill_leftovers(env_entry: str, skip: Collection[int] = ()) -> list[str]:
    """Kill the descendants of kiln that carry ``env_entry`` (``NAME=VALUE``) in their
    environment: what a command left running. Returns how each live one reads (pid
    and command line). ``skip``: kiln's children known to be other commands, still
    running (their environment is not read).

    Not its process group: the command's own process is reaped by now, so its pid,
    and with it the group's number, may already belong to another command.
    """
    entry = env_entry.encode()
    found: list[str] = []
    for _ in range(5):  # a process can move under kiln while its parent exits
        roots = _tagged_children(entry, skip)
        stray = roots + [pid for root in roots for pid in descendants(root)]
        if not stray:
            break
        found += [describe(pid) for pid in stray if not is_zombie(pid)]
        kill_and_reap(stray)
    return found


def _tagged_children(entry: bytes, skip: Collection[int]) -> list[int]:
    """kiln's children that carry ``entry``: the command's own process is gone, so
    what it left hangs under kiln, and the top of each such subtree is kiln's child
    (cheaper than walking every descendant). Two listings, since one can miss a
    child while the list changes; a child caught mid-``exec`` is looked at again."""
    me = os.getpid()
    deadline = time.monotonic() + _REAP_WAIT_S
    while True:
        first, second = _children_of(me), _children_of(me)
        if first is None or second is None:  # no such files: the slow way
            children = set(descendants(me))
        else:
            children = set(first) | set(second)
        children.difference_update(skip)
        seen = {pid: _has_env(pid, entry) for pid in children}
        if None not in seen.values() or time.monotonic() > deadline:
            return [pid for pid, tagged in seen.items() if tagged]
        time.sleep(0.005)


def _own_helpers() -> set[int]:
    """kiln's own long-lived helper processes: multiprocessing's resource tracker,
    and its fork server, the clean template kiln's process workers fork from
    (``kiln.execution.process.template``), which lives as long as kiln's process."""
    tracker = sys.modules.get("multiprocessing.resource_tracker")
    server = sys.modules.get("multiprocessing.forkserver")
    pids = (
        getattr(getattr(tracker, "_resource_tracker", None), "_pid", None),
        getattr(getattr(server, "_forkserver", None), "_forkserver_pid", None),
    )
    return {pid for pid in pids if isinstance(pid, int)}


class BuildReaper:
    """For the duration of a build: kiln is a subreaper, and at the end every
    process the build started that is still there is killed and reaped.

    Invariant: processes that existed before the build (and their subtrees), and
    the pids ``keep`` returns, are never touched.
    """

    def __init__(self, warn: Callable[[str], None], keep: Callable[[], Iterable[int]] = set):
        self._warn = warn
        self._keep = keep
        self._previous: bool | None = None
        self._before: set[int] = set()

    def __enter__(self) -> BuildReaper:
        self._before = set(descendants(os.getpid()))
        self._previous = set_subreaper(True)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.sweep()
        finally:
            if self._previous is not None:
                set_subreaper(self._previous)

    def sweep(self) -> None:
        """Kill and reap what the build left; warn about the ones still running."""
        skip = self._before | _own_helpers() | set(self._keep())
        stray = descendants(os.getpid(), skip)
        if not stray:
            return
        running = [describe(pid) for pid in stray if not is_zombie(pid)]
        kill_and_reap(stray)
        if running:
            self._warn(
                f"warning: {len(running)} process(es) the build started were still running "
                f"when it ended; killed: {', '.join(running)}"
            )
