"""A build module written for ``iree.build`` runs under kiln with only its import
lines changed: run directly (``python build.py``, which calls ``iree_build_main()``)
and through ``kiln build``."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

# An iree.build module in the style of IREE's own tests and of shortfin's builders.
# Only the two import lines differ from the original (``iree.build`` -> ``kiln``).
IREE_BUILD_MODULE = '''\
from kiln import *
from kiln.executor import (
    ActionConcurrency,
    BuildAction,
    BuildContext,
    BuildFile,
    FileNamespace,
)

import os
from pathlib import Path
from typing import Callable


class WriteTextAction(BuildAction):
    """An in-process (thread) action."""

    def __init__(self, text: str, output_file: BuildFile, **kwargs):
        super().__init__(**kwargs)
        self.text = text
        self.output_file = output_file

    def _invoke(self):
        path = self.output_file.get_fs_path()
        path.write_text(f"{self.text} {os.getpid()}")


class _ThunkTrampoline:
    def __init__(self, thunk, args):
        self.thunk = thunk
        self.args = args

    def __call__(self):
        self.thunk(*self.args)


class ExecuteOutOfProcessThunkAction(BuildAction):
    """Executes a callback thunk with arguments; both must be pickleable."""

    def __init__(self, thunk, args, concurrency=ActionConcurrency.PROCESS, **kwargs):
        super().__init__(concurrency=concurrency, **kwargs)
        self.trampoline = _ThunkTrampoline(thunk, args)

    def _remotable_thunk(self) -> Callable[[], None]:
        return self.trampoline


def _write_pid_file(output_path: Path, prefix: str):
    output_path.write_text(f"{prefix} {os.getpid()}")


def _concat(output_path: Path, *input_paths: Path):
    output_path.write_text("|".join(Path(p).read_text() for p in input_paths))


@entrypoint(description="Writes a greeting in-process")
def write_hello(greeting=cl_arg("greeting", default="hello", help="What to write")):
    context = BuildContext.current()
    output_file = context.allocate_file("hello.txt")
    action = WriteTextAction(
        greeting, output_file, desc="Writing hello", executor=context.executor
    )
    output_file.deps.add(action)
    return output_file


@entrypoint
def write_out_of_process_pid():
    context = BuildContext.current()
    output_file = context.allocate_file("pid.txt", namespace=FileNamespace.BIN)
    action = ExecuteOutOfProcessThunkAction(
        _write_pid_file,
        args=[output_file.get_fs_path(), "process"],
        desc="Writing pid file",
        executor=context.executor,
    )
    output_file.deps.add(action)
    return output_file


@entrypoint
def combined():
    hello = write_hello()
    pid = write_out_of_process_pid()
    context = BuildContext.current()
    joined = context.allocate_file("joined.txt", namespace=FileNamespace.PLATFORM_BIN)
    action = ExecuteOutOfProcessThunkAction(
        _concat,
        args=[joined.get_fs_path()] + [f.get_fs_path() for f in hello + pid],
        desc="Joining",
        executor=context.executor,
        deps=hello + pid,
    )
    joined.deps.add(action)
    return "joined.txt"


if __name__ == "__main__":
    iree_build_main()
'''


@pytest.fixture
def module(tmp_path: Path) -> Path:
    path = tmp_path / "proj" / "build_models.py"
    path.parent.mkdir()
    path.write_text(IREE_BUILD_MODULE)
    return path


def run(cwd: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1"},
    )


def check_outputs(out_dir: Path, stdout: str, greeting: str, given: str | None = None) -> None:
    """The outputs under ``out_dir``; printed under ``given`` (the --output-dir given)
    if any, else by their absolute paths."""
    from kiln.executor import FileNamespace
    from kiln.graph import namespace_dir

    hello = out_dir / "genfiles" / "combined" / "write_hello" / "hello.txt"
    pid = out_dir / "bin" / "combined" / "write_out_of_process_pid" / "pid.txt"
    joined = out_dir / namespace_dir(FileNamespace.PLATFORM_BIN) / "combined" / "joined.txt"
    shown = joined if given is None else Path(given) / joined.relative_to(out_dir)
    assert stdout.splitlines() == [str(shown)]
    text, thread_pid = hello.read_text().split()
    assert text == greeting
    prefix, process_pid = pid.read_text().split()
    assert prefix == "process"
    assert thread_pid != process_pid  # the PROCESS action really ran in a worker
    assert joined.read_text() == f"{greeting} {thread_pid}|process {process_pid}"


def test_run_as_a_script(module: Path, tmp_path: Path) -> None:
    proc = run(tmp_path, str(module), "combined", "--output-dir", "out", "--greeting", "hi")

    assert proc.returncode == 0, proc.stderr
    check_outputs(tmp_path / "out", proc.stdout, "hi", given="out")


def test_run_as_a_script_lists_entrypoints(module: Path, tmp_path: Path) -> None:
    proc = run(tmp_path, str(module), "--list")

    assert proc.returncode == 0, proc.stderr
    names = [line.split()[0] for line in proc.stdout.splitlines()]
    assert names == [
        "write_hello",
        "write_out_of_process_pid",
        "combined",
        "combined/write_hello",
        "combined/write_out_of_process_pid",
    ]

    everything = run(tmp_path, str(module), "--list-all")
    assert everything.returncode == 0, everything.stderr
    assert "combined/joined.txt" in everything.stdout
    assert "write_out_of_process_pid/pid.txt" in everything.stdout


def test_run_as_a_script_builds_every_entrypoint_by_default(module: Path, tmp_path) -> None:
    proc = run(tmp_path, str(module), "--output-dir", "out")

    assert proc.returncode == 0, proc.stderr
    out = tmp_path / "out"
    assert len(proc.stdout.splitlines()) == 3
    assert (out / "genfiles" / "write_hello" / "hello.txt").read_text().startswith("hello ")
    assert (out / "bin" / "write_out_of_process_pid" / "pid.txt").is_file()


def test_run_through_kiln_build(module: Path, tmp_path: Path) -> None:
    proc = run(
        tmp_path, "-m", "kiln", "build", "proj/build_models.py", "combined", "--greeting", "servus"
    )

    assert proc.returncode == 0, proc.stderr
    check_outputs(tmp_path / "kiln-out", proc.stdout, "servus")

    again = run(
        tmp_path, "-m", "kiln", "build", "proj/build_models.py", "combined", "--greeting", "servus"
    )
    assert again.returncode == 0, again.stderr
    assert "0 built, 3 up to date" in again.stderr
    check_outputs(tmp_path / "kiln-out", again.stdout, "servus")


def test_changed_option_rebuilds_through_kiln(module: Path, tmp_path: Path) -> None:
    first = run(tmp_path, "-m", "kiln", "build", "proj/build_models.py", "write_hello")
    assert first.returncode == 0, first.stderr
    second = run(
        tmp_path, "-m", "kiln", "build", "proj/build_models.py", "write_hello", "--greeting", "moin"
    )
    assert second.returncode == 0, second.stderr
    hello = tmp_path / "kiln-out" / "genfiles" / "write_hello" / "hello.txt"
    assert hello.read_text().split()[0] == "moin"
