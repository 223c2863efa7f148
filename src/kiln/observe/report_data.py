"""What ``kiln report`` shows, read back from the record of the kept builds.

A kept build's events (``.kiln/last-events.jsonl`` for the last build, see
``kiln.observe.event_log.LastBuild`` for the earlier ones) and, for the last build, the
manifest are turned into a ``BuildReport``: the actions that ran with their
lanes and times, the critical path, the failures (each with the earlier kept
builds it failed in as well) and the artifacts, and a summary of every kept build.
"""

from __future__ import annotations

import datetime
import json
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.base import events as ev
from kiln.base.errors import NotRegularFile, StateError
from kiln.observe.event_log import KEPT_BUILDS, kept_events
from kiln.output_dir.layout import MANIFEST
from kiln.output_dir.ownership import open_regular, read_regular

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
    failed_before: int = 0  # in how many kept builds just before this one it failed too
    # Not run: it failed with the same key in an earlier build (its error and log are
    # that run's); it has no place on the timeline.
    unchanged: bool = False

    @property
    def why(self) -> str | None:
        """Why it ran, and whether it had failed in the builds just before."""
        if not self.failed_before:
            return self.reason
        before = (
            "the build before"
            if self.failed_before == 1
            else f"each of the {self.failed_before} builds before"
        )
        return f"{self.reason or 'not recorded'}; it failed in {before}"


@dataclass
class KeptBuild:
    """A build whose events ``.kiln/`` keeps: ``n`` builds before the last."""

    n: int
    started: float
    ok: bool | None
    interrupted: bool
    wall_s: float | None
    counts: dict[str, int]
    failed: set[str]  # ids of the actions that failed in it

    @property
    def status(self) -> str:
        """ok, failed, interrupted, or incomplete (it never recorded its end)."""
        if self.interrupted:
            return "interrupted"
        if self.ok is None:
            return "incomplete"
        return "ok" if self.ok else "failed"

    @property
    def counts_text(self) -> str:
        """Its counts that are not 0, as a person reads them (``2 built, 1 up to
        date``), or ``-``."""
        said = (f"{v} {name.replace('_', ' ')}" for name, v in self.counts.items() if v)
        return ", ".join(said) or "-"

    @property
    def started_text(self) -> str:
        """When it started, in local time (``2026-01-31 09:05:00``)."""
        when = datetime.datetime.fromtimestamp(self.started).astimezone()
        return when.strftime("%Y-%m-%d %H:%M:%S")


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
    unchanged: list[ActionRun] = field(default_factory=list)  # failed, not run again
    not_run: list[dict[str, Any]] = field(default_factory=list)
    critical: list[str] = field(default_factory=list)
    manifest: dict[str, Any] | None = None
    build: int = 0  # which kept build: 0 the last, n the one n builds before it
    kept: list[KeptBuild] = field(default_factory=list)  # every kept build, newest first

    @property
    def lanes(self) -> list[str]:
        return sorted({r.lane for r in self.runs}, key=_lane_order)

    def slowest(self, n: int = 15) -> list[ActionRun]:
        return sorted(self.runs, key=lambda r: r.duration, reverse=True)[:n]

    def failures(self) -> list[ActionRun]:
        """The actions that failed: those that ran, then those that failed unchanged."""
        return [r for r in self.runs if r.status == ev.FAILED] + self.unchanged


def _lane_order(lane: str) -> tuple[int, str]:
    head, _, number = lane.rpartition("-")
    return (int(number), head) if number.isdigit() else (-1, lane)


