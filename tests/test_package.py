"""kiln as a package: the wheel a user installs, its name, version, license and types."""

from __future__ import annotations

import email.parser
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import kiln._version

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    out = tmp_path_factory.mktemp("wheel")
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
        + ["-w", str(out), str(ROOT)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (path,) = out.glob("*.whl")
    return zipfile.ZipFile(path)


def _metadata(wheel: zipfile.ZipFile) -> email.message.Message:
    (name,) = [n for n in wheel.namelist() if n.endswith(".dist-info/METADATA")]
    return email.parser.Parser().parsestr(wheel.read(name).decode())


def test_the_distribution_name_is_not_the_index_s_unrelated_kiln(wheel: zipfile.ZipFile) -> None:
    meta = _metadata(wheel)
    assert meta["Name"] == "kiln-build"
    # The import name stays kiln.
    assert "kiln/__init__.py" in wheel.namelist()


def test_the_version_is_written_once(wheel: zipfile.ZipFile) -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project and "version" in project["dynamic"]
    assert _metadata(wheel)["Version"] == kiln._version.__version__


def test_the_wheel_carries_the_license_and_the_typed_marker(wheel: zipfile.ZipFile) -> None:
    names = wheel.namelist()
    assert "kiln/py.typed" in names
    licenses = [n for n in names if n.endswith("LICENSE")]
    assert licenses, names
    assert b"Apache License" in wheel.read(licenses[0])
    meta = _metadata(wheel)
    assert "Typing :: Typed" in meta.get_all("Classifier", [])
    assert meta["License-Expression"] == "Apache-2.0"


def test_the_torch_extra_accepts_a_range_of_releases(wheel: zipfile.ZipFile) -> None:
    requires = _metadata(wheel).get_all("Requires-Dist", [])
    (torch,) = [r for r in requires if r.startswith("torch") and 'extra == "torch"' in r]
    assert "==" not in torch.split(";")[0], torch
    assert ">=" in torch and "<" in torch, torch


def test_kiln_version_prints_the_version() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "kiln", "--version"], capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == f"kiln {kiln._version.__version__}\n"
