"""The event stream: ``kiln build --events`` writes the documented JSON lines, as
the build goes, for built, failed, not-run, up-to-date and cached actions."""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from test_scheduler import Node, declare

from kiln.base import events as ev
from kiln.engine.build_events import BuildEmitter
from kiln.engine.incremental import UpToDateChecker
from kiln.executor import BuildAction, BuildContext, Executor, ProgressReporter
from kiln.observe.event_log import EventLog

DOC = Path(__file__).resolve().parent.parent / "docs" / "events.md"

MODULE = """
import os


@entrypoint
def chain():
    previous = []
    for i in range(3):
        step = run_command(name=f"step{i}.txt", inputs=previous,
                           command=["sh", "-c", 'echo "$0" > "$1"', f"step {i}", "{out}"])
        previous = [step]
    return previous


@entrypoint
def broken():
    first = run_command(name="first.txt", command=["sh", "-c", "echo kaput >&2; exit 2"])
    second = run_command(name="second.txt", inputs=[first], command=["touch", "{out}"])
    return run_command(name="third.txt", inputs=[second], command=["touch", "{out}"])
"""


pytestmark = pytest.mark.in_process


def documented_fields() -> dict[str, tuple[set[str], set[str]]]:
    """From docs/events.md: each kind's (required, optional) fields."""
    fields = {}
    for kind, names in re.findall(r"^- `(\w+)`: (.+)$", DOC.read_text(), re.M):
        listed = [n.strip() for n in names.split(",")]
        required = {n for n in listed if not n.endswith("?")}
        fields[kind] = (required, {n.rstrip("?") for n in listed if n.endswith("?")})
    return fields


def read_events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def check_documented(events: list[dict[str, Any]]) -> None:
    docs = documented_fields()
    assert set(docs) == set(ev.KINDS), "docs/events.md lists every kind, and only those"
    for event in events:
        required, optional = docs[event["event"]]
        keys = set(event)
        assert required <= keys, (event["event"], required - keys)
        assert keys <= required | optional, (event["event"], keys - required - optional)


def test_events_of_a_build_have_the_documented_fields(write_module, kiln, tmp_path) -> None:
    write_module(MODULE)
    first = kiln("build", "build.py", "--events", "one.jsonl", "-j", "2")
    assert first.returncode == 1, first.stderr
    # Rebuild with one output tampered with: two actions up to date, one runs again.
    out = tmp_path / "kiln-out"
    (out / "genfiles" / "chain" / "step2.txt").write_text("tampered\n")
    second = kiln("build", "build.py", "--events", "two.jsonl")
    assert second.returncode == 1

    one, two = read_events(tmp_path / "one.jsonl"), read_events(tmp_path / "two.jsonl")
    for events in (one, two):
        check_documented(events)
        assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
        assert events[0]["event"] == "build_started" and events[-1]["event"] == "build_finished"
        times = [e["time"] for e in events]
        assert times[0] <= min(times) and max(times) <= times[-1] + 1e-3
        planned = {e["action"] for e in events if e["event"] == "planned"}
        endings = [e["action"] for e in events if e["event"] in ev.ENDINGS]
        assert sorted(endings) == sorted(planned) and len(planned) == 6

    by_kind = {k: [e for e in one if e["event"] == k] for k in ev.KINDS}
    assert by_kind["build_started"][0]["actions"] == 6
    assert by_kind["build_started"][0]["schema"] == ev.SCHEMA
    step1 = next(e for e in by_kind["planned"] if e["action"] == "gen/chain/step1.txt")
    assert step1["deps"] == ["gen/chain/step0.txt"]
    assert step1["target"] == "chain" and step1["type"].endswith("CommandAction")
    assert step1["desc"] == "Running chain/step1.txt"

    finished = {e["action"]: e for e in by_kind["finished"]}
    assert set(finished) == {f"gen/chain/step{i}.txt" for i in range(3)}
    step2 = finished["gen/chain/step2.txt"]
    content = (out / "genfiles" / "chain" / "step2.txt").read_bytes()
    assert step2["cached"] is False and step2["reason"] == "never built"
    assert step2["outputs"] == [
        {
            "path": "chain/step2.txt",
            "namespace": "gen",
            "sha256": hashlib.sha256(content).hexdigest(),
            "bytes": len(content),
        }
    ]
    assert step2["bytes"] == len(content) and step2["duration"] >= 0
    assert re.fullmatch(r"kiln-\d+", step2["lane"])
    started = {e["action"]: e for e in by_kind["started"]}
    assert started["gen/chain/step2.txt"]["lane"] == step2["lane"]
    assert started["gen/chain/step2.txt"]["key"] == step2["key"]

    (failed,) = by_kind["failed"]
    assert failed["action"] == failed["root_cause"] == "gen/broken/first.txt"
    assert "kaput" in failed["error"] and failed["cached"] is False
    not_run = {e["action"]: e for e in by_kind["not_run"]}
    assert set(not_run) == {"gen/broken/second.txt", "gen/broken/third.txt"}
    assert all(e["root_cause"] == "gen/broken/first.txt" for e in not_run.values())
    assert "first.txt, which failed" in not_run["gen/broken/second.txt"]["error"]
    end = by_kind["build_finished"][0]
    assert end["ok"] is False and end["interrupted"] is False
    assert end["counts"] == {
        "built": 3,
        "up_to_date": 0,
        "cached": 0,
        "failed": 1,
        "failed_unchanged": 0,
        "not_run": 2,
        "would_run": 0,
    }

    up = {e["action"]: e for e in two if e["event"] == "up_to_date"}
    assert set(up) == {"gen/chain/step0.txt", "gen/chain/step1.txt"}
    assert up["gen/chain/step0.txt"]["key"] == finished["gen/chain/step0.txt"]["key"]
    # The tampered output is restored from the shared cache: a real ``cached`` event.
    assert not [e for e in two if e["event"] == "finished"]
    restored = [e for e in two if e["event"] == "cached"]
    assert [e["action"] for e in restored] == ["gen/chain/step2.txt"]
    assert restored[0]["reason"] == "output chain/step2.txt was modified"
    assert restored[0]["cached"] is True and restored[0]["outputs"] == step2["outputs"]


