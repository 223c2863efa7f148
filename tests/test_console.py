"""What ``kiln build`` prints: plain ``[i/N] desc`` lines off a terminal or with
NO_COLOR, the rich live display on a terminal or with ``--console live``, and the
final summary line."""

from __future__ import annotations

import fcntl
import itertools
import os
import pty
import re
import struct
import subprocess
import sys
import termios
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

HEADER = """\
from kiln import cl_arg, entrypoint, run_command, source_file
from kiln.executor import *
"""

MODULE = (
    HEADER
    + """
import os


@entrypoint
def chain():
    previous = []
    for i in range(4):
        step = run_command(name=f"step{i}.txt", inputs=previous,
                           command=["sh", "-c", 'echo "$0" > "$1"', os.environ.get("SALT", "x"),
                                    "{out}"])
        previous = [step]
    return previous


@entrypoint
def broken():
    first = run_command(name="first.txt", command=["sh", "-c", "echo kaput >&2; exit 2"])
    return run_command(name="second.txt", inputs=[first], command=["touch", "{out}"])
"""
)

SLOW = (
    HEADER
    + """
import os


@entrypoint
def slow():
    return run_command(name="slow.txt", command=["sh", "-c", 'sleep 2.5; echo "$0" > "$1"',
                                                 os.environ.get("SALT", "x"), "{out}"])
"""
)

PLAIN_LINE = re.compile(r"^\[(\d+)/(\d+)\] (.+)$")
SUMMARY = re.compile(
    r"kiln: (done|FAILED): (\d+) built, (\d+) up to date, (\d+) failed, (\d+) not run in [\d.]+s"
)


pytestmark = pytest.mark.in_process


@pytest.fixture
def module(write_module) -> Path:
    return write_module(MODULE, header=False)


def summary(text: str) -> tuple[str, int, int, int, int]:
    found = SUMMARY.findall(text)
    assert len(found) == 1, text
    status, *counts = found[0]
    return (status, *map(int, counts))


# -- plain lines ----------------------------------------------------------------


def test_plain_lines_count_up(module, kiln) -> None:
    r = kiln("build", "build.py", "chain", "-j", "1")

    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    progress = [PLAIN_LINE.match(line) for line in lines[:-2]]
    assert all(progress), lines
    assert [(m.group(1), m.group(2)) for m in progress] == [(str(i), "4") for i in range(1, 5)]
    assert [m.group(3) for m in progress] == [f"Running chain/step{i}.txt" for i in range(4)]
    assert lines[-2] == "Successfully built 4 actions"  # iree.build's line
    assert summary(lines[-1]) == ("done", 4, 0, 0, 0)
    assert "\x1b" not in r.stderr and "\x1b" not in r.stdout
    assert "\r" not in r.stderr


def test_plain_when_not_a_terminal_even_without_no_color(module, kiln) -> None:
    r = kiln("build", "build.py", "chain", env={"NO_COLOR": ""})

    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stderr and "\x1b" not in r.stdout
    assert any(PLAIN_LINE.match(line) for line in r.stderr.splitlines())


def test_up_to_date_actions_count_towards_progress(module, kiln) -> None:
    assert kiln("build", "build.py", "chain").returncode == 0
    # Only the last step runs again: its input did not change, but its output did.
    last = module.parent / "kiln-out" / "genfiles" / "chain" / "step3.txt"
    last.write_text("tampered\n")
    r = kiln("build", "build.py", "chain", "-j", "1", "--no-cache")  # else restored

    assert r.returncode == 0, r.stderr
    progress = [line for line in r.stderr.splitlines() if PLAIN_LINE.match(line)]
    assert progress == ["[4/4] Running chain/step3.txt"]
    assert summary(r.stderr) == ("done", 1, 3, 0, 0)

    verbose = kiln("build", "build.py", "chain", "-v")
    assert "up to date: Running chain/step0.txt" in verbose.stderr


