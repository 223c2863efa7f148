"""A build's failures as ``kiln build`` reports them: each failure's details once
(when it fails, or with ``--failures=summary`` in the summary only), very long
flags shortened, one verdict for a no-op, failures met unchanged in one line."""

from __future__ import annotations

from pathlib import Path

import pytest

LONG = "--cpu-features=" + ",".join(f"+feature{i}" for i in range(200))  # ~2 KB

MODULE = f"""
from kiln import entrypoint, run_command

@entrypoint
def broken():
    first = run_command(name="first.txt",
                        command=["sh", "-c", "echo kaput-7f3a >&2; exit 2", "{LONG}"])
    return run_command(name="second.txt", inputs=[first], command=["touch", "{{out}}"])

@entrypoint
def fine():
    return run_command(name="fine.txt", command=["touch", "{{out}}"])
"""

pytestmark = pytest.mark.in_process


@pytest.fixture
def module(write_module) -> Path:
    return write_module(MODULE, header=False)


def test_a_failures_details_appear_once(module, kiln) -> None:
    r = kiln("build", "build.py", "broken")
    assert r.returncode == 1
    said = [line.strip() for line in r.stderr.splitlines()]
    assert said.count("kaput-7f3a") == 1, r.stderr  # what the command printed: once
    assert r.stderr.count("ERROR: Building 'Running broken/first.txt' failed:") == 1
    # The summary still names the root cause in iree.build's words, and where.
    assert "ERROR: Failed to build 2 actions. Root causes:\n  * Running broken/first.txt\n" in (
        r.stderr
    )
    assert "defined at " in r.stderr


def test_with_failures_summary_the_summary_has_one_line_each(module, kiln) -> None:
    r = kiln("build", "build.py", "broken", "--failures=summary")
    assert r.returncode == 1
    assert "ERROR: Building" not in r.stderr
    assert "kaput-7f3a" not in [line.strip() for line in r.stderr.splitlines()]
    lines = r.stderr.splitlines()
    at = lines.index("  * Running broken/first.txt")
    assert lines[at + 1].startswith("      defined at ")
    assert "command exited with status 2" in lines[at + 2], lines[at + 2]
    assert lines[-1].startswith("kiln: FAILED:")


def test_a_long_flag_is_shortened_in_messages(module, kiln) -> None:
    for args in ([], ["--failures=summary"], ["-v"]):
        r = kiln("build", "build.py", "broken", "--retry-failed", *args)
        assert r.returncode == 1
        assert LONG not in r.stderr, args
        assert LONG[:60] + f"…({len(LONG)} chars)" in r.stderr, args
        assert all(len(line) < 1000 for line in r.stderr.splitlines()), args
    # The log keeps the whole command.
    logs = list((module.parent / "kiln-out/.kiln/logs").rglob("*.log"))
    assert any(LONG in p.read_text(errors="replace") for p in logs)


def test_the_failing_commands_flag_is_shortened_where_it_is_shown(module, kiln) -> None:
    r = kiln("build", "build.py", "broken")
    assert f"…({len(LONG)} chars)" in r.stderr, r.stderr


def test_a_no_op_says_one_thing(module, kiln) -> None:
    first = kiln("build", "build.py", "fine")
    assert first.returncode == 0 and "Successfully built 1 actions" in first.stderr
    again = kiln("build", "build.py", "fine")
    assert again.returncode == 0
    assert "Successfully built" not in again.stderr, again.stderr
    assert again.stderr.strip().splitlines() == [again.stderr.strip().splitlines()[-1]]
    assert "0 built, 1 up to date" in again.stderr


def test_failures_met_unchanged_are_one_line(module, kiln) -> None:
    assert kiln("build", "build.py", "broken").returncode == 1
    again = kiln("build", "build.py", "broken")
    assert again.returncode == 1
    assert "ERROR" not in again.stderr, again.stderr
    lines = again.stderr.strip().splitlines()
    assert len(lines) == 2, lines
    assert lines[0].startswith("kiln: 1 action(s) failed as in an earlier build")
    assert lines[1].startswith(
        "kiln: FAILED: 0 built, 0 up to date, 0 failed, 1 failed (unchanged)"
    )
    listed = kiln("build", "build.py", "broken", "-v")
    assert "  * Running broken/first.txt failed (unchanged" in listed.stderr