def test_cached_event_has_the_documented_fields(tmp_path: Path) -> None:
    # The action cache is not wired into the scheduler yet: its event is made
    # through the emitter that the cache hit will call.
    executor = Executor(tmp_path / "out")
    with executor.get_context(""):
        out = BuildContext.current().allocate_file("model/weights.bin")
        action = BuildAction(desc="make weights", executor=executor)
    out.deps.add(action)
    try:
        plan = executor.plan([out])
        decision = UpToDateChecker(plan, executor.store()).decide(action)
        sink = io.StringIO()
        stream = ev.EventStream([EventLog(sink)])
        emitter = BuildEmitter(stream, plan)
        out.get_fs_path().write_bytes(b"12345")
        emitter.cached(action, decision, {out: ((5, 0, 0, 0), "ab" * 32)}, start=time.time())
    finally:
        executor.close()
    (event,) = [json.loads(line) for line in sink.getvalue().splitlines()]
    check_documented([event])
    assert event["cached"] is True and event["action"] == "gen/model/weights.bin"
    assert event["outputs"] == [
        {"path": "model/weights.bin", "namespace": "gen", "sha256": "ab" * 32, "bytes": 5}
    ]
    assert event["bytes"] == 5 and event["reason"] == "never built" and event["lane"] == "main"


def test_dry_run_events_say_what_would_run(write_module, kiln, tmp_path) -> None:
    write_module(MODULE)
    r = kiln("build", "build.py", "chain", "--dry-run", "--events", "dry.jsonl")
    assert r.returncode == 0, r.stderr
    events = read_events(tmp_path / "dry.jsonl")
    check_documented(events)
    assert [e["reason"] for e in events if e["event"] == "would_run"] == ["never built"] * 3
    assert not (tmp_path / "kiln-out" / ".kiln" / "last-events.jsonl").exists()


SLOW = """
@entrypoint
def slow():
    quick = run_command(name="quick.txt", command=["touch", "{out}"])
    return run_command(name="slow.txt", inputs=[quick],
                       command=["sh", "-c", "sleep 60; touch $0", "{out}"])
"""


def test_a_killed_build_keeps_its_events_so_far(write_module, tmp_path: Path, tag) -> None:
    write_module(SLOW)
    log = tmp_path / "events.jsonl"
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "kiln",
            "build",
            "build.py",
            "--events",
            str(log),
            "--action-env",
            "KILN_TEST_TAG",
        ],
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "KILN_TEST_TAG": tag},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60
        while '"desc": "Running slow/slow.txt"' not in _started(log):
            assert proc.poll() is None and time.monotonic() < deadline, "slow action never started"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    events = read_events(log)
    kinds = [e["event"] for e in events]
    assert kinds[0] == "build_started" and "build_finished" not in kinds
    assert [e["action"] for e in events if e["event"] == "finished"] == ["gen/slow/quick.txt"]
    assert events[-1]["event"] == "started" and events[-1]["action"] == "gen/slow/slow.txt"


