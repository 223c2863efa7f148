"""Where actions run: worker threads, worker processes, or in-line.

``ThreadWorkers`` starts daemon threads as actions arrive, at most ``-j`` of
them; each runs one action at a time. A PROCESS action's thread hands the
action's thunk to a ``ProcessPool`` and waits. Each PROCESS action runs in a
worker of its own, forked from a clean template process (``kiln._template``), so
no action sees what an earlier one did to its process (environment, working
directory, module globals, monkey-patches), and when a worker dies only its
action fails.
"""

from __future__ import annotations

import contextlib
import contextvars
import os
import pickle
import queue
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Pipe, wait
from multiprocessing.process import BaseProcess
from typing import Any

from kiln._reaper import reap_group
from kiln.errors import ActionFailed, ActionTimeout, RemoteError, WorkerCrashed


def describe_exit(exitcode: int | None) -> str:
    if exitcode is None:
        return "an unknown status"
    if exitcode < 0:
        try:
            return f"signal {signal.Signals(-exitcode).name}"
        except ValueError:
            return f"signal {-exitcode}"
    return f"exit code {exitcode}"


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal the process group led by ``pid`` (a worker and its children)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


class _Worker:
    def __init__(self, env: dict[str, str], cwd: str):
        from kiln._template import TemplateProcess
        from kiln._worker import worker_main

        self.conn, child = Pipe()
        self.process: BaseProcess = TemplateProcess(
            target=worker_main, args=(child, env, cwd), daemon=True
        )
        self.process.start()
        child.close()
        self._stop_lock = threading.Lock()
        self._stopped = False

    def signal_kill(self) -> None:
        """Kill the worker and its process group, leaving its pipe to the thread that
        reads it (closing a descriptor another thread polls is a race on its number)."""
        if self.process.pid is not None:
            kill_group(self.process.pid)

    def stop(self) -> None:
        """Kill the worker and its process group and close its pipe, once however many
        threads ask; ``reaped`` then tells when it is gone."""
        with self._stop_lock:
            if self._stopped:
                return
            self._stopped = True
        self.signal_kill()
        self.conn.close()

    def reaped(self, wait_s: float = 0) -> bool:
        self.process.join(wait_s)
        if self.process.exitcode is None:
            return False
        if self.process.pid is not None:
            reap_group(self.process.pid)  # its group's members kiln, a subreaper, adopted
        return True

    def kill(self) -> None:
        self.stop()
        self.reaped(5)


class ProcessPool:
    """One fresh worker process per thunk, forked from a clean template.

    Invariants: a live worker is owned by exactly one running action (in
    ``_busy``); it is killed with its process group when that action ends, and
    joined later (``_dying``), so that the action's thread need not wait. Every
    worker starts with ``env`` and ``cwd``: the build's environment and working
    directory, taken when the build started.
    """

    def __init__(self, env: dict[str, str], cwd: str) -> None:
        self._env = env
        self._cwd = cwd
        self._lock = threading.Lock()
        self._busy: set[_Worker] = set()
        self._dying: list[_Worker] = []
        self._closed = False

    def run(self, thunk: Callable[[], Any], desc: str, timeout: float | None) -> None:
        """Run ``thunk`` in a worker; raise what it raised, or why the worker died."""
        import cloudpickle

        try:
            payload = cloudpickle.dumps(thunk)
        except Exception as e:
            raise ActionFailed(f"cannot send '{desc}' to a worker process: {e}") from e
        worker = self._acquire()
        try:
            worker.conn.send_bytes(payload)
            reply = self._await(worker, desc, timeout)
        finally:
            self._release(worker)
        if reply[0] != "ok":
            _, type_name, message, tb, blob = reply
            raise _rebuild_exception(type_name, message, tb, blob)

    def _await(self, worker: _Worker, desc: str, timeout: float | None) -> tuple[Any, ...]:
        ready = wait([worker.conn, worker.process.sentinel], timeout)
        if not ready:
            raise ActionTimeout(f"'{desc}' ran past its timeout of {timeout:g} s and was killed")
        if worker.conn in ready:
            try:
                return pickle.loads(worker.conn.recv_bytes())
            except (EOFError, OSError):
                pass
        worker.process.join(5)
        status = describe_exit(worker.process.exitcode)
        raise WorkerCrashed(f"the worker process running '{desc}' died with {status}")

    def _acquire(self) -> _Worker:
        with self._lock:
            if self._closed:
                raise ActionFailed("the build is stopping")
            self._dying = [w for w in self._dying if not w.reaped()]
        worker = _Worker(self._env, self._cwd)  # outside the lock: in parallel
        with self._lock:
            self._busy.add(worker)
            closed = self._closed
        if closed:
            self._release(worker)
            raise ActionFailed("the build is stopping")
        return worker

    def _release(self, worker: _Worker) -> None:
        """End ``worker`` and whatever it started: a worker runs one action only."""
        worker.stop()
        with self._lock:
            self._busy.discard(worker)
            self._dying.append(worker)

    def shutdown(self) -> None:
        """Stop every worker, killing busy ones with their children."""
        with self._lock:
            self._closed = True
            busy, workers = list(self._busy), [*self._busy, *self._dying]
            self._dying.clear()
        for w in busy:  # their actions' threads see them die and close their pipes
            w.signal_kill()
        deadline = time.monotonic() + 5
        for w in workers:
            w.reaped(max(0.0, deadline - time.monotonic()))


