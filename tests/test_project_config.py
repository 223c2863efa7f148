"""[tool.kiln] in pyproject.toml: a project's options, under the command line's."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

MODULE = """
from kiln import *


@entrypoint
def env():
    return run_command(name="env.txt",
                       command=["sh", "-c", 'echo "A=${{A:-}} B=${{B:-}}" > "$0"', "{out}"])


@entrypoint
def broken():
    return run_command(name="broken.txt", command=["sh", "-c", "exit 3"])
"""


def kiln(cwd: Path, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kiln", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1", **(env or {})},
    )


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "models").mkdir()
    (tmp_path / "models/build.py").write_text(textwrap.dedent(MODULE))
    (tmp_path / "work").mkdir()
    return tmp_path


def configure(project: Path, text: str) -> None:
    body = "[project]\nname = 'p'\n\n[tool.kiln]\n" + textwrap.dedent(text)
    (project / "pyproject.toml").write_text(body)


def test_options_come_from_the_nearest_pyproject_paths_from_its_directory(project: Path) -> None:
    configure(project, 'output-dir = "out"\naction-env = ["A=1"]\nno-cache = true\n')
    r = kiln(project / "work", "build", "../models/build.py", "env")
    assert r.returncode == 0, r.stderr
    built = project / "out/genfiles/env/env.txt"
    assert built.read_text() == "A=1 B=\n"
    assert r.stdout.strip() == str(built)
    assert not (project / "work/kiln-out").exists()
    # kiln clean, run beside the project file, cleans the same directory.
    c = kiln(project, "clean")
    assert c.returncode == 0, c.stderr
    assert f"cleaned {project / 'out'}" in c.stderr
    assert not built.exists()


def test_the_command_line_wins_and_a_list_it_gives_replaces_the_file_s(project: Path) -> None:
    configure(project, 'output-dir = "out"\naction-env = ["A=1"]\n')
    r = kiln(
        project,
        "build",
        "models/build.py",
        "env",
        "--output-dir",
        "flag-out",
        "--action-env",
        "B=2",
    )
    assert r.returncode == 0, r.stderr
    assert (project / "flag-out/genfiles/env/env.txt").read_text() == "A= B=2\n"
    assert not (project / "out").exists()


def test_a_flag_without_a_value(project: Path) -> None:
    configure(project, "fail-fast = true\n")
    r = kiln(project, "build", "models/build.py", "broken", "env", "-j", "1")
    assert r.returncode == 1
    assert "not run" in r.stderr


def test_a_variable_of_the_environment_wins_over_the_file(project: Path) -> None:
    configure(project, 'executor = "dask://127.0.0.1:9"\n')  # refused: no remote cache
    refused = kiln(project, "build", "models/build.py", "env")
    assert refused.returncode == 2 and "dask://127.0.0.1:9" in refused.stderr
    r = kiln(project, "build", "models/build.py", "env", env={"KILN_EXECUTOR": "local"})
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    "text, message",
    [
        ("jbos = 2\n", "sets 'jbos', which is not an option of kiln's (did you mean 'jobs'?)"),
        ('jobs = "many"\n', "[tool.kiln] jobs:"),
        ("jobs = [1]\n", "jobs must be a string or a number"),
        ('fail-fast = "yes"\n', "fail-fast must be true or false"),
        ('console = "fancy"\n', "'fancy' is not one of"),
        ("output-dir = \n", "cannot read it as TOML"),
        ("[tool.kiln.x]\n", "'x', which is not an option"),
        ("help = true\n", "sets 'help', which is not an option of kiln's; a key"),
    ],
)
def test_a_bad_key_or_value_is_a_usage_error_naming_the_file(
    project: Path, text: str, message: str
) -> None:
    configure(project, text)
    r = kiln(project, "build", "models/build.py", "env")
    assert r.returncode == 2
    assert f"kiln: error: {project / 'pyproject.toml'}" in r.stderr
    assert message in r.stderr, r.stderr
    assert not (project / "kiln-out").exists()


def test_an_option_of_another_command_is_left_to_it(project: Path) -> None:
    configure(project, 'output = "page.html"\nno-wait = true\n')  # report's, clean's
    r = kiln(project, "build", "models/build.py", "env")
    assert r.returncode == 0, r.stderr


def test_only_the_nearest_pyproject_counts(project: Path) -> None:
    configure(project, 'output-dir = "out"\n')
    (project / "models/pyproject.toml").write_text("[project]\nname = 'inner'\n")
    r = kiln(project, "build", "models/build.py", "env")
    assert r.returncode == 0, r.stderr
    assert (project / "kiln-out/genfiles/env/env.txt").exists()


def test_a_fifo_named_pyproject_is_not_read(project: Path) -> None:
    os.mkfifo(project / "models/pyproject.toml")
    r = kiln(project, "build", "models/build.py", "env")  # would block reading a FIFO
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize(
    "config, args",
    [
        ('profile = "pyproject.toml"\n', ()),
        ('events = "pyproject.toml"\n', ()),
        ("", ("--profile", "../pyproject.toml")),
        ("", ("--events", "../pyproject.toml")),
        ("", ("--events", "link.toml")),  # a hard link to it
    ],
)
def test_the_pyproject_kiln_read_is_never_written_over(
    project: Path, config: str, args: tuple[str, ...]
) -> None:
    # kiln read its settings from it: --profile or --events there replaced it with a trace.
    configure(project, config)
    before = (project / "pyproject.toml").read_bytes()
    os.link(project / "pyproject.toml", project / "work/link.toml")
    r = kiln(project / "work", "build", *args, "../models/build.py", "env")
    assert r.returncode == 2, r.stderr
    assert "kiln never writes over what the build reads" in r.stderr, r.stderr
    assert str(project / "pyproject.toml") in r.stderr
    assert (project / "pyproject.toml").read_bytes() == before


def test_a_report_is_never_written_over_the_pyproject_kiln_read(project: Path) -> None:
    configure(project, 'output-dir = "out"\n')
    assert kiln(project, "build", "models/build.py", "env").returncode == 0
    before = (project / "pyproject.toml").read_bytes()
    r = kiln(project / "work", "report", "-o", "../pyproject.toml")
    assert r.returncode == 2, r.stderr
    assert "kiln never writes over what the build reads" in r.stderr, r.stderr
    assert (project / "pyproject.toml").read_bytes() == before
