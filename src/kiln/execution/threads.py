"""Worker threads for the actions that run in kiln's process: ``ThreadWorkers``
starts daemon threads as actions arrive, at most ``-j`` of them, each running one
action at a time; ``run_with_deadline`` bounds one THREAD action's time."""

from __future__ import annotations

import contextvars
import queue
import threading
import time
from collections.abc import Callable

from kiln.base.errors import ActionFailed, ActionTimeout

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

    thread = threading.Thread(
        target=body, name=f"{threading.current_thread().name}-timed", daemon=True
    )
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise ActionTimeout(
            f"'{desc}' ran past its timeout of {timeout:g} s; its thread cannot be killed "
            "and was abandoned (it may still be running in the background)"
        )
    if outcome and outcome[0] is not None:
        raise outcome[0]
