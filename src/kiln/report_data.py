"""What ``kiln report`` shows, read back from the last build's record.

The last build's events (``.kiln/last-events.jsonl``, see ``kiln.trace.LastBuild``)
and the manifest are turned into a ``BuildReport``: the actions that ran with
their lanes and times, the critical path, the failures and the artifacts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln import events as ev
from kiln.errors import StateError
from kiln.layout import MANIFEST
from kiln.trace import LAST_EVENTS

_LOG_TAIL_LINES = 40


@dataclass
class ActionRun:
    """One action that ran (or came from the cache) in the build."""

    id: str
    desc: str
    lane: str
    start: float  # seconds after the build started
    duration: float
    status: str  # finished, failed, cached, or running (never ended: a killed build)
    target: str | None = None
    type: str | None = None
    reason: str | None = None
    deps: list[str] = field(default_factory=list)
    outputs: list[dict[str, Any]] = field(default_factory=list)
    bytes: int = 0
    error: str | None = None
    log: str | None = None
    critical: bool = False


@dataclass
class BuildReport:
    """The last build. Invariant: ``runs`` is ordered by start time; ``critical``
    lists ids of ``runs``, each a dependency of the next."""

    started: float = 0.0
    wall_s: float | None = None
    ok: bool | None = None  # None: the build never recorded its end
    interrupted: bool = False
    jobs: int | None = None
    targets: list[str] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    runs: list[ActionRun] = field(default_factory=list)
    not_run: list[dict[str, Any]] = field(default_factory=list)
    critical: list[str] = field(default_factory=list)
    manifest: dict[str, Any] | None = None

    @property
    def lanes(self) -> list[str]:
        return sorted({r.lane for r in self.runs}, key=_lane_order)

    def slowest(self, n: int = 15) -> list[ActionRun]:
        return sorted(self.runs, key=lambda r: r.duration, reverse=True)[:n]

    def failures(self) -> list[ActionRun]:
        return [r for r in self.runs if r.status == ev.FAILED]


def _lane_order(lane: str) -> tuple[int, str]:
    head, _, number = lane.rpartition("-")
    return (int(number), head) if number.isdigit() else (-1, lane)


def load_report(output_dir: Path) -> BuildReport:
    """The report of the last build in ``output_dir``; StateError if there is none."""
    path = output_dir / ".kiln" / LAST_EVENTS
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise StateError(
            f"no build recorded in {output_dir} (no {path}); run 'kiln build' with "
            f"--output-dir {output_dir} first"
        ) from None
    except OSError as e:
        raise StateError(f"cannot read {path}: {e.strerror}") from e
    records = []
    for line in lines:
        try:
            records.append(json.loads(line))
        except ValueError:
            continue  # a line cut short by a killed build
    if not records or records[0].get("event") != ev.BUILD_STARTED:
        raise StateError(f"{path} does not hold a kiln build's events; run 'kiln build' again")
    report = _from_events(records)
    report.manifest = _read_manifest(output_dir / MANIFEST)
    return report


def _from_events(records: list[dict[str, Any]]) -> BuildReport:
    head = records[0]
    report = BuildReport(
        started=head["time"], jobs=head.get("jobs"), targets=list(head.get("targets", []))
    )
    t0 = report.started
    runs: dict[str, ActionRun] = {}
    for rec in records[1:]:
        kind = rec.get("event")
        aid = rec.get("action")
        if kind == ev.STARTED and aid:
            runs[aid] = ActionRun(
                aid,
                rec.get("desc", aid),
                rec.get("lane", "main"),
                rec["time"] - t0,
                0.0,
                "running",
                rec.get("target"),
                rec.get("type"),
                rec.get("reason"),
                list(rec.get("deps", [])),
            )
        elif kind in (ev.FINISHED, ev.FAILED, ev.CACHED) and aid:
            run = runs.get(aid)
            if run is None:  # a cache hit has no started event
                start = rec.get("start", rec["time"])
                run = runs[aid] = ActionRun(
                    aid,
                    rec.get("desc", aid),
                    rec.get("lane", "main"),
                    start - t0,
                    0.0,
                    kind,
                    rec.get("target"),
                    rec.get("type"),
                    rec.get("reason"),
                    list(rec.get("deps", [])),
                )
            run.status = kind
            run.duration = float(rec.get("duration") or 0.0)
            run.outputs = list(rec.get("outputs", []))
            run.bytes = int(rec.get("bytes") or 0)
            run.error = rec.get("error")
            run.log = rec.get("log")
        elif kind == ev.NOT_RUN:
            report.not_run.append(rec)
        elif kind == ev.BUILD_FINISHED:
            report.wall_s = rec.get("wall_s")
            report.ok = bool(rec.get("ok"))
            report.interrupted = bool(rec.get("interrupted"))
            report.counts = dict(rec.get("counts", {}))
    report.runs = sorted(runs.values(), key=lambda r: r.start)
    if report.wall_s is None:  # the build never recorded its end: killed
        report.wall_s = max(rec.get("time", t0) for rec in records) - t0
        for run in report.runs:
            if run.status == "running":  # at least until the last event
                run.duration = max(0.0, report.wall_s - run.start)
    report.critical = critical_path(report.runs)
    for run in report.runs:
        run.critical = run.id in set(report.critical)
    return report


def critical_path(runs: list[ActionRun]) -> list[str]:
    """The chain of dependent actions with the longest total duration: what bounds
    the build's wall time however many workers there are. ``runs`` in start order
    (every action starts after its dependencies ended), so one pass suffices."""
    length: dict[str, float] = {}
    via: dict[str, str | None] = {}
    for run in runs:
        best = max((d for d in run.deps if d in length), key=length.__getitem__, default=None)
        length[run.id] = run.duration + (length[best] if best is not None else 0.0)
        via[run.id] = best
    if not length:
        return []
    node: str | None = max(length, key=length.__getitem__)
    path = []
    while node is not None:
        path.append(node)
        node = via[node]
    return path[::-1]


def _read_manifest(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def log_tail(path: str | None, lines: int = _LOG_TAIL_LINES) -> str | None:
    """The last ``lines`` lines of a log file, or None when it cannot be read."""
    if not path:
        return None
    try:
        with open(path, "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", errors="replace")
    except OSError:
        return None
    return "\n".join(text.splitlines()[-lines:])
