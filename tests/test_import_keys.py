"""An ONNX import is keyed by the versions of what writes its program: the
importer (iree-base-compiler's) and onnx (its opset converter)."""

from __future__ import annotations

import os
from pathlib import Path

import needs
import pytest

MODULE = """
@entrypoint
def model():
    return onnx_import(name="add.mlir", source=source_file("add.onnx"))
"""


@pytest.fixture
def project(tmp_path: Path, write_module) -> Path:
    onnx = needs.module("onnx")
    helper, proto = onnx.helper, onnx.TensorProto
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["c"])],
        "add",
        [helper.make_tensor_value_info(n, proto.FLOAT, [2]) for n in ("a", "b")],
        [helper.make_tensor_value_info("c", proto.FLOAT, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "add.onnx")
    write_module(MODULE)
    return tmp_path


def _saying(root: Path, dist: str, version: str) -> str:
    """A PYTHONPATH on which installed ``dist`` says it is ``version``."""
    info = root / "meta" / dist / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    return os.pathsep.join(filter(None, [str(info.parent), os.environ.get("PYTHONPATH")]))


@pytest.mark.parametrize(
    ("dist", "param"), [("onnx", "onnx_version"), ("iree-base-compiler", "importer_version")]
)
def test_another_importer_or_converter_imports_again(
    project: Path, kiln_subprocess, dist: str, param: str
) -> None:
    assert kiln_subprocess("build", "build.py", "--no-cache").returncode == 0
    same = kiln_subprocess("explain", "build.py")
    assert same.returncode == 0 and "everything is up to date" in same.stdout, same.stdout
    env = {"PYTHONPATH": _saying(project, dist, "0.0.1")}
    other = kiln_subprocess("explain", "build.py", env=env)
    assert other.returncode == 0, other.stderr
    assert "Importing" in other.stdout or "add.mlir" in other.stdout, other.stdout
    assert param in other.stdout, other.stdout
