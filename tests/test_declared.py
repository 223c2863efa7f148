"""Nothing declared is silently skipped: an action an entrypoint declares but does
not reach through what it returns is named (an error with --strict), and an output
that no action produces is a definition error, never a printed path."""

from __future__ import annotations

from pathlib import Path

import pytest

pytestmark = pytest.mark.in_process

MODULE = """
class WriteAction(BuildAction):
    def __init__(self, output, **kw):
        super().__init__(**kw)
        self.output = output

    def _invoke(self):
        self.output.get_fs_path().write_text("written")


def echo(name, text):
    return run_command(name=name, command=["sh", "-c", f'echo {text} > "$0"', "{out}"])


@entrypoint
def kept():
    a = echo("a.txt", "a")
    run_command(name="lost.txt", command=["sh", "-c", 'echo lost > "$0"', "{out}"])
    return a


@entrypoint
def clean():
    return echo("c.txt", "c")


@entrypoint
def shares():
    echo("shared.txt", "s")
    return None


@entrypoint
def uses_shared():
    ctx = BuildContext.current()
    shared = ctx.file("/shares/shared.txt")
    return run_command(name="u.txt", inputs=[shared],
                       command=["sh", "-c", 'cat "$0" > "$1"', "{inputs[0]}", "{out}"])


@entrypoint
def nested_discarded():
    clean()
    return echo("n.txt", "n")


@entrypoint
def producerless():
    ctx = BuildContext.current()
    out = ctx.allocate_file("never.txt")
    WriteAction(out, desc="write never", executor=ctx.executor)  # out.deps not given
    return out


@entrypoint
def produced():
    ctx = BuildContext.current()
    out = ctx.allocate_file("made.txt")
    out.deps.add(WriteAction(out, desc="write made", executor=ctx.executor))
    return out
"""


@pytest.fixture
def module(write_module) -> Path:
    return write_module(MODULE)


def _line(module: Path, text: str) -> int:
    return next(i for i, line in enumerate(module.read_text().splitlines(), 1) if text in line)


def test_an_action_declared_but_not_returned_is_named_with_its_line(module, kiln, tmp_path):
    r = kiln("build", "build.py", "kept")
    assert r.returncode == 0, r.stderr
    lost_line = _line(module, 'name="lost.txt"')
    assert "warning: 1 action(s) declared but not reached" in r.stderr
    assert f"'Running kept/lost.txt' (at {module}:{lost_line})" in r.stderr
    assert not (tmp_path / "kiln-out/genfiles/kept/lost.txt").exists()
    assert r.stdout.splitlines() == [str(tmp_path / "kiln-out/genfiles/kept/a.txt")]


def test_strict_makes_it_a_definition_error_that_builds_nothing(module, kiln, tmp_path):
    r = kiln("build", "build.py", "kept", "--strict")
    assert r.returncode == 2
    assert "kiln: error: 1 action(s) declared but not reached" in r.stderr
    assert "Running kept/lost.txt" in r.stderr
    assert r.stdout == ""
    assert not (tmp_path / "kiln-out/genfiles/kept/a.txt").exists()


def test_only_the_requested_entrypoints_are_judged(module, kiln):
    r = kiln("build", "build.py", "clean", "--strict")
    assert r.returncode == 0, r.stderr
    assert "declared but not reached" not in r.stderr


def test_a_file_another_entrypoint_uses_is_reached(module, kiln):
    r = kiln("build", "build.py", "shares", "uses_shared")
    assert r.returncode == 0, r.stderr
    assert "declared but not reached" not in r.stderr


def test_a_nested_entrypoint_whose_result_is_dropped_is_named(module, kiln):
    r = kiln("build", "build.py", "nested_discarded")
    assert r.returncode == 0, r.stderr
    assert "'Running nested_discarded/clean/c.txt'" in r.stderr


def test_an_output_no_action_produces_is_a_definition_error(module, kiln, tmp_path):
    r = kiln("build", "build.py", "producerless")
    assert r.returncode == 2
    line = _line(module, 'allocate_file("never.txt")')
    site = f"{module}:{line}"
    assert f"kiln: error: {site}: 'producerless/never.txt' is an output of entrypoint" in r.stderr
    assert "no action produces" in r.stderr
    assert r.stdout == ""  # never the path of a file kiln did not build
    # The other entrypoints still build, and say which one is broken.
    ok = kiln("build", "build.py", "produced")
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "kiln-out/genfiles/produced/made.txt").read_text() == "written"
    assert "skipped the broken entrypoint 'producerless'" in ok.stderr