def test_plain_failure_report_and_summary(module, kiln) -> None:
    r = kiln("build", "build.py", "-j", "1")

    assert r.returncode == 1
    assert "ERROR: Building 'Running broken/first.txt' failed:" in r.stderr
    assert "kaput" in r.stderr
    assert summary(r.stderr) == ("FAILED", 4, 0, 1, 1)
    assert r.stderr.rstrip().splitlines()[-1].startswith("kiln: FAILED:")
    assert "\x1b" not in r.stderr

    # It fails with the same key: not run again, one line for all such (-v lists
    # each with its log).
    again = kiln("build", "build.py")
    assert again.returncode == 1
    assert "kaput" not in again.stderr and "ERROR" not in again.stderr
    assert "kiln: 1 action(s) failed as in an earlier build" in again.stderr
    listed = kiln("build", "build.py", "-v")
    assert "  * Running broken/first.txt failed (unchanged; log: " in listed.stderr
    assert (
        again.stderr.rstrip()
        .splitlines()[-1]
        .startswith(
            "kiln: FAILED: 0 built, 4 up to date, 0 failed, 1 failed (unchanged), 1 not run in "
        )
    )
    retried = kiln("build", "build.py", "--retry-failed")
    assert "kaput" in retried.stderr and summary(retried.stderr) == ("FAILED", 0, 4, 1, 1)


def test_plain_heartbeat_names_each_long_action_with_its_time(write_module, kiln) -> None:
    write_module(SLOW.replace("sleep 2.5", "sleep 3.5"), name="slow.py", header=False)
    r = kiln("build", "slow.py", "--heartbeat", "1")

    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    beats = [line for line in lines if line.startswith("still running (")]
    assert len(beats) >= 2, r.stderr  # at 1 s, 2 s, 3 s of its 3.5 s
    assert all(re.fullmatch(r"still running \(\ds\): Running slow/slow\.txt", b) for b in beats)
    assert lines.index(beats[0]) > lines.index("[1/1] Running slow/slow.txt")
    assert lines.index(beats[-1]) < len(lines) - 1  # before the summary

    quiet = kiln("build", "slow.py", "--heartbeat", "0", env={"SALT": "again"})
    assert quiet.returncode == 0 and "[1/1] Running slow/slow.txt" in quiet.stderr
    assert "still running" not in quiet.stderr


def test_heartbeat_takes_seconds_or_zero(write_module, kiln) -> None:
    path = write_module(SLOW, name="slow.py", header=False)
    r = kiln("build", "slow.py", "--heartbeat", "-1")
    assert r.returncode == 2 and "--heartbeat: must be 0 (off) or a positive number" in r.stderr

    # A tiny interval would flood the log with a line per action many times a second.
    tiny = kiln("build", "slow.py", "--heartbeat", "0.000001")
    assert tiny.returncode == 2, tiny.stderr
    assert "--heartbeat: 0.000001 seconds would print" in tiny.stderr
    assert "give 0 (off) or at least 1" in tiny.stderr
    assert "still running" not in tiny.stderr
    assert not (path.parent / "kiln-out").exists()  # refused before building


def test_a_late_heartbeat_prints_one_line_not_one_per_missed_beat() -> None:
    """The heartbeat's thread can be late (here: its stream blocks for ten beats);
    it then prints one line, and the next a whole interval later."""
    from kiln.base import events as ev
    from kiln.observe.summary import Heartbeat

    interval = 0.05
    written: list[float] = []

    def write(line: str) -> None:
        written.append(time.monotonic())
        if len(written) == 1:
            time.sleep(10 * interval)

    beat = Heartbeat(interval, write)
    beat.handle(ev.BuildEvent(ev.BUILD_STARTED))
    beat.handle(ev.BuildEvent(ev.STARTED, action="a", desc="Running a"))
    time.sleep(20 * interval)
    beat.handle(ev.BuildEvent(ev.BUILD_FINISHED))

    # After the first line's write took ten intervals, the missed beats are not
    # made up: each later line comes an interval after the one before.
    assert len(written) >= 3, written
    gaps = [b - a for a, b in itertools.pairwise(written[1:])]
    assert all(gap >= interval / 2 for gap in gaps), gaps


def test_elapsed_reads_at_a_glance() -> None:
    from kiln.observe.summary import elapsed

    assert [elapsed(s) for s in (0.4, 42, 303, 7620)] == ["0s", "42s", "5m03s", "2h07m"]


# -- the live display -------------------------------------------------------------


def test_live_display_shows_each_running_actions_time(write_module, kiln) -> None:
    write_module(SLOW, name="slow.py", header=False)
    r = kiln("build", "slow.py", "--console", "live")

    assert r.returncode == 0, r.stderr
    times = [float(t) for t in re.findall(r"(\d+\.\d)s Running slow/slow\.txt", r.stderr)]
    assert times and max(times) >= 1.0, r.stderr  # it counted up while the action ran
    assert times == sorted(times)


