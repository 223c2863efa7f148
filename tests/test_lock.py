"""Two builds never run on one output directory at once.

The second waits, saying which process holds the directory, or with
``--no-wait`` exits 2 at once. A lock left by a dead build does not block.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from procs import tagged_processes as _tagged
from procs import wait_for

# `hold` starts, notes the pid of the kiln running it, and ends when
# marks/release exists.
MODULE = """
import os
import time
from pathlib import Path

MARKS = Path(__file__).parent / "marks"


class Hold(BuildAction):
    def __init__(self, out, **kw):
        super().__init__(**kw)
        self.out = out

    def _invoke(self):
        (MARKS / f"started-{os.getpid()}").touch()
        while not (MARKS / "release").exists():
            time.sleep(0.05)
        self.out.get_fs_path().write_text(str(os.getpid()))


@entrypoint
def hold():
    ctx = BuildContext.current()
    out = ctx.allocate_file("held.txt")
    out.deps.add(Hold(out, desc="hold", executor=ctx.executor))
    return out
"""


class Builds:
    """Starts ``kiln`` subprocesses in one directory; kills what is left at the end."""

    def __init__(self, root: Path):
        self.root = root
        self.tag = uuid.uuid4().hex
        self.started: list[subprocess.Popen[str]] = []

    def start(self, *args: str, command: str = "build") -> subprocess.Popen[str]:
        n = len(self.started)
        proc = subprocess.Popen(
            [sys.executable, "-m", "kiln", command, "build.py", *args]
            + (["--action-env", "KILN_TEST_TAG"] if command in ("build", "explain") else []),
            cwd=self.root,
            stdout=(self.root / f"out{n}.txt").open("w"),
            stderr=(self.root / f"err{n}.txt").open("w"),
            text=True,
            env={**os.environ, "NO_COLOR": "1", "KILN_TEST_TAG": self.tag},
        )
        self.started.append(proc)
        return proc

    def stderr(self, proc: subprocess.Popen[str]) -> str:
        return (self.root / f"err{self.started.index(proc)}.txt").read_text()

    def run(self, *args: str, command: str = "build", timeout: float = 60) -> tuple[int, str]:
        proc = self.start(*args, command=command)
        return proc.wait(timeout), self.stderr(proc)

    def holder(self) -> subprocess.Popen[str]:
        """A build that holds the output directory until marks/release appears."""
        proc = self.start()
        wait_for(
            lambda: (self.root / "marks" / f"started-{proc.pid}").exists(),
            60,
            "the first build to start its action",
        )
        return proc

    def close(self) -> None:
        for proc in self.started:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@pytest.fixture
def builds(write_module, tmp_path: Path) -> Iterator[Builds]:
    write_module(MODULE)
    (tmp_path / "marks").mkdir()
    b = Builds(tmp_path)
    try:
        yield b
    finally:
        (tmp_path / "marks" / "release").touch()
        b.close()


def test_second_build_waits_naming_the_holder(builds: Builds, tmp_path: Path) -> None:
    first = builds.holder()
    second = builds.start()
    wait_for(lambda: "waiting for" in builds.stderr(second), 30, "the second build to wait")

    out_dir = tmp_path / "kiln-out"
    assert f"waiting for the kiln build (pid {first.pid}) using {out_dir} to finish" in (
        builds.stderr(second)
    )
    time.sleep(1.0)
    assert second.poll() is None, "the second build did not wait"
    assert not (tmp_path / "marks" / f"started-{second.pid}").exists()

    (tmp_path / "marks" / "release").touch()
    assert first.wait(30) == 0, builds.stderr(first)
    assert second.wait(30) == 0, builds.stderr(second)
    # The second ran after the first and found its work done.
    assert "0 built, 1 up to date" in builds.stderr(second)
    assert (out_dir / "genfiles" / "hold" / "held.txt").read_text() == str(first.pid)


def test_no_wait_exits_2_at_once_naming_the_holder(builds: Builds, tmp_path: Path) -> None:
    first = builds.holder()
    out_dir = tmp_path / "kiln-out"
    for command in ("build", "clean"):
        start = time.monotonic()
        code, err = builds.run("--no-wait", command=command)
        assert code == 2, err
        assert time.monotonic() - start < 15
        assert f"another kiln build (pid {first.pid}) is using {out_dir}" in err
        assert "Traceback" not in err
    assert (out_dir / ".kiln" / "state.db").exists()  # clean removed nothing
    assert first.poll() is None


def test_waiting_build_stops_on_ctrl_c(builds: Builds) -> None:
    first = builds.holder()
    second = builds.start()
    wait_for(lambda: "waiting for" in builds.stderr(second), 30, "the second build to wait")
    second.send_signal(signal.SIGINT)
    assert second.wait(15) == 130
    assert "interrupted by SIGINT" in builds.stderr(second)
    assert first.poll() is None  # the holder goes on


def test_lock_of_a_killed_build_does_not_block(builds: Builds, tmp_path: Path) -> None:
    first = builds.holder()
    lock = tmp_path / "kiln-out" / ".kiln" / "lock"
    assert lock.read_text().strip() == str(first.pid)
    first.kill()
    first.wait()
    wait_for(lambda: not any(p for p in _tagged(builds.tag)), 10, "the killed build's workers")
    assert lock.read_text().strip() == str(first.pid)  # left behind, naming a dead process

    (tmp_path / "marks" / "release").touch()
    start = time.monotonic()
    code, err = builds.run("--no-wait")
    assert code == 0, err
    assert time.monotonic() - start < 30
    assert "waiting" not in err and "another kiln build" not in err
    assert "1 built" in err


def test_stale_pid_in_lock_file_does_not_block(builds: Builds, tmp_path: Path) -> None:
    lock = tmp_path / "kiln-out" / ".kiln" / "lock"
    lock.parent.mkdir(parents=True)
    (lock.parent / "format").write_text("kiln-output/1\n")  # an earlier build's
    lock.write_text("999999999\n")
    (tmp_path / "marks" / "release").touch()
    code, err = builds.run("--no-wait")
    assert code == 0, err
    assert "another kiln build" not in err
