"""The command line: ``kiln build`` and ``kiln list`` on modules given by path or
``-m``, target selection, what goes to stdout and stderr, and exit codes."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.in_process


HEADER = """\
from kiln import cl_arg, entrypoint, run_command, source_file
from kiln.executor import *


"""

MODULE = (
    HEADER
    + '''
"""Two small models."""


@entrypoint(description="the first model")
def alpha():
    return run_command(name="alpha.txt", command=["sh", "-c", 'echo alpha > "$0"', "{out}"])


@entrypoint
def beta():
    """The second model."""
    part = run_command(name="part.txt", command=["sh", "-c", 'echo part > "$0"', "{out}"])
    return run_command(name="beta.txt", inputs=[part],
                       command=["sh", "-c", 'cat "$0" > "$1"', "{inputs[0]}", "{out}"])


@entrypoint
def both():
    return [*alpha(), *beta()]


@entrypoint
def broken():
    return run_command(name="broken.txt", command=["sh", "-c", "echo went wrong >&2; exit 1"])
'''
)


@pytest.fixture
def module(write_module) -> Path:
    return write_module(MODULE, header=False)


def gen(tmp_path: Path, *parts: str, out: str = "kiln-out") -> str:
    return str(tmp_path.joinpath(out, "genfiles", *parts))


# -- build ---------------------------------------------------------------------


def test_build_one_entrypoint_prints_its_outputs(module, kiln, tmp_path: Path) -> None:
    r = kiln("build", "build.py", "beta")

    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [gen(tmp_path, "beta", "beta.txt")]
    assert Path(gen(tmp_path, "beta", "beta.txt")).read_text() == "part\n"
    assert not Path(gen(tmp_path, "alpha", "alpha.txt")).exists()
    # progress and the summary go to stderr, never to stdout
    assert "Running beta/beta.txt" in r.stderr
    assert "kiln: done: 2 built" in r.stderr


def test_build_several_targets_in_order(module, kiln, tmp_path: Path) -> None:
    r = kiln("build", "build.py", "beta", "alpha")

    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        gen(tmp_path, "beta", "beta.txt"),
        gen(tmp_path, "alpha", "alpha.txt"),
    ]


def test_target_named_twice_is_printed_once(module, kiln, tmp_path: Path) -> None:
    r = kiln("build", "build.py", "alpha", "beta", "alpha", "/alpha")

    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [
        gen(tmp_path, "alpha", "alpha.txt"),
        gen(tmp_path, "beta", "beta.txt"),
    ]


def test_build_a_file_by_its_graph_path(module, kiln, tmp_path: Path) -> None:
    r = kiln("build", "build.py", "beta/part.txt")

    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [gen(tmp_path, "beta", "part.txt")]
    assert not Path(gen(tmp_path, "beta", "beta.txt")).exists()
    assert "1 built" in r.stderr


def test_build_a_nested_entrypoint_by_path(module, kiln, tmp_path: Path) -> None:
    r = kiln("build", "build.py", "both/alpha")

    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == [gen(tmp_path, "both", "alpha", "alpha.txt")]


def test_build_without_targets_builds_every_entrypoint(module, kiln, tmp_path: Path) -> None:
    r = kiln("build", "build.py")

    assert r.returncode == 1  # 'broken' fails; the others still build
    assert sorted(r.stdout.splitlines()) == sorted(
        [
            gen(tmp_path, "alpha", "alpha.txt"),
            gen(tmp_path, "beta", "beta.txt"),
            gen(tmp_path, "both", "alpha", "alpha.txt"),
            gen(tmp_path, "both", "beta", "beta.txt"),
        ]
    )
    assert "went wrong" in r.stderr
    assert "6 built, 0 up to date, 1 failed, 0 not run" in r.stderr


def test_exit_codes(module, kiln) -> None:
    assert kiln("build", "build.py", "alpha").returncode == 0
    failed = kiln("build", "build.py", "broken")
    assert failed.returncode == 1
    assert failed.stdout == ""
    assert kiln("build", "build.py", "nope").returncode == 2
    assert kiln("build", "missing.py").returncode == 2


def test_unknown_target_suggests_names(module, kiln) -> None:
    r = kiln("build", "build.py", "bta")

    assert r.returncode == 2
    assert "unknown target 'bta'" in r.stderr
    assert "did you mean" in r.stderr and "beta" in r.stderr
    assert r.stdout == "" and "Traceback" not in r.stderr


def test_second_build_is_up_to_date_and_still_prints_outputs(module, kiln, tmp_path) -> None:
    assert kiln("build", "build.py", "beta").returncode == 0
    r = kiln("build", "build.py", "beta")

    assert r.returncode == 0
    assert r.stdout.splitlines() == [gen(tmp_path, "beta", "beta.txt")]
    assert "0 built, 2 up to date" in r.stderr


@pytest.mark.parametrize("where", ["relative", "absolute"])
def test_output_dir(module, kiln, tmp_path: Path, where: str) -> None:
    target = "builds/o1" if where == "relative" else str(tmp_path / "abs-out")
    r = kiln("build", "build.py", "alpha", "--output-dir", target)

    assert r.returncode == 0, r.stderr
    # Printed under the output directory as given (relative stays relative, as
    # iree.build prints it).
    assert r.stdout.splitlines() == [f"{target}/genfiles/alpha/alpha.txt"]
    expected = (tmp_path / target).resolve() / "genfiles" / "alpha" / "alpha.txt"
    assert expected.read_text() == "alpha\n"
    assert not (tmp_path / "kiln-out").exists()


@pytest.mark.parametrize("jobs", ["0", "-3", "many"])
def test_bad_jobs_is_a_usage_error(module, kiln, jobs: str) -> None:
    r = kiln("build", "build.py", "-j", jobs)

    assert r.returncode == 2
    assert "-j" in r.stderr
    assert "Traceback" not in r.stderr
    assert not Path(module.parent / "kiln-out" / "genfiles").exists()


def test_options_may_come_before_targets(module, kiln, tmp_path: Path) -> None:
    r = kiln("build", "build.py", "-j", "1", "--output-dir", "o", "alpha")

    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["o/genfiles/alpha/alpha.txt"]


def test_unknown_option_is_a_usage_error(module, kiln) -> None:
    r = kiln("build", "build.py", "--frobnicate")
    assert r.returncode == 2
    assert "--frobnicate" in r.stderr


# -- errors: no traceback unless -v ---------------------------------------------


def test_definition_error_has_no_traceback_unless_verbose(write_module, kiln) -> None:
    write_module(
        HEADER
        + """
