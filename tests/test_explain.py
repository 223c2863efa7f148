"""``kiln explain``, ``kiln build --explain`` and ``kiln build --dry-run``: what
would run and why, through the real command line, and the dry run through the API."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from chain import chain_project, ran

from kiln.engine.scheduler import SchedulerOptions
from kiln.executor import BuildAction, BuildContext, BuildFile, Executor

pytestmark = pytest.mark.in_process


STAMP_MODULE = """
class Stamp(BuildAction):
    always_run = True

    def __init__(self, output, **kwargs):
        super().__init__(**kwargs)
        self.output = output

    def _invoke(self):
        with open("ran.log", "a") as log:
            log.write("stamp.out\\n")
        self.output.get_fs_path().write_text("stamped")

@entrypoint
def stamp():
    context = BuildContext.current()
    out = context.allocate_file("stamp.out")
    out.deps.add(Stamp(out, desc="Stamping", executor=context.executor))
    return out
"""

A, B, C, STAMP = "Running chain/a.out", "Running chain/b.out", "Running chain/c.out", "Stamping"


@pytest.fixture
def project(tmp_path: Path, write_module: Callable[..., Path]) -> Callable[[str], None]:
    """The chain (``b_op`` is b.out's operation) plus an always-run stamp."""
    return chain_project(tmp_path, write_module, STAMP_MODULE)


def reasons(text: str) -> dict[str, str]:
    """``ACTION: REASON`` lines of ``text``."""
    found = {}
    for line in text.splitlines():
        action, sep, reason = line.partition(": ")
        if sep and action in (A, B, C, STAMP):
            found[action] = reason
    return found


def snapshot(root: Path) -> dict[str, tuple[bytes, int]]:
    """Content and mtime of every file under ``root`` but the build state."""
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".kiln" not in p.parts
    }


def build(kiln: Callable[..., Any], *args: str) -> Any:
    result = kiln("build", "build.py", *args)
    assert result.returncode == 0, result.stderr
    return result


def test_explain_on_a_fresh_tree_says_never_built_and_runs_nothing(
    tmp_path: Path, project: Any, kiln: Callable[..., Any]
) -> None:
    result = kiln("explain", "build.py")
    assert result.returncode == 0, result.stderr
    assert reasons(result.stdout) == {
        A: "never built",
        B: "never built",
        C: "never built",
        STAMP: "marked always-run",
    }
    assert ran(tmp_path) == []
    assert snapshot(tmp_path / "kiln-out") == {}
    # Printed once, on stdout: no second copy on stderr.
    assert reasons(result.stderr) == {}


def test_explain_after_a_build_lists_only_the_always_run_action(
    tmp_path: Path, project: Any, kiln: Callable[..., Any]
) -> None:
    build(kiln)
    ran(tmp_path)
    result = kiln("explain", "build.py")
    assert result.returncode == 0
    assert reasons(result.stdout) == {STAMP: "marked always-run"}
    assert kiln("explain", "build.py", "chain").stdout.strip() == "everything is up to date"
    verbose = kiln("explain", "build.py", "chain", "-v")
    assert reasons(verbose.stdout) == {A: "up to date", B: "up to date", C: "up to date"}
    assert ran(tmp_path) == []


def test_explain_names_the_changed_input_and_runs_nothing(
    tmp_path: Path, project: Any, kiln: Callable[..., Any]
) -> None:
    build(kiln)
    ran(tmp_path)
    (tmp_path / "a.txt").write_text("alpha, edited")
    before = snapshot(tmp_path / "kiln-out")
    result = kiln("explain", "build.py", "chain")
    assert reasons(result.stdout) == {
        A: "input a.txt changed",  # a source file, relative to the working directory
        B: "input chain/a.out will be rebuilt",
        C: "input chain/b.out will be rebuilt",
    }
    assert snapshot(tmp_path / "kiln-out") == before
    assert ran(tmp_path) == []
    # Explaining recorded nothing: the build still runs them all.
    build(kiln, "chain")
    assert ran(tmp_path) == ["a.out", "b.out", "c.out"]


def test_explain_names_the_changed_parameter(
    tmp_path: Path, project: Callable[[str], None], kiln: Callable[..., Any]
) -> None:
    build(kiln)
    project("upper")
    result = kiln("explain", "build.py", "chain")
    why = reasons(result.stdout)
    assert set(why) == {B, C}
    assert why[B] == 'parameter argv[3] changed from "bang" to "upper"'
    assert why[C] == "input chain/b.out will be rebuilt"