def _rebuild_exception(type_name: str, message: str, tb: str, blob: bytes | None) -> BaseException:
    if blob is not None:
        try:
            exc = pickle.loads(blob)
            if isinstance(exc, BaseException):
                exc.remote_traceback = tb  # type: ignore[attr-defined]
                return exc
        except Exception:  # noqa: BLE001 - fall back to the text form
            pass
    return RemoteError(type_name, message, tb)


Task = Callable[[], None]


class ThreadWorkers:
    """Up to ``count`` daemon threads running submitted callables in FIFO order.

    Threads start as work arrives: a submitted task that finds no idle thread
    starts one more, so a large ``-j`` costs only the threads the build keeps
    busy. Invariant: ``_idle`` counts the threads waiting for a task that no
    submitted task has claimed yet. Daemon threads let an interrupted build exit
    without waiting for Python code that cannot be cancelled.
    """

    def __init__(self, count: int):
        self._count = count
        self._queue: queue.SimpleQueue[Task | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()
        self._idle = 0

    @property
    def started(self) -> int:
        """How many threads were started."""
        return len(self._threads)

    def _loop(self) -> None:
        while (task := self._queue.get()) is not None:
            task()
            with self._lock:
                self._idle += 1

    def submit(self, task: Task) -> None:
        with self._lock:
            if self._idle:
                self._idle -= 1
            elif len(self._threads) < self._count:
                self._start_thread()
        self._queue.put(task)

    def _start_thread(self) -> None:
        thread = threading.Thread(target=self._loop, name=f"kiln-{len(self._threads)}", daemon=True)
        try:
            thread.start()
        except RuntimeError as e:  # the system's thread limit: make do with those running
            if not self._threads:
                raise ActionFailed(f"cannot start a worker thread: {e}") from e
            self._count = len(self._threads)
            return
        self._threads.append(thread)

    def shutdown(self, wait_s: float) -> None:
        with self._lock:
            threads = list(self._threads)
        for _ in threads:
            self._queue.put(None)
        deadline = time.monotonic() + wait_s
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))


def run_with_deadline(work: Callable[[], None], desc: str, timeout: float) -> None:
    """Run ``work`` (a THREAD action's body) on a thread of its own and wait at most
    ``timeout`` seconds for it. A Python thread cannot be killed: one still running
    then is abandoned (a daemon thread, so it never holds up kiln's exit) and the
    action fails with ActionTimeout; what it writes later goes to a temporary
    name that the next build removes, and no record ever counts it as built."""
    outcome: list[BaseException | None] = []
    context = contextvars.copy_context()  # the build's context variables, as in-line

    def body() -> None:
        try:
            context.run(work)
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - re-raised on the waiting thread
            outcome.append(e)

    thread = threading.Thread(target=body, name=f"{threading.current_thread().name}-timed",
                              daemon=True)  # fmt: skip
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise ActionTimeout(
            f"'{desc}' ran past its timeout of {timeout:g} s; its thread cannot be killed "
            "and was abandoned (it may still be running in the background)"
        )
    if outcome and outcome[0] is not None:
        raise outcome[0]
