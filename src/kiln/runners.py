"""Where actions run: worker threads, worker processes, or in-line.

``ThreadWorkers`` starts daemon threads as actions arrive, at most ``-j`` of
them; each runs one action at a time. A PROCESS action's thread hands the action's thunk to a
``ProcessPool`` and waits. Workers of the process pool run one thunk at a time,
so when one dies only the action it was running fails, and a fresh worker
replaces it.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import queue
import signal
import threading
import time
from collections.abc import Callable
from multiprocessing import get_context
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Any

from kiln._reaper import reap_group
from kiln.errors import ActionFailed, ActionTimeout, WorkerCrashed


class RemoteError(ActionFailed):
    """An exception raised in a worker process that could not be sent back as itself."""

    def __init__(self, type_name: str, message: str, remote_traceback: str):
        super().__init__(f"{type_name}: {message}")
        self.type_name = type_name
        self.remote_traceback = remote_traceback


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
    def __init__(self, ctx: Any):
        from kiln._worker import worker_main

        self.conn, child = ctx.Pipe()
        self.process: BaseProcess = ctx.Process(target=worker_main, args=(child,), daemon=True)
        self.process.start()
        child.close()

    def kill(self) -> None:
        if self.process.pid is not None:
            kill_group(self.process.pid)
        self.process.join(5)
        if self.process.pid is not None:
            reap_group(self.process.pid)  # its group's members kiln, a subreaper, adopted
        self.conn.close()


class ProcessPool:
    """Spawned worker processes running one pickled thunk at a time.

    Invariant: a worker is either idle (in ``_idle``) or owned by exactly one
    running action; a worker whose action crashed or timed out is discarded.
    """

    def __init__(self) -> None:
        self._ctx = get_context("spawn")
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._busy: set[_Worker] = set()
        self._closed = False

    def run(self, thunk: Callable[[], Any], desc: str, timeout: float | None) -> None:
        """Run ``thunk`` in a worker; raise what it raised, or why the worker died."""
        import cloudpickle

        try:
            payload = cloudpickle.dumps(thunk)
        except Exception as e:
            raise ActionFailed(f"cannot send '{desc}' to a worker process: {e}") from e
        worker = self._acquire()
        healthy = False
        try:
            worker.conn.send_bytes(payload)
            reply = self._await(worker, desc, timeout)
            healthy = True
        finally:
            self._release(worker, healthy)
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
            if self._idle:
                worker = self._idle.pop()
                self._busy.add(worker)
                return worker
        worker = _Worker(self._ctx)  # outside the lock: workers start in parallel
        with self._lock:
            self._busy.add(worker)
            closed = self._closed
        if closed:
            self._release(worker, healthy=False)
            raise ActionFailed("the build is stopping")
        return worker

    def _release(self, worker: _Worker, healthy: bool) -> None:
        with self._lock:
            self._busy.discard(worker)
            if healthy and not self._closed:
                self._idle.append(worker)
                return
        worker.kill()

    def shutdown(self) -> None:
        """Stop every worker, killing busy ones with their children."""
        with self._lock:
            self._closed = True
            workers = self._idle + list(self._busy)
            self._idle.clear()
        for w in workers:
            w.kill()


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