@entrypoint
def bad():
    return BuildContext.current().file("nothing-here.txt")
""",
        header=False,
    )
    r = kiln("build", "build.py")
    assert r.returncode == 2
    assert "nothing-here.txt" in r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.startswith("kiln: error:")

    v = kiln("build", "build.py", "-v")
    assert v.returncode == 2
    assert "Traceback" in v.stderr


@pytest.mark.parametrize("where", ["build.py", "kiln/build.py"])
def test_error_while_loading_the_module_names_file_and_line(write_module, kiln, where) -> None:
    path = write_module(HEADER + "\nx = 1\ny = x / 0\n", name=where, header=False)
    r = kiln("build", where)

    line = path.read_text().splitlines().index("y = x / 0") + 1
    assert r.returncode == 2
    assert f"{path}:{line}" in r.stderr
    assert "ZeroDivisionError" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("where", ["build.py", "kiln/build.py"])
def test_error_in_an_entrypoint_body_names_file_and_line(write_module, kiln, where) -> None:
    # A project directory may be called "kiln" too: its frames are still the user's.
    path = write_module(
        HEADER
        + """
@entrypoint
def fine():
    return None

@entrypoint
def careless():
    settings = {}
    return settings["model"]
""",
        name=where,
        header=False,
    )
    r = kiln("build", where, "careless")  # (building only "fine" succeeds: test_hostile_fs)

    line = path.read_text().splitlines().index('    return settings["model"]') + 1
    assert r.returncode == 2
    assert f"{path}:{line}" in r.stderr
    assert "KeyError: 'model'" in r.stderr
    assert "Traceback" not in r.stderr
    assert r.stdout == ""

    v = kiln("build", where, "careless", "-v")
    assert v.returncode == 2 and "Traceback" in v.stderr


def test_syntax_error_in_module(write_module, kiln) -> None:
    write_module(HEADER + "\n@entrypoint\ndef oops(:\n    pass\n", header=False)
    r = kiln("build", "build.py")
    assert r.returncode == 2
    assert "syntax error" in r.stderr and "build.py:" in r.stderr


def test_module_without_entrypoints(write_module, kiln) -> None:
    write_module(HEADER + "\nX = 1\n", header=False)
    r = kiln("build", "build.py")
    assert r.returncode == 2
    assert "entrypoint" in r.stderr


def test_no_command_or_unknown_command(kiln) -> None:
    none = kiln()
    assert none.returncode == 2 and "usage: kiln" in none.stderr

    unknown = kiln("frobnicate", "build.py")
    assert unknown.returncode == 2 and "usage: kiln" in unknown.stderr

    helped = kiln("--help")
    assert helped.returncode == 0 and "usage: kiln" in helped.stdout


def test_build_without_a_module(kiln) -> None:
    r = kiln("build")
    assert r.returncode == 2
    assert "give the build module" in r.stderr and "kiln build --help" in r.stderr


@pytest.mark.parametrize(
    "argv", [["build", "--help"], ["build", "-j", "2", "-h"], ["explain", "-h"]]
)
def test_command_help_without_a_module(kiln, argv) -> None:
    r = kiln(*argv)
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith(f"usage: kiln {argv[0]} MODULE.py|-m MODULE")
    assert "--jobs" in r.stdout and "--target" in r.stdout
    assert f"kiln {argv[0]} MODULE.py --help" in " ".join(r.stdout.split())


def test_typos_of_commands_and_options_get_a_suggestion(module, kiln) -> None:
    command = kiln("biuld", "build.py")
    assert command.returncode == 2
    assert "unknown command 'biuld' (did you mean 'build'?" in command.stderr

    option = kiln("build", "build.py", "--dyr-run")
    assert option.returncode == 2
    assert "unrecognized arguments: --dyr-run (--dyr-run: did you mean --dry-run" in option.stderr

    valued = kiln("clean", "--output-dri=x")
    assert valued.returncode == 2 and "did you mean --output-dir?" in valued.stderr


# -- list ------------------------------------------------------------------------


def test_list_entrypoints_with_descriptions(module, kiln) -> None:
    r = kiln("list", "build.py")

    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["alpha", "the", "first", "model"]
    assert lines[1].split() == ["beta", "The", "second", "model."]
    firsts = [line.split()[0] for line in lines]
    assert set(firsts) >= {"alpha", "beta", "both", "broken"}
    assert not Path(module.parent / "kiln-out" / "genfiles").exists()  # lists, builds nothing


def test_list_all_shows_files_and_actions(module, kiln) -> None:
    r = kiln("list", "build.py", "--all")

    assert r.returncode == 0, r.stderr
    words = [line.split() for line in r.stdout.splitlines()]
    assert ["file", "beta/part.txt"] in words
    assert ["file", "both/alpha/alpha.txt"] in words
    assert ["context", "beta"] in words
    assert ["action", "Running", "beta/beta.txt"] in words


# -- module by name, python -m kiln, the console script -------------------------


@pytest.fixture
def package(tmp_path: Path) -> Path:
    pkg = tmp_path / "models_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "data.txt").write_text("packaged\n")
    (pkg / "builds.py").write_text(
        HEADER
        + """
