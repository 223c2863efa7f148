"""--json: list, explain, cache stats and report --list print one JSON document."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

MODULE = """
@entrypoint(description="the only model")
def hello():
    part = run_command(name="part.txt", command=["sh", "-c", 'echo part > "$0"', "{out}"])
    return run_command(name="hello.txt", inputs=[part],
                       command=["sh", "-c", 'cat "$0" > "$1"', "{inputs[0]}", "{out}"])
"""


@pytest.fixture
def module(write_module) -> Path:
    return write_module(MODULE)


def _doc(r) -> dict:  # type: ignore[no-untyped-def]
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def test_list(module, kiln) -> None:
    assert _doc(kiln("list", "build.py", "--json")) == {
        "entrypoints": [{"name": "hello", "description": "the only model"}]
    }
    every = _doc(kiln("list", "build.py", "--json", "--all"))
    assert {f["path"] for f in every["files"]} == {"hello/part.txt", "hello/hello.txt"}
    (last,) = [a for a in every["actions"] if a["outputs"] == ["hello/hello.txt"]]
    assert last["inputs"] == ["hello/part.txt"]
    assert last["type"] == "kiln.actions.process.CommandAction"
    assert last["defined_at"].startswith(f"{module}:")


def test_explain(module, kiln) -> None:
    first = _doc(kiln("explain", "build.py", "--json"))
    assert first["up_to_date"] is False
    assert [(a["decision"], a["why"]) for a in first["actions"]] == [("run", "never built")] * 2
    assert kiln("build", "build.py", "--no-cache").returncode == 0
    again = _doc(kiln("explain", "build.py", "--json"))
    assert again["up_to_date"] is True
    assert {a["decision"] for a in again["actions"]} == {"up to date"}


def test_cache_stats_keeps_only_known_fields_of_the_shared_log(
    module, kiln, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    assert kiln("build", "build.py", "--cache-dir", str(cache)).returncode == 0
    logs = [p for p in cache.rglob("*") if p.is_file() and p.name.startswith("builds")]
    assert logs, sorted(p.name for p in cache.rglob("*"))
    with logs[0].open("a") as f:
        f.write(json.dumps({"time": "\x1b[2J", "hits": "many", "evil": 1}) + "\n")
    r = kiln("cache", "stats", "--cache-dir", str(cache), "--json")
    doc = _doc(r)
    assert "\x1b" not in r.stdout  # JSON escapes it
    assert doc["entries"] >= 2 and doc["bytes"] > 0
    assert doc["builds"][0]["misses"] == 2
    assert doc["builds"][-1] == {
        "time": "\x1b[2J",
        "hits": 0,
        "remote_hits": 0,
        "misses": 0,
        "stored": 0,
        "corrupt": 0,
    }


def test_report_list(module, kiln) -> None:
    assert kiln("build", "build.py", "--no-cache").returncode == 0
    assert kiln("build", "build.py", "--no-cache").returncode == 0
    builds = _doc(kiln("report", "--list", "--json"))["builds"]
    assert [b["build"] for b in builds] == [0, 1]
    assert [b["status"] for b in builds] == ["ok", "ok"]
    assert builds[1]["counts"]["built"] == 2
    alone = kiln("report", "--json")
    assert alone.returncode == 2 and "--json goes with --list" in alone.stderr
