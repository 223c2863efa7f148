"""``kiln build --profile``: a Chrome trace with one lane per worker, one complete
slice per action run, and counters; every build keeps its trace in ``.kiln/``."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

MODULE = """
@entrypoint
def wide():
    parts = [run_command(name=f"part{i}.txt",
                         command=["sh", "-c", f"sleep 0.2; echo {i} > $0", "{out}"])
             for i in range(6)]
    return run_command(name="all.txt", inputs=parts,
                       command=["sh", "-c", "cat $1 $2 > $0", "{out}", "{inputs[0]}",
                                "{inputs[1]}"])


@entrypoint
def broken():
    return run_command(name="bad.txt", command=["sh", "-c", "exit 3"])
"""


pytestmark = pytest.mark.in_process


def load(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_text())
    assert isinstance(data["traceEvents"], list)
    return data


def slices(trace: dict[str, Any]) -> list[dict[str, Any]]:
    return [e for e in trace["traceEvents"] if e["ph"] == "X"]


def test_profile_has_one_slice_per_action_run(write_module, kiln, tmp_path: Path) -> None:
    write_module(MODULE)
    r = kiln("build", "build.py", "-j", "3", "--profile", "build.trace.json")
    assert r.returncode == 1, r.stderr

    trace = load(tmp_path / "build.trace.json")
    events = trace["traceEvents"]
    got = slices(trace)
    names = sorted(s["name"] for s in got)
    assert names == sorted(
        ["Running wide/all.txt", "Running broken/bad.txt"]
        + [f"Running wide/part{i}.txt" for i in range(6)]
    )
    pids = {e["pid"] for e in events if "pid" in e}
    assert len(pids) == 1
    lanes = {
        e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"
    }
    assert {s["tid"] for s in got} <= set(lanes)
    assert 2 <= len({s["tid"] for s in got}) <= 3  # -j 3: three worker lanes at most
    assert all(name.startswith("kiln-") for name in lanes.values())
    by_lane: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for s in got:
        assert s["dur"] >= 0 and s["ts"] >= 0
        by_lane[s["tid"]].append((s["ts"], s["ts"] + s["dur"]))
        args = s["args"]
        assert {"key", "reason", "cached", "outputs", "bytes"} <= set(args)
        assert args["cached"] is False and len(args["key"]) == 64
        assert args["reason"] == "never built"
    for spans in by_lane.values():  # a lane runs one action at a time
        spans.sort()
        assert all(a[1] <= b[0] + 1.0 for a, b in zip(spans, spans[1:], strict=False))
    part = next(s for s in got if s["name"] == "Running wide/part0.txt")
    assert part["args"]["outputs"] == ["wide/part0.txt"] and part["args"]["bytes"] == 2
    assert part["dur"] >= 150_000  # it slept 0.2 s; microseconds
    bad = next(s for s in got if s["name"] == "Running broken/bad.txt")
    assert bad["args"]["status"] == "failed" and "status 3" in bad["args"]["error"]

    running = [e["args"]["running"] for e in events if e.get("name") == "running actions"]
    assert max(running) == 3 and running[-1] == 0 and min(running) >= 0
    memory = [e["args"]["rss_mb"] for e in events if e.get("name") == "kiln memory"]
    assert memory and all(m > 1 for m in memory)
    assert trace["otherData"]["counts"]["built"] == 7

    kept = load(tmp_path / "kiln-out" / ".kiln" / "last-trace.json")
    assert sorted(s["name"] for s in slices(kept)) == names


def test_last_trace_belongs_to_the_last_build(write_module, kiln, tmp_path: Path) -> None:
    write_module(MODULE)
    assert kiln("build", "build.py", "wide").returncode == 0
    kept = tmp_path / "kiln-out" / ".kiln" / "last-trace.json"
    assert len(slices(load(kept))) == 7

    again = kiln("build", "build.py", "wide", "--profile", "noop.json")
    assert again.returncode == 0
    for path in (kept, tmp_path / "noop.json"):
        trace = load(path)
        assert slices(trace) == []  # nothing ran
        assert trace["otherData"]["counts"]["up_to_date"] == 7
    events = (tmp_path / "kiln-out" / ".kiln" / "last-events.jsonl").read_text().splitlines()
    assert [json.loads(line)["event"] for line in events] == ["build_started", "build_finished"]


def test_dry_run_keeps_no_trace(write_module, kiln, tmp_path: Path) -> None:
    write_module(MODULE)
    r = kiln("build", "build.py", "wide", "--dry-run")
    assert r.returncode == 0, r.stderr
    assert not (tmp_path / "kiln-out" / ".kiln" / "last-trace.json").exists()


def test_profile_into_a_missing_directory_is_a_usage_error(write_module, kiln) -> None:
    write_module(MODULE)
    r = kiln("build", "build.py", "wide", "--profile", "nowhere/trace.json")
    assert r.returncode == 2
    assert "--profile: the directory of nowhere/trace.json does not exist" in r.stderr


def test_unwritable_report_files_are_usage_errors_before_the_build(
    write_module, kiln, tmp_path: Path
) -> None:
    write_module(MODULE)
    (tmp_path / "adir").mkdir()
    for option, value, says in (
        ("--profile", "", "expected a file name"),
        ("--events", "", "expected a file name"),
        ("--profile", "adir", "is a directory"),
        ("--events", "missing/e.jsonl", "does not exist"),
    ):
        r = kiln("build", "build.py", "wide", option, value)
        assert r.returncode == 2, r.stderr
        assert says in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "kiln-out").exists()  # refused before anything ran
