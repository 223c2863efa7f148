"""Compile targets given on the command line reach a compile, or the command says
why not: a ``--target`` that no compile of the requested entrypoints compiles for
(their modules fix their targets with ``compile(targets=[...])``) is exit 2 naming
those compiles; ``requested_targets(default=...)`` lets a module take kiln's."""

from __future__ import annotations

from pathlib import Path

import needs
import pytest

needs.module("iree.compiler")

ADD = """func.func @add(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = arith.addf %a, %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""

MODULE = """
@entrypoint
def fixed():
    return compile(name="add", source=source_file("add.mlir"), targets=["vmvx"])  # FIXED

@entrypoint
def taking():
    targets = requested_targets(default=["vmvx"])
    return compile(name="add", source=source_file("add.mlir"), targets=targets)

@entrypoint
def fixed_flags():
    return compile(name="plain", source=source_file("add.mlir"), target_default=False,  # FLAGS
                   flags=["--iree-hal-target-device=local",
                          "--iree-hal-local-target-device-backends=vmvx"])
"""


pytestmark = pytest.mark.in_process


@pytest.fixture
def module(write_module, tmp_path: Path) -> Path:
    (tmp_path / "add.mlir").write_text(ADD)
    return write_module(MODULE)


def line_of(path: Path, marker: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if marker in line)


def would_compile(stdout: str) -> list[str]:
    """The targets of the compiles ``kiln explain`` says would run."""
    return sorted(
        line.split("(for ", 1)[1].split(")", 1)[0]
        for line in stdout.splitlines()
        if line.startswith("Compiling ") and "(for " in line
    )


@pytest.mark.parametrize("command", ["build", "explain"])
def test_a_target_no_compile_uses_is_an_error_naming_the_compiles(
    module: Path, kiln, tmp_path: Path, command: str
) -> None:
    r = kiln(command, "build.py", "fixed", "fixed_flags", "--target", "cuda:sm_89")

    assert r.returncode == 2, r.stderr
    assert "--target cuda:sm_89: no compile of the requested entrypoints compiles for it" in (
        r.stderr
    )
    assert f"{module}:{line_of(module, '# FIXED')}: vmvx" in r.stderr
    assert f"{module}:{line_of(module, '# FLAGS')}: no target device" in r.stderr
    assert "requested_targets(default=[...])" in r.stderr
    assert not (tmp_path / "kiln-out").exists()  # nothing ran, nothing was created


def test_iree_build_target_devices_are_checked_too(module: Path, kiln) -> None:
    r = kiln("explain", "build.py", "fixed", "--iree-hal-target-device=llvm-cpu")
    assert r.returncode == 2
    assert "--iree-hal-target-device=llvm-cpu: no compile" in r.stderr


def test_a_target_that_a_fixed_compile_has_is_used(module: Path, kiln) -> None:
    r = kiln("explain", "build.py", "fixed", "--target", "vmvx")
    assert r.returncode == 0, r.stderr
    assert would_compile(r.stdout) == ["vmvx"]
    assert "warning" not in r.stderr


def test_a_module_takes_kilns_targets_with_requested_targets(module: Path, kiln) -> None:
    default = kiln("explain", "build.py", "taking")
    given = kiln("explain", "build.py", "taking", "--target", "cpu", "--target", "cuda:sm_89")
    devices = kiln("explain", "build.py", "taking", "--iree-hal-target-device", "llvm-cpu", "vmvx")

    assert default.returncode == 0 and would_compile(default.stdout) == ["vmvx"], default.stderr
    assert given.returncode == 0, given.stderr
    assert would_compile(given.stdout) == ["cpu-host", "cuda-sm_89"]
    assert devices.returncode == 0, devices.stderr
    assert would_compile(devices.stdout) == ["cpu-generic", "vmvx"]


def test_compiles_that_ignore_a_used_target_are_named_in_a_warning(module: Path, kiln) -> None:
    r = kiln("explain", "build.py", "fixed", "taking", "--target", "cpu")
    assert r.returncode == 0, r.stderr
    assert would_compile(r.stdout) == ["cpu-host", "vmvx"]
    assert "warning: --target cpu: these compiles fix their own targets" in r.stderr
    assert f"{module}:{line_of(module, '# FIXED')}: vmvx" in r.stderr


def test_a_target_before_any_compile_is_no_error(module: Path, kiln) -> None:
    # Building a file that no compile produces: the target reaches no compile, and no
    # compile ignores it.
    r = kiln("explain", "build.py", "fixed/add.mlir", "--target", "cuda:sm_89")
    assert r.returncode == 0, r.stderr


def test_a_module_with_its_own_target_option_checks_kilns_spelling(write_module, kiln, tmp_path):
    (tmp_path / "add.mlir").write_text(ADD)
    write_module(
        """
@entrypoint
def chip(target=cl_arg("target", default="gfx942", help="the module's own target")):
    return compile(name="add", source=source_file("add.mlir"), targets=["vmvx"])
"""
    )
    own = kiln("explain", "build.py", "--target=gfx1100")
    kilns = kiln("explain", "build.py", "--kiln-target", "cpu")

    assert own.returncode == 0, own.stderr  # the module's option: nothing of kiln's
    assert kilns.returncode == 2
    assert "--kiln-target cpu: no compile of the requested entrypoints" in kilns.stderr


def test_requested_targets_default_is_checked(write_module, kiln, tmp_path: Path) -> None:
    (tmp_path / "add.mlir").write_text(ADD)
    write_module(
        """
@entrypoint
def bad():
    return compile(name="add", source=source_file("add.mlir"),
                   targets=requested_targets(default=["tpu"]))
"""
    )
    r = kiln("explain", "build.py")
    assert r.returncode == 2
    assert "requested_targets(default=...) at" in r.stderr and "unknown --target 'tpu'" in r.stderr
