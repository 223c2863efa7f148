"""The suite's own machinery: its ordering (``conftest.LONGEST``: every entry names
a test that exists, so that a renamed long test is not silently left to start
last), and the ``kiln`` fixture's process (``in_process`` marks run the CLI in the
test's own process, the others in a process of their own)."""

from __future__ import annotations

import os
import subprocess
import sys
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
import subprocess
import sys
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


# -- what the suite says of itself ----------------------------------------------------

TINY = """
import needs

def test_runs():
    pass

def test_needs_what_is_missing():
    needs.module("kiln_no_such_module")
"""


@pytest.mark.parametrize("quiet", [[], ["-q"]], ids=["plain", "quiet"])
@pytest.mark.parametrize("ci", ["", "1"], ids=["here", "ci"])
def test_a_run_ends_with_its_counts_and_ci_fails_what_it_lacks(
    quiet: list[str], ci: str, tmp_path: Path
) -> None:
    """Under the project's pytest settings (``-q`` given or not), a run's last line
    counts what passed, skipped and failed; what a test needs that the test command
    provides skips it here and fails it in CI (``tests/needs.py``)."""
    (tmp_path / "test_tiny.py").write_text(TINY)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_") and k != "CI"}
    env.update(PYTHONPATH=str(HERE), **({"CI": ci} if ci else {}))
    argv = [sys.executable, "-m", "pytest", *quiet, "-n", "0", "-p", "no:cacheprovider"]
    argv += ["-c", str(HERE.parent / "pyproject.toml"), "--rootdir", str(tmp_path)]
    r = subprocess.run(
        [*argv, str(tmp_path / "test_tiny.py")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    last = r.stdout.strip().splitlines()[-1]
    if ci:
        assert r.returncode == 1 and "1 failed, 1 passed" in last, r.stdout
        assert "CI must provide it" in r.stdout
    else:
        assert r.returncode == 0 and "1 passed, 1 skipped" in last, r.stdout


def test_no_test_skips_on_its_own_for_what_the_test_command_installs() -> None:
    """``tests/needs.py`` is the one place that decides skip or fail."""
    for path in HERE.glob("*.py"):
        if path.name not in ("needs.py", "test_suite_order.py"):
            text = path.read_text()
            assert "importorskip" not in text and 'environ.get("CI")' not in text, path
