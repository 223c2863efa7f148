"""Commands without a thread each: started with ``posix_spawn``, reaped in one place.

A ``CommandRunner`` starts a command (no shell of its own: the argv as given, in
the directory and with the environment the action gives it, in a new session,
both output streams straight into a log file by the spawn's file actions, so
kiln reads none of it; ``kiln.execution.process.posix_spawn``) and returns at
once. One place waits for every command it started at once (a ``pidfd`` each,
in one ``epoll``; where the kernel has no pidfds, a small thread per command
waits instead), enforces their timeouts by killing their process group, reaps
them, kills what each left running (found through the tag in its environment,
as ``kiln.execution.process.reaper`` does),
and reports the end to the command's ``on_exit``. That place is the scheduler's
own thread when it ``attach``es as the runner's driver and calls ``drive``
whenever it waits (no thread hands the GIL back and forth with it), else a
reaper thread of the runner's own.

The runner reaps only the processes it started, by pid, so the ``subprocess``
calls of other actions keep the exit status of theirs.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import heapq
import itertools
import os
import queue
import select
import signal
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from kiln.execution.process.groups import kill_group
from kiln.execution.process.posix_spawn import find_program, spawn
from kiln.execution.process.reaper import kill_leftovers

# The environment variable that marks every process of one command.
COMMAND_TAG = "KILN_COMMAND_ID"
# Reset to their default in the command, as ``subprocess`` does (kiln ignores them).
_DEFAULT_SIGNALS = tuple(
    s for s in (signal.SIGPIPE, getattr(signal, "SIGXFSZ", None)) if s is not None
)
# The reaper thread ends after this long with nothing to wait for.
_IDLE_S = 2.0


@dataclass(frozen=True)
class Ended:
    """How a command ended: ``returncode`` as ``subprocess`` gives it (``-N``: killed
    by signal N), whether it ran past its timeout, and how each process it left
    running (and kiln killed) reads."""

    returncode: int
    timed_out: bool
    left: list[str]


@dataclass(eq=False)
class _Command:
    pid: int
    tag: str
    on_exit: Callable[[Ended], None]
    timed_out: bool = False


@dataclass(order=True)
class _Deadline:
    at: float
    seq: int
    command: _Command = field(compare=False)


def _inherited_fds() -> tuple[int, ...]:
    """Descriptors above 2 that a spawned program would inherit: ones kiln itself
    inherited (``subprocess`` closes them in its children; so does the runner)."""
    try:
        fds = [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return ()
    found = []
    for fd in fds:
        if fd > 2:
            with contextlib.suppress(OSError):
                if os.get_inheritable(fd):
                    found.append(fd)
    return tuple(found)


class CommandRunner:
    """Starts commands and reaps them on one thread.

    Invariants: ``_live`` holds exactly the commands started and not yet reaped,
    by pid; the reaper thread runs whenever ``_live`` is not empty (``_reaping``),
    and it alone reaps them and calls their ``on_exit``, exactly once each.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._live: dict[int, _Command] = {}
        self._deadlines: list[_Deadline] = []
        self._seq = itertools.count()
        self._reaping = False
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        self._exited: queue.SimpleQueue[tuple[_Command, int]] = queue.SimpleQueue()
        self._pidfds = hasattr(os, "pidfd_open") and hasattr(select, "epoll")
        self._by_fd: dict[int, _Command] = {}
        self._epoll: select.epoll | None = None
        if self._pidfds:
            self._epoll = select.epoll()
            self._epoll.register(self._wake_r, select.EPOLLIN)
        self._close_fds = _inherited_fds()
        # (pid, descriptor of /proc/PID/task/PID/children), opened when first needed.
        self._children = (-1, -1)
        self._closed = False
        self._driven = False  # a driver thread reaps (``drive``): no reaper thread
        # Where each program was found, by (name, PATH): found once per build.
        self._programs: dict[tuple[str, str], str] = {}

    # -- a driver instead of the reaper thread -----------------------------------------

    def attach(self) -> bool:
        """Make the calling thread the one that reaps: from now on it must call
        ``drive`` whenever it waits, until ``detach``. False (and nothing changes)
        where that cannot be: no pidfds, or a reaper thread already runs."""
        with self._lock:
            if self._reaping or self._epoll is None or not self._pidfds or self._closed:
                return False
            self._driven = True
            return True

    def detach(self) -> None:
        """The driver stops reaping: a reaper thread takes over what still runs."""
        with self._lock:
            self._driven = False
            if self._live and not self._reaping:
                self._start_reaper()

    def drive(self, timeout: float) -> int:
        """(The driver) Wait up to ``timeout`` seconds for commands to end, or for
        ``wake``; reap those that ended and call their ``on_exit`` here. Returns how
        many ended."""
        with self._lock:
            timeout = self._expire(time.monotonic(), timeout)
        ended = self._wait(timeout)
        for i, (command, status) in enumerate(ended):
            try:
                self._ended(command, status)
            except BaseException:  # Ctrl-C here: the next ``drive`` reports the rest
                for rest in ended[i + 1 :]:
                    self._exited.put(rest)
                raise
        return len(ended)

    def wake(self) -> None:
        """Cut short a ``drive`` waiting on another thread."""
        self._wake()

    # -- starting ------------------------------------------------------------------

    def spawn(
        self,
        argv: list[str],
        *,
        env: Sequence[bytes],
        path: str,
        cwd: str,
        log_fd: int,
        tag: str,
        timeout: float | None,
        on_exit: Callable[[Ended], None],
    ) -> int:
        """Start ``argv`` in ``cwd`` with the environment ``env`` (``NAME=VALUE``
        entries) and ``COMMAND_TAG=tag``, its program found on ``path``, stdout and
        stderr on ``log_fd``; return its pid. ``on_exit`` is called once, on the
        reaper thread, after it ended. Raises OSError when it cannot start."""
        program = self._programs.get((argv[0], path))
        if program is None:
            program = self._programs[argv[0], path] = find_program(argv[0], path)
        out = log_fd if log_fd > 2 else fcntl.fcntl(log_fd, fcntl.F_DUPFD_CLOEXEC, 3)
        try:
            pid = spawn(
                program,
                argv,
                [*env, f"{COMMAND_TAG}={tag}".encode()],
                cwd=cwd,
                out_fd=out,
                close_fds=self._close_fds,
                default_signals=_DEFAULT_SIGNALS,
            )
        finally:
            if out != log_fd:
                os.close(out)
        command = _Command(pid, tag, on_exit)
        with self._lock:
            self._live[pid] = command
            if timeout is not None:
                deadline = _Deadline(time.monotonic() + timeout, next(self._seq), command)
                heapq.heappush(self._deadlines, deadline)
            if not self._reaping and not self._driven:
                self._start_reaper()
        self._watch(command)
        if timeout is not None:
            self._wake()
        return pid

    def _start_reaper(self) -> None:
        """Start the reaper thread (under ``_lock``); look again for inherited
        descriptors, for the commands started from now on."""
        self._close_fds = _inherited_fds()
        self._reaping = True
        threading.Thread(target=self._reap_loop, name="kiln-reaper", daemon=True).start()

    def _watch(self, command: _Command) -> None:
        """Have the reaper thread learn when ``command`` exits."""
        if self._epoll is not None and self._pidfds:
            try:
                fd = os.pidfd_open(command.pid)
            except OSError as e:  # none here after all (or none left): a thread waits
                self._pidfds = e.errno != errno.ENOSYS
            else:
                with self._lock:
                    self._by_fd[fd] = command
                self._epoll.register(fd, select.EPOLLIN)
                return
        threading.Thread(target=self._wait_one, args=(command,), daemon=True).start()

    def _wait_one(self, command: _Command) -> None:
        """Where there are no pidfds: wait for one command on a thread of its own."""
        self._exited.put((command, _waitpid(command.pid)))
        self._wake()

    def _wake(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            os.write(self._wake_w, b"x")

    # -- stopping ------------------------------------------------------------------

    def running(self) -> set[int]:
        """The pids of the commands started and not yet reaped."""
        with self._lock:
            return set(self._live)

    def kill_all(self, sig: int = signal.SIGKILL) -> None:
        """Signal every running command's process group (the reaper reports them)."""
        for pid in self.running():
            kill_group(pid, sig)

    def close(self) -> None:
        """No more commands: the reaper ends once those running ended, and the
        runner's descriptors are closed."""
        with self._lock:
            self._closed = True
            self._driven = False
            if self._live and not self._reaping:
                self._start_reaper()
            if not self._reaping:
                self._release()
        self._wake()

    def _release(self) -> None:
        """Close the runner's descriptors (under ``_lock``, with no reaper running)."""
        for fd in (self._wake_r, self._wake_w, self._children[1]):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._children = (-1, -1)
        if self._epoll is not None:
            self._epoll.close()

    # -- the reaper thread -----------------------------------------------------------

    def _reap_loop(self) -> None:
        idle_since: float | None = None
        while True:
            now = time.monotonic()
            with self._lock:
                wait = self._expire(now, _IDLE_S)
                if self._live:
                    idle_since = None
                elif self._closed or (idle_since is not None and now - idle_since >= _IDLE_S):
                    self._reaping = False
                    if self._closed:
                        self._release()
                    return
                elif idle_since is None:
                    idle_since = now
            for command, status in self._wait(wait):
                self._ended(command, status)

    def _expire(self, now: float, wait: float) -> float:
        """Kill the commands past their deadline (under ``_lock``); how long to wait
        for the next command to end: ``wait`` seconds at most, not past the next
        deadline."""
        while self._deadlines and (
            self._live.get(self._deadlines[0].command.pid) is not self._deadlines[0].command
            or self._deadlines[0].at <= now
        ):
            command = heapq.heappop(self._deadlines).command
            if self._live.get(command.pid) is command and not command.timed_out:
                command.timed_out = True
                kill_group(command.pid)
        if self._deadlines:
            wait = min(wait, self._deadlines[0].at - now)
        return max(0.0, wait)

    def _wait(self, timeout: float) -> list[tuple[_Command, int]]:
        """The commands that exited within ``timeout`` seconds, reaped, with status."""
        if self._epoll is not None:
            events = self._epoll.poll(timeout)
        else:
            ready, _, _ = select.select([self._wake_r], [], [], timeout)
            events = [(fd, 0) for fd in ready]
        done: list[tuple[_Command, int]] = []
        for fd, _ in events:
            if fd == self._wake_r:
                with contextlib.suppress(BlockingIOError):
                    os.read(self._wake_r, 4096)
                continue
            with self._lock:
                command = self._by_fd.pop(fd)
            done.append((command, _waitpid(command.pid, fd)))
            self._epoll.unregister(fd)  # type: ignore[union-attr]
            os.close(fd)
        while True:
            try:
                done.append(self._exited.get_nowait())
            except queue.Empty:
                return done

    def _no_strays(self, running: set[int]) -> bool:
        """Whether kiln has no child but the commands ``running``: then nothing was
        left. A process orphaned under kiln (a subreaper) is re-parented to its
        leader thread, whose children one ``pread`` lists (twice: a listing can miss
        a child while the list changes). False when that cannot be told."""
        pid = os.getpid()
        if self._children[0] != pid:
            with contextlib.suppress(OSError):
                os.close(self._children[1])
            try:
                fd = os.open(f"/proc/{pid}/task/{pid}/children", os.O_RDONLY | os.O_CLOEXEC)
            except OSError:
                fd = -1
            self._children = (pid, fd)
        fd = self._children[1]
        try:
            return fd >= 0 and all(
                running.issuperset(int(k) for k in os.pread(fd, 1 << 16, 0).split())
                for _ in range(2)
            )
        except (OSError, ValueError):
            return False

    def _ended(self, command: _Command, status: int) -> None:
        """After ``command`` was reaped: kill what it left, then report."""
        with self._lock:
            del self._live[command.pid]
            running = set(self._live)
        left = (
            []
            if self._no_strays(running)
            else kill_leftovers(f"{COMMAND_TAG}={command.tag}", skip=running)
        )
        try:
            command.on_exit(Ended(status, command.timed_out, [] if command.timed_out else left))
        except BaseException:  # noqa: BLE001 - on_exit reports its own failures; a bug here
            traceback.print_exc()  # must not stop the reaping of every other command


def _waitpid(pid: int, pidfd: int = -1) -> int:
    """Reap ``pid`` (through its ``pidfd`` where given: immune to the pid's reuse);
    its return code as ``subprocess`` gives it. One reaped elsewhere (the end-of-build
    sweep, after an interrupt) counts as killed."""
    try:
        if pidfd >= 0 and hasattr(os, "P_PIDFD"):
            info = os.waitid(os.P_PIDFD, pidfd, os.WEXITED)
            if info is None:  # cannot be: the pidfd said it exited
                return -signal.SIGKILL
            return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return -signal.SIGKILL
    return os.waitstatus_to_exitcode(status)
