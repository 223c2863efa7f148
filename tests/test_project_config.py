"""[tool.kiln] in pyproject.toml: a project's options, under the command line's."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

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


def kiln(
    cwd: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "kiln", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
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


def _fifo(path: Path) -> None:
    os.mkfifo(path)


def _directory(path: Path) -> None:
    path.mkdir()


def _device(path: Path) -> None:
    path.symlink_to("/dev/null")


def _dangling(path: Path) -> None:
    path.symlink_to(path.parent / "gone.toml")


def _loop(path: Path) -> None:
    path.symlink_to(path.name)


def _too_large(path: Path) -> None:
    path.write_text("[tool.kiln]\n" + "#" * (1 << 20) + "\n")


def _not_utf8(path: Path) -> None:
    path.write_bytes(b"[tool.kiln]\nname = '\xff'\n")


@pytest.mark.parametrize(
    "make, said",
    [
        (_fifo, "it is a FIFO, not a regular file"),
        (_directory, "it is a directory, not a regular file"),
        (_device, "it is a device, not a regular file"),
        (_dangling, "it is a symbolic link to nothing"),
        (_loop, "kiln cannot read it (Too many levels of symbolic links)"),
        (_too_large, "it is larger than 1 MiB"),
        (_not_utf8, "cannot read it as TOML"),
    ],
)
def test_a_nearest_pyproject_that_is_no_readable_file_is_a_usage_error(
    project: Path, make: Any, said: str
) -> None:
    """Never waited on, never passed over for the one above (whose settings would
    then apply in silence): exit 2 naming the file and what it is."""
    configure(project, 'output-dir = "out"\n')
    nearest = project / "models/pyproject.toml"
    make(nearest)
    for args in (["build", "models/build.py", "env"], ["list", "models/build.py"]):
        r = kiln(project, *args, timeout=60)  # a FIFO would block a plain open
        assert r.returncode == 2, r.stderr
        assert f"kiln: error: {nearest}: " in r.stderr, r.stderr
        assert said in r.stderr, r.stderr
    assert not (project / "out").exists() and not (project / "kiln-out").exists()


@pytest.mark.parametrize("command", [["clean"], ["cache", "stats"], ["report"]])
def test_commands_without_a_module_say_so_too(project: Path, command: list[str]) -> None:
    os.mkfifo(project / "work/pyproject.toml")
    r = kiln(project / "work", *command, timeout=60)
    assert r.returncode == 2, r.stderr
    assert f"{project / 'work/pyproject.toml'}: kiln takes its settings" in r.stderr, r.stderr
    assert "it is a FIFO" in r.stderr


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file of mode 000")
def test_an_unreadable_pyproject_is_a_usage_error(project: Path) -> None:
    configure(project, 'output-dir = "out"\n')
    (project / "pyproject.toml").chmod(0)
    r = kiln(project, "build", "models/build.py", "env")
    assert r.returncode == 2, r.stderr
    assert "kiln cannot read it (Permission denied)" in r.stderr, r.stderr


def test_a_pyproject_that_links_to_a_file_is_read(project: Path) -> None:
    configure(project, 'output-dir = "out"\n')
    (project / "pyproject.toml").rename(project / "shared.toml")
    (project / "pyproject.toml").symlink_to("shared.toml")
    r = kiln(project, "build", "models/build.py", "env")
    assert r.returncode == 0, r.stderr
    assert (project / "out/genfiles/env/env.txt").exists()


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
