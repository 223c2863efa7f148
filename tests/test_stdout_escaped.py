"""What kiln prints on stdout (listings, built paths, help, graph text) comes from
build modules and the file system: it reaches the terminal only escaped, as its
stderr does (``kiln.base.terminal.printable``), in every command."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.in_process

TITLE = "\x1b]0;PWNED\x07\x1b[2J\x9b31m"  # retitles, clears the screen, a C1 CSI
SHOWN = "\\x1b]0;PWNED\\x07\\x1b[2J\\x9b31m"

MODULE = r"""
T = "\x1b]0;PWNED\x07\x1b[2J\x9b31m"

@entrypoint(description="MNIST " + T)
def ep(flavour=cl_arg("flavour", default="a", help="which one " + T)):
    src = source_file("evil" + T + ".txt")
    return run_command(name="right\u202eleft.txt", inputs=[src],
                       command=["cp", "{inputs[0]}", "{out}"])
"""


@pytest.fixture
def project(write_module, tmp_path: Path) -> Path:
    write_module(MODULE)
    (tmp_path / f"evil{TITLE}.txt").write_text("data\n")
    return tmp_path


@pytest.mark.parametrize(
    "argv",
    [
        ["list", "build.py"],
        ["list", "build.py", "--all"],
        ["list", "build.py", "--all", "--bare"],
        ["build.py", "--list-all"],
        ["build", "build.py", "--help"],
        ["graph", "build.py"],
        ["build", "build.py"],
    ],
    ids=["list", "list-all", "list-bare", "iree-list-all", "help", "graph", "build"],
)
def test_stdout_carries_no_raw_control_character(kiln, project: Path, argv: list[str]) -> None:
    r = kiln(*argv)
    assert r.returncode == 0, r.stderr
    for raw in ("\x1b", "\x07", "\x9b", "\u202e"):
        assert raw not in r.stdout, (raw, r.stdout)
    if argv[0] == "build" and "--help" not in argv:
        assert "right\\u202eleft.txt" in r.stdout  # the built path, escaped
        assert (project / "kiln-out/genfiles/ep/right\u202eleft.txt").read_text() == "data\n"
    elif argv[0] != "graph":
        assert SHOWN in r.stdout  # said, escaped, not dropped


PROGRAMS = """
import ctypes, subprocess

class Talks(BuildAction):
    def __init__(self, out, **kw):
        super().__init__(**kw)
        self.out = out
        out.deps.add(self)

    def _invoke(self):
        subprocess.run(["echo", "PROGRAM of a thread action"], check=True)
        ctypes.CDLL(None).printf(b"PRINTF of a thread action\\n")
        ctypes.CDLL(None).fflush(None)
        self.out.get_fs_path().write_text("x")

@entrypoint
def talks():
    ctx = BuildContext.current()
    return Talks(ctx.allocate_file("t.txt"), desc="talks", executor=ctx.executor).out
"""


def test_stdout_carries_only_the_built_paths_whatever_the_builds_programs_write(
    write_module, kiln_subprocess
) -> None:
    """A program an action in kiln's process starts (or a native library) writes to
    descriptor 1: kiln's stdout is its own, so that goes to stderr, never among the
    paths a script reads."""
    write_module(PROGRAMS)
    r = kiln_subprocess("build", "build.py", "--no-cache")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert len(lines) == 1 and lines[0].endswith("kiln-out/genfiles/talks/t.txt"), r.stdout
    assert "PROGRAM of a thread action" in r.stderr and "PRINTF of a thread action" in r.stderr