def load_report(output_dir: Path, build: int = 0) -> BuildReport:
    """The report of the build ``build`` builds before the last in ``output_dir``
    (0: the last); StateError if it is not kept.

    The record is read as untrusted: only a regular file is read (a FIFO there never
    blocks), undecodable bytes are replaced, and lines that are not JSON objects and
    fields of the wrong type or times out of range are left out rather than stopping
    the report."""
    path = output_dir / ".kiln" / kept_events(build)
    try:
        records = _read_records(path)
    except FileNotFoundError:
        if build:
            raise StateError(
                f"no build {build} before the last is kept in {output_dir} (kiln keeps the "
                f"last {KEPT_BUILDS}); 'kiln report --list' lists them"
            ) from None
        raise StateError(
            f"no build recorded in {output_dir} (no {path}); run 'kiln build' with "
            f"--output-dir {output_dir} first"
        ) from None
    if not _is_build(records):
        raise StateError(f"{path} does not hold a kiln build's events; run 'kiln build' again")
    report = _from_events(records)
    report.build = build
    report.kept = kept_builds(output_dir)
    for run in report.runs + report.unchanged:
        for earlier in (k for k in report.kept if k.n > build):
            if run.id not in earlier.failed or earlier.n != build + 1 + run.failed_before:
                break
            run.failed_before += 1
    report.manifest = _read_manifest(output_dir / MANIFEST) if build == 0 else None
    return report


def kept_builds(output_dir: Path) -> list[KeptBuild]:
    """A summary of each build ``.kiln/`` keeps, newest first; unreadable ones left out."""
    kept = []
    for n in range(KEPT_BUILDS):
        try:
            records = _read_records(output_dir / ".kiln" / kept_events(n))
        except (OSError, StateError):
            continue
        if not _is_build(records):
            continue
        one = _from_events(records)
        failed = {r.id for r in one.failures()}
        kept.append(
            KeptBuild(n, one.started, one.ok, one.interrupted, one.wall_s, one.counts, failed)
        )
    return kept


