"""Turning what the scheduler does into events: the one place that knows how an
action, its decision and its outcome read as a ``BuildEvent``."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kiln.base import events as ev
from kiln.base.errors import UnchangedFailure, error_text
from kiln.engine.incremental import action_id
from kiln.graph import BuildAction, BuildDependency
from kiln.planning.plan import Plan, node_name

if TYPE_CHECKING:
    from kiln.engine.incremental import Decision
    from kiln.engine.result import BuildResult, NodeRun
    from kiln.state import Produced


class BuildEmitter:
    """Emits the events of one build on ``stream``.

    Invariants: ``id_of(a)`` is the state id of planned action ``a``; each
    planned action gets at most one ending event (``events.ENDINGS``), and
    ``build_finished`` gives the rest a ``not_run``. ``planned`` events are made
    only when a reader asks for them (``wants_planned``): a no-op build of many
    actions makes one event per action, not two.
    """

    def __init__(
        self,
        stream: ev.EventStream,
        plan: Plan,
        runs: Mapping[BuildDependency, NodeRun] | None = None,
        explain: bool = False,
    ):
        self.stream = stream
        self.plan = plan
        self._explain = explain  # the build says why each action runs
        self._runs = runs if runs is not None else {}  # each node's record (its times)
        self._ids: dict[BuildAction, str] = {}
        self._lanes: dict[BuildAction, str] = {}
        self._ended: set[BuildAction] = set()
        self._info: dict[BuildAction, tuple[str, str | None]] = {}

    def _action_event(self, kind: str, action: BuildAction, **fields: Any) -> ev.BuildEvent:
        info = self._info.get(action)
        if info is None:
            outputs = self.plan.outputs[action]
            target = ev.target_of((outputs[0].path,)) if outputs else None
            info = self._info[action] = (action.action_type, target)
        return ev.BuildEvent(
            kind,
            action=self.id_of(action),
            desc=action.desc,
            type=info[0],
            target=info[1],
            subject=action,
            explain=self._explain,
            **fields,
        )

    def build_started(self, jobs: int) -> None:
        actions = self.plan.actions
        data = {
            "schema": ev.SCHEMA,
            "actions": len(actions),
            "jobs": jobs,
            "pid": os.getpid(),
            "targets": [node_name(n) for n in self.plan.requested],
        }
        self.stream.emit(ev.BuildEvent(ev.BUILD_STARTED, data=data, subject=set(self.plan.order)))
        if any(getattr(r, "wants_planned", False) for r in self.stream.readers):
            for action in actions:
                self.stream.emit(
                    self._action_event(ev.PLANNED, action, deps=self._producers(action))
                )

    def id_of(self, action: BuildAction) -> str:
        aid = self._ids.get(action)
        if aid is None:
            aid = self._ids[action] = action_id(action, self.plan.outputs[action])
        return aid

    def all_ids(self) -> dict[BuildAction, str]:
        for action in self.plan.actions:
            self.id_of(action)
        return self._ids

    def _producers(self, action: BuildAction) -> list[str]:
        """The ids of the actions whose outputs ``action`` reads."""
        return [
            self.id_of(p)
            for f in self.plan.inputs[action]
            for p in f.deps
            if isinstance(p, BuildAction) and p in self.plan.outputs
        ]

    def started(self, action: BuildAction, decision: Decision, lane: str | None = None) -> None:
        """``lane``: where it runs, when not on this thread (a command's slot)."""
        name = threading.current_thread().name
        lane = lane or ("main" if name == "MainThread" else name)
        self._lanes[action] = lane
        self.stream.emit(
            self._action_event(
                ev.STARTED,
                action,
                time=self._times(action)[0] or time.time(),
                lane=lane,
                key=decision.key,
                reason=decision.reason,
                deps=self._producers(action),
            )
        )

    def note(self, text: str) -> None:
        """A line for the user, as a ``note`` event."""
        self.stream.emit(ev.BuildEvent(ev.NOTE, data={"text": text}))

    def set_lane(self, action: BuildAction, lane: str) -> None:
        """Where ``action`` really ran (a cluster's worker), for its end event."""
        self._lanes[action] = lane

    def up_to_date(self, action: BuildAction, decision: Decision) -> None:
        """The one event of an action a no-op build has: made without the caches of
        ``_action_event``, since no other event of this action follows."""
        self._ended.add(action)
        aid = self._ids.setdefault(action, decision.action_id)
        info = self._info.get(action)
        if info is None:
            outputs = self.plan.outputs[action]
            target = ev.target_of((outputs[0].path,)) if outputs else None
            info = (action.action_type, target)
        self.stream.emit(
            ev.BuildEvent(
                ev.UP_TO_DATE,
                action=aid,
                desc=action.desc,
                type=info[0],
                target=info[1],
                subject=action,
                key=decision.key,
            )
        )

    def cached(
        self,
        action: BuildAction,
        decision: Decision,
        outputs: Produced,
        start: float,
        lane: str = "main",
    ) -> None:
        """An action's outputs came from the cache (materialized since ``start``)."""
        self._ended.add(action)
        files, size = _describe(outputs)
        now = time.time()
        self.stream.emit(
            self._action_event(
                ev.CACHED,
                action,
                time=now,
                lane=lane,
                key=decision.key,
                reason=decision.reason,
                start=start,
                duration=now - start,
                outputs=files,
                bytes=size,
                deps=self._producers(action),
            )
        )

    def finished(self, action: BuildAction, decision: Decision, produced: Produced) -> None:
        self._ended.add(action)
        files, size = _describe(produced)
        self.stream.emit(
            self._action_event(
                ev.FINISHED,
                action,
                time=self._times(action)[1] or time.time(),
                **self._ran(action),
                key=decision.key,
                reason=decision.reason,
                outputs=files,
                bytes=size,
            )
        )

    def failed(self, action: BuildAction, decision: Decision, error: BaseException) -> None:
        self._ended.add(action)
        if isinstance(error, UnchangedFailure):
            self._failed_unchanged(action, decision, error)
            return
        short, full = error_text(error), error_text(error, verbose=1)
        self.stream.emit(
            self._action_event(
                ev.FAILED,
                action,
                time=self._times(action)[1] or time.time(),
                **self._ran(action),
                key=decision.key,
                reason=decision.reason,
                error=short,
                traceback=full if full != short else None,
                root_cause=self.id_of(action),
            )
        )

    def _failed_unchanged(
        self, action: BuildAction, decision: Decision, error: UnchangedFailure
    ) -> None:
        """A ``failed`` event for an action not run: it failed with the same key in
        an earlier build, whose error and log it carries."""
        self.stream.emit(
            self._action_event(
                ev.FAILED,
                action,
                key=decision.key,
                reason=decision.reason,
                error=str(error),
                traceback=error.detail,
                root_cause=self.id_of(action),
                log=error.log,
                unchanged=True,
            )
        )

    def not_run(self, action: BuildAction, why: str, root: BuildAction | None = None) -> None:
        if action in self._ended:
            return
        self._ended.add(action)
        self.stream.emit(
            self._action_event(
                ev.NOT_RUN, action, error=why, root_cause=self.id_of(root) if root else None
            )
        )

    def would_run(self, action: BuildAction, decision: Decision) -> None:
        self._ended.add(action)
        self.stream.emit(
            self._action_event(ev.WOULD_RUN, action, key=decision.key, reason=decision.reason)
        )

    def build_finished(self, result: BuildResult) -> None:
        for action in result.not_run:
            self.not_run(action, "not started: the build stopped")
        counts = {
            "built": len(result.built),
            "up_to_date": len(result.skipped),
            "cached": len(getattr(result, "cached", ())),
            "failed": len(result.failed),
            "failed_unchanged": len(result.unchanged()),
            "not_run": len(result.not_run),
            "would_run": len(result.would_run),
        }
        data = {
            "ok": result.ok,
            "interrupted": result.interrupted,
            "wall_s": round(result.wall_s, 6),
            "counts": counts,
        }
        self.stream.emit(ev.BuildEvent(ev.BUILD_FINISHED, data=data))

    def _times(self, action: BuildAction) -> tuple[float | None, float | None]:
        run = self._runs.get(action)
        return (run.start_time, run.finish_time) if run is not None else (None, None)

    def _ran(self, action: BuildAction) -> dict[str, Any]:
        start, end = self._times(action)
        return {
            "lane": self._lanes.get(action, "main"),
            "start": start,
            "duration": (end - start) if start is not None and end is not None else None,
            "log": getattr(action, "log_path", None) or None,
        }


def _describe(produced: Produced) -> tuple[list[dict[str, Any]], int]:
    files = [
        {"path": f.path, "namespace": f.namespace.value, "sha256": digest, "bytes": skey[0]}
        for f, (skey, digest) in produced.items()
    ]
    return files, sum(skey[0] for skey, _ in produced.values())
