"""The suite's own machinery: its ordering (``conftest.LONGEST``: every entry names
a test that exists, so that a renamed long test is not silently left to start
last), and the ``kiln`` fixture's process (``in_process`` marks run the CLI in the
test's own process, the others in a process of their own)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import LONGEST

HERE = Path(__file__).parent


def test_each_longest_entry_names_a_test_of_its_file() -> None:
    assert len(set(LONGEST)) == len(LONGEST)
    for entry in LONGEST:
        file, name = entry.split("::")
        assert f"def {name}(" in (HERE / file).read_text(), entry


PID_MODULE = """
import os
from kiln import *

@entrypoint
def pid():
    return run_command(name="pid.txt", command=["sh", "-c", f"echo {os.getpid()} > {{out}}"])
"""


def _kiln_pid(kiln, tmp_path: Path) -> int:
    (tmp_path / "build.py").write_text(PID_MODULE)
    assert kiln("build", "build.py", "--no-cache").returncode == 0
    return int((tmp_path / "kiln-out" / "genfiles" / "pid" / "pid.txt").read_text())


@pytest.mark.in_process
def test_the_kiln_fixture_of_an_in_process_test_runs_here(kiln, tmp_path: Path) -> None:
    assert _kiln_pid(kiln, tmp_path) == os.getpid()


def test_the_kiln_fixture_of_another_test_runs_a_process(kiln, tmp_path: Path) -> None:
    assert _kiln_pid(kiln, tmp_path) != os.getpid()