def _read_records(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of an events file, line by line (a line cut short by a killed
    build, or any other that is not an object, left out). FileNotFoundError when it
    is not there; StateError when it cannot be read or is not a regular file."""
    try:
        text = read_regular(path).decode("utf-8", errors="replace")
    except FileNotFoundError:
        raise
    except NotRegularFile as e:
        raise StateError(f"cannot read the build's events: {e}") from None
    except OSError as e:
        raise StateError(f"cannot read {path}: {e.strerror}") from e
    records = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


def _is_build(records: list[dict[str, Any]]) -> bool:
    return (
        bool(records)
        and records[0].get("event") == ev.BUILD_STARTED
        and _time(records[0], "time") is not None
    )


def number_at(rec: dict[str, Any], name: str) -> float | None:
    """The finite number at ``rec[name]``, else None (any record kiln reads back: an
    event, a manifest entry)."""
    value = rec.get(name)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    try:
        number = float(value)  # an int too large for a float is no number kiln reads
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _time(rec: dict[str, Any], name: str) -> float | None:
    """The point in time (seconds since the epoch) at ``rec[name]``, else None: every
    time read from a record comes through here, so each is one that can be shown
    (``kiln.base.events.is_epoch_time``)."""
    value = number_at(rec, name)
    return value if ev.is_epoch_time(value) else None


def _text(rec: dict[str, Any], name: str, default: str | None = None) -> str | None:
    value = rec.get(name)
    return value if isinstance(value, str) else default


def _texts(rec: dict[str, Any], name: str) -> list[str]:
    value = rec.get(name)
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def records_at(rec: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The objects of the list at ``rec[name]`` (anything else in it left out)."""
    value = rec.get(name)
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def _new_run(rec: dict[str, Any], aid: str, start: float, status: str) -> ActionRun:
    return ActionRun(
        aid,
        _text(rec, "desc", aid) or aid,
        _text(rec, "lane", "main") or "main",
        start,
        0.0,
        status,
        _text(rec, "target"),
        _text(rec, "type"),
        _text(rec, "reason"),
        _texts(rec, "deps"),
    )


def _from_events(records: list[dict[str, Any]]) -> BuildReport:
    head = records[0]
    t0 = _time(head, "time") or 0.0
    jobs = number_at(head, "jobs")
    report = BuildReport(
        started=t0, jobs=int(jobs) if jobs is not None else None, targets=_texts(head, "targets")
    )
    runs: dict[str, ActionRun] = {}
    for rec in records[1:]:
        kind = rec.get("event")
        aid = _text(rec, "action")
        time_ = _time(rec, "time")
        if kind == ev.STARTED and aid and time_ is not None:
            runs[aid] = _new_run(rec, aid, time_ - t0, "running")
        elif kind == ev.FAILED and rec.get("unchanged") is True and aid and time_ is not None:
            again = _new_run(rec, aid, time_ - t0, ev.FAILED)
            again.error, again.log, again.unchanged = _text(rec, "error"), _text(rec, "log"), True
            report.unchanged.append(again)
        elif kind in (ev.FINISHED, ev.FAILED, ev.CACHED) and aid and time_ is not None:
            run = runs.get(aid)
            if run is None:  # a cache hit has no started event
                start = _time(rec, "start")
                run = runs[aid] = _new_run(rec, aid, (start or time_) - t0, str(kind))
            run.status = str(kind)
            run.duration = max(0.0, number_at(rec, "duration") or 0.0)
            run.outputs = records_at(rec, "outputs")
            run.bytes = int(number_at(rec, "bytes") or 0)
            run.error = _text(rec, "error")
            run.log = _text(rec, "log")
        elif kind == ev.NOT_RUN:
            cause = _text(rec, "root_cause")
            report.not_run.append({"root_cause": cause, "desc": _text(rec, "desc", "?")})
        elif kind == ev.BUILD_FINISHED:
            report.wall_s = number_at(rec, "wall_s")
            report.ok = bool(rec.get("ok"))
            report.interrupted = bool(rec.get("interrupted"))
            counts = rec.get("counts")
            if isinstance(counts, dict):
                report.counts = {
                    str(k): int(v)
                    for k, v in counts.items()
                    if isinstance(v, int) and not isinstance(v, bool)
                }
    report.runs = sorted(runs.values(), key=lambda r: r.start)
    if report.wall_s is None:  # the build never recorded its end: killed
        times = [t for rec in records if (t := _time(rec, "time")) is not None]
        report.wall_s = max(times, default=t0) - t0
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
    """The manifest as the report shows it: entrypoints by name, each with a list of
    output records (dicts); anything else in it is left out. None if unreadable."""
    try:
        data = json.loads(read_regular(path).decode("utf-8", errors="replace"))
    except (OSError, ValueError, NotRegularFile):
        return None
    if not isinstance(data, dict):
        return None
    entrypoints = data.get("entrypoints")
    shown: dict[str, Any] = {}
    if isinstance(entrypoints, dict):
        for name, entry in entrypoints.items():
            if isinstance(entry, dict):
                shown[str(name)] = {"outputs": [_artifact(o) for o in records_at(entry, "outputs")]}
    return {**data, "entrypoints": shown}


def _artifact(out: dict[str, Any]) -> dict[str, Any]:
    """One output record of the manifest, with the fields the report shows typed."""
    size = number_at(out, "size")
    return {
        "path": _text(out, "path", "") or "",
        "status": _text(out, "status", "") or "",
        "size": int(size) if size is not None else None,
        "sha256": _text(out, "sha256", "") or "",
        "target": _text(out, "target", "") or "",
        "verification": [
            {"passed": c.get("passed") is True, "status": _text(c, "status", "failed")}
            for c in records_at(out, "verification")
        ],
    }


def log_tail(path: str | None, lines: int = _LOG_TAIL_LINES) -> str | None:
    """The last ``lines`` lines of a log file, or None when it cannot be read. Only a
    regular file is read: a FIFO or device named by a damaged record never blocks."""
    if not path:
        return None
    try:
        with os.fdopen(open_regular(path, follow=True), "rb") as f:
            f.seek(0, 2)
            f.seek(max(0, f.tell() - 64 * 1024))
            text = f.read().decode("utf-8", errors="replace")
    except (OSError, NotRegularFile, ValueError):
        return None
    return "\n".join(text.splitlines()[-lines:])
