"""The scheduler's inbox: what finished, put from any thread, taken on the
scheduler's own thread, which waits either on the queue or, while it drives the
build's ``CommandRunner``, in that runner's ``epoll`` (so that commands are reaped
on the scheduler's thread, with no second thread taking turns at the GIL)."""

from __future__ import annotations

import queue
import threading
import time
from typing import Generic, TypeVar

from kiln.execution.process.commands import CommandRunner

T = TypeVar("T")


class Completions(Generic[T]):
    """Invariant: while ``_runner`` is set, every ``put`` from another thread than
    the owner's wakes the runner, so a ``take`` waiting in ``drive`` sees it."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[T] = queue.SimpleQueue()
        self._runner: CommandRunner | None = None
        self._owner = threading.get_ident()

    def drive(self, runner: CommandRunner) -> bool:
        """Reap ``runner``'s commands on this (the owner's) thread from now on; False
        when the runner cannot be driven (it keeps its own reaper thread)."""
        if self._runner is runner:
            return True
        if self._runner is not None or not runner.attach():
            return False
        self._owner = threading.get_ident()
        self._runner = runner
        return True

    def release(self) -> None:
        """Stop driving: the runner's reaper thread takes over what still runs."""
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.detach()

    def put(self, item: T) -> None:
        self._queue.put(item)
        runner = self._runner
        if runner is not None and threading.get_ident() != self._owner:
            runner.wake()

    def take(self, timeout: float) -> list[T]:
        """Everything put so far; if nothing, wait up to ``timeout`` seconds for
        something (reaping commands meanwhile, whose ``on_exit`` may put)."""
        items = self._drain()
        if items:
            return items
        runner = self._runner
        if runner is None:
            try:
                items.append(self._queue.get(timeout=timeout))
            except queue.Empty:
                return items
            return items + self._drain()
        deadline = time.monotonic() + timeout
        while True:
            runner.drive(max(0.0, deadline - time.monotonic()))
            items = self._drain()
            if items or time.monotonic() >= deadline:
                return items

    def _drain(self) -> list[T]:
        items = []
        while True:
            try:
                items.append(self._queue.get_nowait())
            except queue.Empty:
                return items