FLAGGED_MODULE = """
class Flagged(BuildAction):
    def __init__(self, output, flags, **kwargs):
        super().__init__(**kwargs)
        self.output = output
        self.flags = flags

    def _invoke(self):
        self.output.get_fs_path().write_text(" ".join(self.flags))

@entrypoint
def flagged(extra=cl_arg("extra", default="")):
    context = BuildContext.current()
    out = context.allocate_file("flags.txt")
    flags = [
        "--iree-hal-target-device=local",
        "--iree-hal-local-target-device-backends=llvm-cpu",
        "--iree-llvmcpu-target-cpu=host",
    ] + ([extra] if extra else [])
    out.deps.add(Flagged(out, flags, desc="Flagging", executor=context.executor))
    return out
"""


def test_explain_shows_where_a_long_value_changed(
    write_module: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    write_module(FLAGGED_MODULE)
    build(kiln)
    result = kiln("explain", "build.py", "--extra=--iree-opt-level=O3")
    (line,) = [ln for ln in result.stdout.splitlines() if ln.startswith("Flagging: ")]
    # A list of plain values that gained (or lost) a few says which: the flag added.
    assert line == 'Flagging: parameter flags gained "--iree-opt-level=O3"', line


def test_explain_names_missing_and_modified_outputs(
    tmp_path: Path, project: Any, kiln: Callable[..., Any]
) -> None:
    build(kiln)
    out = tmp_path / "kiln-out" / "genfiles" / "chain"
    (out / "c.out").write_text("edited by hand")
    result = kiln("explain", "build.py", "chain", "--no-cache")
    assert reasons(result.stdout) == {C: "output chain/c.out was modified"}
    assert (out / "c.out").read_text() == "edited by hand"

    (out / "a.out").unlink()
    result = kiln("explain", "build.py", "chain", "--no-cache")
    # What depends on an output to be rebuilt would run too: its input may change.
    assert reasons(result.stdout) == {
        A: "output chain/a.out is missing",
        B: "input chain/a.out will be rebuilt",
        C: "input chain/b.out will be rebuilt",
    }
    assert not (out / "a.out").exists()


def test_explain_a_target_covers_only_what_it_needs(
    tmp_path: Path, project: Any, kiln: Callable[..., Any]
) -> None:
    result = kiln("explain", "build.py", "chain/b.out")
    assert result.returncode == 0, result.stderr
    assert reasons(result.stdout) == {A: "never built", B: "never built"}
    unknown = kiln("explain", "build.py", "chain/nope.out")
    assert unknown.returncode == 2
    assert "unknown target 'chain/nope.out'" in unknown.stderr


def test_explain_with_a_corrupt_state_warns_and_trusts_nothing(
    tmp_path: Path, project: Any, kiln: Callable[..., Any]
) -> None:
    build(kiln)
    (tmp_path / "kiln-out" / ".kiln" / "state.db").write_bytes(b"\x00garbage" * 512)
    result = kiln("explain", "build.py", "--no-cache")
    assert result.returncode == 0, result.stderr
    assert reasons(result.stdout) == {
        A: "never built",
        B: "never built",
        C: "never built",
        STAMP: "marked always-run",
    }
    [warning] = [line for line in result.stderr.splitlines() if "warning" in line]
    assert "state.db.corrupt-" in warning


def test_build_explain_says_why_as_each_action_starts(
    tmp_path: Path, project: Callable[[str], None], kiln: Callable[..., Any]
) -> None:
    first = build(kiln, "--explain", "-j", "1")
    lines = first.stderr.splitlines()
    assert reasons(first.stderr) == {
        A: "never built",
        B: "never built",
        C: "never built",
        STAMP: "marked always-run",
    }
    for action in (A, B, C, STAMP):
        why = next(i for i, line in enumerate(lines) if line.startswith(f"{action}: "))
        started = next(i for i, line in enumerate(lines) if line.endswith(f"] {action}"))
        assert why < started, first.stderr
    project("upper")
    second = build(kiln, "--explain", "-j", "1")
    why = reasons(second.stderr)
    assert set(why) == {B, C, STAMP}
    assert why[B] == 'parameter argv[3] changed from "bang" to "upper"'
    assert why[C] == "input chain/b.out changed"  # known now: b.out was rebuilt
    assert why[STAMP] == "marked always-run"
    assert "3 built, 1 up to date" in second.stderr
    assert ran(tmp_path) == ["a.out", "b.out", "b.out", "c.out", "c.out", "stamp.out", "stamp.out"]
    quiet = build(kiln)  # without --explain: no reasons
    assert reasons(quiet.stderr) == {}


def test_build_dry_run_lists_what_would_run_and_runs_nothing(
    tmp_path: Path, project: Any, kiln: Callable[..., Any]
) -> None:
    result = kiln("build", "build.py", "--dry-run")
    assert result.returncode == 0, result.stderr
    assert reasons(result.stderr) == {
        A: "never built",
        B: "never built",
        C: "never built",
        STAMP: "marked always-run",
    }
    assert "0 built, 0 up to date, 4 would run, 0 failed, 0 not run" in result.stderr
    assert result.stdout == ""
    assert ran(tmp_path) == []
    assert snapshot(tmp_path / "kiln-out") == {}  # no output, no manifest

    build(kiln)
    ran(tmp_path)
    (tmp_path / "a.txt").write_text("ALPHA")  # a.out comes out the same
    before = snapshot(tmp_path / "kiln-out")
    result = kiln("build", "build.py", "--dry-run")
    assert reasons(result.stderr) == {
        A: "input a.txt changed",  # a source file, relative to the working directory
        B: "input chain/a.out will be rebuilt",
        C: "input chain/b.out will be rebuilt",
        STAMP: "marked always-run",
    }
    assert snapshot(tmp_path / "kiln-out") == before
    assert ran(tmp_path) == []
    # The real build finds out a.out came back identical.
    assert "2 built, 2 up to date" in build(kiln).stderr
    assert ran(tmp_path) == ["a.out", "stamp.out"]


# -- the dry run through the API -------------------------------------------------


class Write(BuildAction):
    def __init__(self, output: BuildFile, text: str):
        super().__init__(desc=f"write {output.path}", executor=output.executor)
        self.output = output
        self.text = text

    def _invoke(self) -> None:
        self.output.get_fs_path().write_text(self.text)


def test_dry_run_api_reports_reasons_and_creates_no_output(tmp_path: Path) -> None:
    def run(text: str, dry_run: bool) -> tuple[list[tuple[str, str]], list[str]]:
        executor = Executor(tmp_path / "out")
        with executor.get_context(""):
            out = BuildContext.current().allocate_file("x.txt")
            out.deps.add(Write(out, text))
        try:
            result = executor.run([out], SchedulerOptions(jobs=1, dry_run=dry_run))
        finally:
            executor.close()
        return [(str(a), r) for a, r in result.would_run], [str(a) for a in result.built]

    assert run("one", dry_run=True) == ([("write x.txt", "never built")], [])
    assert not (tmp_path / "out" / "genfiles" / "x.txt").exists()
    assert run("one", dry_run=False) == ([], ["write x.txt"])
    assert run("one", dry_run=True) == ([], [])
    would, built = run("two", dry_run=True)
    assert would == [("write x.txt", 'parameter text changed from "one" to "two"')]
    assert (tmp_path / "out" / "genfiles" / "x.txt").read_text() == "one"


def test_a_list_that_gained_or_lost_a_few_values_names_them() -> None:
    from kiln.engine.incremental import why_key_changed

    def why(old: list[object], new: list[object]) -> str:
        return why_key_changed({"flags": old}, {}, {"flags": new}, {})

    assert why(["-a"], ["-a", "-b"]) == 'parameter flags gained "-b"'
    assert why(["-a", "-b", "-b"], ["-b", "-a"]) == 'parameter flags lost "-b"'
    assert (
        why(["-a", 1], ["-a", 2, 3])
        == "parameter flags gained 2; parameter flags gained 3; parameter flags lost 1"
    )
    # More than three values, or the same values reordered: the whole change, cut.
    assert why(["-a"], ["-a", "-b", "-c", "-d", "-e"]).startswith("parameter flags changed from")
    assert why(["-a", "-b"], ["-b", "-a"]).startswith("parameter flags")