def _started(log: Path) -> str:
    try:
        return "\n".join(line for line in log.read_text().splitlines() if '"started"' in line)
    except FileNotFoundError:
        return ""


def test_unwritable_events_file_is_a_usage_error(write_module, kiln) -> None:
    write_module(MODULE)
    r = kiln("build", "build.py", "chain", "--events", "no/such/dir/events.jsonl")
    assert r.returncode == 2
    assert "--events: the directory of no/such/dir/events.jsonl does not exist" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("option", ["--events", "--profile"])
def test_event_files_never_follow_a_symlink(write_module, kiln, tmp_path, option) -> None:
    write_module(MODULE)
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    (tmp_path / "out.json").symlink_to(victim)
    r = kiln("build", "build.py", "chain", option, "out.json")
    assert victim.read_text() == "keep me\n"
    # Neither written through nor replaced (kiln.cli.destinations).
    assert r.returncode == 2 and "is a symbolic link to" in r.stderr, r.stderr
    assert (tmp_path / "out.json").is_symlink()


class LegacyReporter(ProgressReporter):
    """A reporter written against the seed's methods only."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def start_graph(self, all_deps) -> None:
        self.calls.append(("start_graph", str(len(all_deps))))

    def start_dep(self, dep) -> None:
        self.calls.append(("start_dep", str(dep)))

    def skip_dep(self, dep) -> None:
        self.calls.append(("skip_dep", str(dep)))

    def finish_dep(self, dep) -> None:
        self.calls.append(("finish_dep", str(dep)))

    def report_failure(self, dep) -> None:
        self.calls.append(("report_failure", str(dep)))

    def end_graph(self) -> None:
        self.calls.append(("end_graph", ""))


def test_reporters_of_the_seed_api_still_get_their_calls(tmp_path: Path) -> None:
    nodes = {"a": Node(), "b": Node(deps=["a"], fail=True), "c": Node(deps=["b"])}
    for build in range(2):
        g = declare(tmp_path / "out", nodes)
        legacy = LegacyReporter()
        g.executor.reporter = legacy
        try:
            g.run(["c"], jobs=1)
        finally:
            g.executor.close()
        first = [("start_dep", "a"), ("finish_dep", "a")] if build == 0 else [("skip_dep", "a")]
        assert legacy.calls == [
            ("start_graph", "6"),
            *first,
            ("start_dep", "b"),
            ("report_failure", "b"),
            ("finish_dep", "b"),
            ("end_graph", ""),
        ]


def test_a_fifo_planted_at_the_last_events_file_never_blocks_the_build(
    write_module, kiln, tmp_path
) -> None:
    write_module(MODULE)
    assert kiln("build", "build.py", "chain").returncode == 0
    planted = tmp_path / "kiln-out/.kiln/last-events.jsonl"
    planted.unlink()
    os.mkfifo(planted)
    r = kiln("build", "build.py", "chain", timeout=60)  # opening it for writing would block
    assert r.returncode == 0, r.stderr
    assert "cannot keep this build's events" in r.stderr and "FIFO" in r.stderr


def test_an_event_is_encoded_once_whoever_writes_it() -> None:
    """``--events`` and ``.kiln/last-events.jsonl`` write the same text, made once per
    event, as ``json.dumps`` would write it (escapes, non-finite numbers, nested data)."""
    event = ev.BuildEvent(
        ev.FINISHED,
        time=1.25,
        action="a|b",
        desc='Running "x"\n\u00e9\x1b[2J',
        lane="main",
        start=1.0,
        duration=0.25,
        outputs=[{"path": "p", "bytes": 3}],
        bytes=3,
        data={"ok": True, "wall_s": float("nan"), "nested": {"x": None}},
    )
    first, second = io.StringIO(), io.StringIO()
    stream = ev.EventStream([EventLog(first), EventLog(second)])
    calls = []
    real = event.to_json
    event.to_json = lambda: calls.append(1) or real()  # type: ignore[method-assign]
    stream.emit(event)
    assert first.getvalue() == second.getvalue() == json.dumps(real(), default=str) + "\n"
    assert len(calls) == 1
    assert json.loads(first.getvalue())["desc"] == 'Running "x"\n\u00e9\x1b[2J'