def test_console_live_forces_the_rich_display(module, kiln) -> None:
    r = kiln("build", "build.py", "chain", "--console", "live")

    assert r.returncode == 0, r.stderr
    assert "\x1b[" in r.stderr
    assert not any(PLAIN_LINE.match(line) for line in r.stderr.splitlines())
    assert summary(r.stderr) == ("done", 4, 0, 0, 0)
    assert "\x1b" not in r.stdout  # stdout stays machine-readable
    assert r.stdout.splitlines() == [
        str(module.parent / "kiln-out" / "genfiles" / "chain" / "step3.txt")
    ]


def test_console_live_reports_failures_and_root_causes(module, kiln) -> None:
    r = kiln("build", "build.py", "broken", "--console", "live")

    assert r.returncode == 1
    assert "ERROR: Building 'Running broken/first.txt' failed:" in r.stderr
    assert "Root causes:\n  * Running broken/first.txt\n" in r.stderr and "kaput" in r.stderr
    assert summary(r.stderr) == ("FAILED", 0, 0, 1, 1)


@dataclass
class TtyResult:
    returncode: int
    stdout: str
    stderr: str


def run_on_tty(cwd: Path, *args: str, env: dict[str, str], rows: int = 0) -> TtyResult:
    """Run ``python -m kiln ARGS`` with stderr on a pseudo-terminal (``rows`` tall)."""
    master, slave = pty.openpty()
    if rows:
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", rows, 100, 0, 0))
    full_env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "TERM")}
    full_env |= {"TERM": "xterm-256color", "COLUMNS": "100", **env}
    full_env = {k: v for k, v in full_env.items() if v is not None}
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln", *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
        env=full_env,
    )
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO once the child side is closed
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        out, _ = proc.communicate(timeout=60)
    finally:
        reader.join(10)
        os.close(master)
    return TtyResult(proc.returncode, out.decode(), b"".join(chunks).decode(errors="replace"))


def test_the_live_display_never_outgrows_a_short_terminal(write_module, tmp_path: Path) -> None:
    # Ten actions running at once, in a terminal six rows tall: every drawing of the
    # region leaves a row free (a taller one scrolls its header into the scrollback,
    # where each redraw left a stale copy), and each redraw takes back what it drew.
    write_module(
        """
        @entrypoint
        def many():
            return [run_command(name=f"s{i}.txt",
                                command=["sh", "-c", 'sleep 1.5; echo x > "$0"', "{out}"])
                    for i in range(10)]
        """
    )
    # LINES, stale (pytest-xdist's workers export 24): the terminal's own size counts.
    r = run_on_tty(tmp_path, "build", "build.py", "-j", "10", env={"LINES": "40"}, rows=6)
    assert r.returncode == 0, r.stderr
    take_back = "\x1b[A\x1b[2K"
    drawings = re.split(r"\r(?:\x1b\[A\x1b\[2K)+", r.stderr)
    erased = [m.count(take_back) for m in re.findall(r"\r(?:\x1b\[A\x1b\[2K)+", r.stderr)]
    assert erased and max(erased) <= 5, erased
    # Each drawing is at most five lines (and printed lines above it come first).
    assert all(d.count("\n") <= 5 or "kiln:" in d for d in drawings[1:-1]), drawings


def test_terminal_gets_the_live_display(module, tmp_path: Path) -> None:
    r = run_on_tty(tmp_path, "build", "build.py", "chain", env={})

    assert r.returncode == 0, r.stderr
    assert "\x1b[" in r.stderr
    assert summary(r.stderr)[0] == "done"
    assert "\x1b" not in r.stdout


@pytest.mark.parametrize(
    ("env", "option"),
    [
        ({"NO_COLOR": "1"}, None),
        ({"TERM": "dumb"}, None),
        ({}, "plain"),
    ],
)
def test_terminal_falls_back_to_plain_lines(
    module, tmp_path: Path, env: dict[str, str], option: str | None
) -> None:
    args = ["build", "build.py", "chain"] + (["--console", option] if option else [])
    r = run_on_tty(tmp_path, *args, env=env)

    assert r.returncode == 0, r.stderr
    assert "\x1b" not in r.stderr
    lines = [line.rstrip("\r") for line in r.stderr.splitlines()]
    assert any(PLAIN_LINE.match(line) for line in lines), lines
    assert summary(r.stderr)[:2] == ("done", 4)
