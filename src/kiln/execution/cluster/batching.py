"""Handing tasks to Dask in batches, and taking results back in batches.

kiln's ``-j`` worker threads each wait for one action, so ``-j`` bounds what is in
flight; but a ``submit`` and a ``result`` per action cost the scheduler a graph
update and the client a gather round trip each. ``Batcher`` turns them into one
``client.map`` for whatever the threads queued meanwhile (one per resource set),
and one ``client.gather`` for whatever finished meanwhile (``as_completed``). A
thread waits on its ``Slot``: the result, or the future (which failed, or was
cancelled or lost) whose own ``result()`` then says what went wrong.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kiln.execution.cluster.task import RemoteTask, run_task

_LIVE = ("running", "connecting")
_ORPHAN_S = 3.0  # a worker may be restarting: how long no worker may take a task


@dataclass(eq=False)
class Slot:
    """One task's way through the batcher. ``done`` is set once ``value`` (the
    result), ``future`` (to ask for its failure) or ``error`` (a submission that
    failed) says how it ended."""

    task: RemoteTask
    key: str
    resources: tuple[tuple[str, int], ...]
    done: threading.Event = field(default_factory=threading.Event)
    future: Any = None
    value: Any = None
    error: BaseException | None = None

    def finish(self, error: BaseException | None = None) -> None:
        if error is not None and self.value is None:
            self.error = error
        self.done.set()


class Batcher:
    """A submitting thread and a collecting thread for one Dask client.

    Invariants: a queued slot is submitted once, in the order queued; every
    submitted slot's ``done`` is set when its future ends or the batcher closes;
    ``on_submit`` sees each future before it can finish.
    """

    def __init__(self, client: Any, retries: int, on_submit: Callable[[Any], None]):
        from distributed import as_completed

        self.client = client
        self.retries = retries
        self._on_submit = on_submit
        self._cond = threading.Condition()
        self._queue: list[Slot] = []
        self._slots: dict[str, Slot] = {}  # submitted, by key
        self._closed = False
        self._completed = as_completed([], loop=client.loop, with_results=False)
        self._threads = [
            threading.Thread(target=t, name=f"kiln-dask-{t.__name__}", daemon=True)
            for t in (self._submitting, self._collecting)
        ]
        for t in self._threads:
            t.start()

    def submit(self, slot: Slot) -> None:
        with self._cond:
            if self._closed:
                slot.finish(RuntimeError("the Dask client is closed"))
                return
            self._queue.append(slot)
            self._cond.notify_all()

    def wait(self, slot: Slot, orphaned: Callable[[Slot], str | None] = lambda s: None) -> None:
        """Wait until ``slot`` is done; if the client stops meanwhile, or ``orphaned``
        says for ``_ORPHAN_S`` that no worker can take it, the slot ends with the
        reason (a scheduler cancels neither by itself)."""
        since: float | None = None
        while not slot.done.wait(1.0):
            if self.client.status not in _LIVE:
                slot.finish(ConnectionError(f"the Dask client is {self.client.status}"))
                continue
            why = orphaned(slot) if slot.value is None else None
            since = None if why is None else since or time.monotonic()
            if why is not None and since is not None and time.monotonic() - since > _ORPHAN_S:
                with contextlib.suppress(Exception):
                    if slot.future is not None:
                        self.client.cancel([slot.future], force=True)
                slot.finish(LookupError(why))

    def _submitting(self) -> None:
        while True:
            with self._cond:
                while not self._queue and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
                batch, self._queue = self._queue, []
            groups: dict[tuple[tuple[str, int], ...], list[Slot]] = {}
            for slot in batch:
                groups.setdefault(slot.resources, []).append(slot)
            for resources, slots in groups.items():
                self._map(slots, dict(resources) or None)

    def _map(self, slots: list[Slot], resources: dict[str, int] | None) -> None:
        try:
            futures = self.client.map(
                run_task,
                [s.task for s in slots],
                key=[s.key for s in slots],
                pure=False,
                retries=self.retries,
                resources=resources,
            )
        except Exception as e:  # noqa: BLE001 - the client's failure is each task's
            for s in slots:
                s.finish(e)
            return
        with self._cond:
            for s, f in zip(slots, futures, strict=True):
                s.future = f
                self._slots[s.key] = s
                self._on_submit(f)
            self._completed.update(futures)
            self._cond.notify_all()

    def _collecting(self) -> None:
        while True:
            with self._cond:
                while self._completed.is_empty() and not self._closed:
                    self._cond.wait(0.5)
                if self._closed:
                    return
            try:
                batch = self._completed.next_batch(block=True)
            except StopIteration:
                continue
            self._deliver(batch)

    def _deliver(self, batch: list[Any]) -> None:
        finished = [f for f in batch if f.status == "finished"]
        values: list[Any] = []
        if finished:
            with contextlib.suppress(Exception):  # each asks its own future, then
                values = self.client.gather(finished)
        by_key = dict(zip((f.key for f in finished), values, strict=False))
        with self._cond:
            slots = [self._slots.pop(f.key, None) for f in batch]
        for f, slot in zip(batch, slots, strict=True):
            if slot is not None:
                slot.value = by_key.get(f.key)
                slot.finish()

    def close(self) -> None:
        """Stop both threads; every slot not yet done ends as closed."""
        with self._cond:
            self._closed = True
            pending = [*self._queue, *self._slots.values()]
            self._queue, self._slots = [], {}
            self._cond.notify_all()
        for slot in pending:
            slot.finish(RuntimeError("the Dask client is closed"))
        for t in self._threads:
            t.join(5)