@entrypoint(description="copy packaged data")
def packaged():
    return run_command(name="copy.txt", inputs=[source_file("data.txt")],
                       command=["cp", "{inputs[0]}", "{out}"])
"""
    )
    return pkg


def test_build_module_by_name(package: Path, kiln_subprocess, tmp_path: Path) -> None:
    kiln = kiln_subprocess  # ``-m`` finds the package through the working directory
    r = kiln("build", "-m", "models_pkg.builds", "packaged")

    assert r.returncode == 0, r.stderr
    out = gen(tmp_path, "packaged", "copy.txt")
    assert r.stdout.splitlines() == [out]
    assert Path(out).read_text() == "packaged\n"

    listed = kiln("list", "-m", "models_pkg.builds")
    assert listed.returncode == 0
    assert listed.stdout.split() == ["packaged", "copy", "packaged", "data"]


def test_unknown_module_name(kiln) -> None:
    r = kiln("build", "-m", "no_such_pkg.builds")
    assert r.returncode == 2
    assert "no_such_pkg.builds" in r.stderr and "Traceback" not in r.stderr


def test_console_script(module, tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "kiln"
    if not script.exists():
        pytest.skip("the kiln console script is not installed beside this interpreter")
    proc = subprocess.run(
        [str(script), "build", "build.py", "alpha"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "NO_COLOR": "1"},
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [gen(tmp_path, "alpha", "alpha.txt")]


# -- graph -------------------------------------------------------------------------


def test_graph_is_dot_text_and_says_when_dot_is_missing(module, kiln, tmp_path: Path) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    without = kiln("graph", "build.py", "alpha", env={"PATH": str(bare)})
    assert without.returncode == 0, without.stderr
    assert without.stdout.startswith("digraph kiln {")
    assert "Graphviz's dot" in without.stderr and "apt-get install graphviz" in without.stderr

    (bare / "dot").write_text("#!/bin/sh\ncat\n")
    (bare / "dot").chmod(0o755)
    with_dot = kiln("graph", "build.py", "alpha", env={"PATH": str(bare)})
    assert with_dot.returncode == 0 and with_dot.stdout == without.stdout
    assert "Graphviz" not in with_dot.stderr


def test_graph_names_reach_graphviz_as_written(write_module, kiln, tmp_path: Path) -> None:
    # Graphviz reads DOT as UTF-8 and knows no \\u escape: a JSON-quoted label was
    # drawn as 'mod\\u00e8le'. A quote in a name stays the name's.
    write_module(
        """
        @entrypoint
        def zoo():
            return run_command(name='modèle-日本 "q".txt',
                               command=["sh", "-c", 'echo x > "$0"', "{out}"])
        """
    )
    r = kiln("graph", "build.py", "zoo")
    assert r.returncode == 0, r.stderr
    assert "\\u" not in r.stdout
    assert 'modèle-日本 \\"q\\".txt' in r.stdout, r.stdout
    dot = subprocess.run(
        ["dot", "-Tplain"], input=r.stdout, capture_output=True, text=True, timeout=60
    )
    assert dot.returncode == 0, dot.stderr
    assert '"zoo/modèle-日本 \\"q\\".txt" solid ellipse' in dot.stdout, dot.stdout


# -- help ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "command", ["clean", "report", "cache", "completion", "devices", "compare"]
)
def test_help_of_commands_without_a_module_reads_as_help(kiln, command: str) -> None:
    r = kiln(command, "--help")
    assert r.returncode == 0, r.stderr
    assert "``" not in r.stdout and "kiln.cli" not in r.stdout  # no RST, no module names
    # Every option says what it does, on its line or (after a long one) the next.
    lines = r.stdout.splitlines()
    for i, line in enumerate(lines):
        if re.match(r"^  -", line) and not re.search(r"\S  +\S", line.strip()):
            assert lines[i + 1].startswith(" " * 20), f"no description: {line!r}"


def test_devices_reads_the_project_settings_and_refuses_a_bad_option(kiln, tmp_path) -> None:
    """kiln devices parses as the other commands do: a bad option is exit 2 with
    kiln's message (it was said as the build module's code calling sys.exit), and
    [tool.kiln]'s executor counts (it was accepted and ignored)."""
    r = kiln("devices", "--bogus")
    assert r.returncode == 2 and "unrecognized arguments: --bogus" in r.stderr, r.stderr
    assert "build module" not in r.stderr
    (tmp_path / "pyproject.toml").write_text('[tool.kiln]\nexecutor = "nonsense://x"\n')
    r = kiln("devices")
    assert r.returncode == 2 and "--executor 'nonsense://x'" in r.stderr, r.stderr
