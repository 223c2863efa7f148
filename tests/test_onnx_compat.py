"""``onnx_import`` as upstream imports, and its sources as the build names them.

- An upgraded model's program is what ``iree-import-onnx --opset-version 17`` writes,
  byte for byte (its ``torch.onnx_meta.ir_version`` included); kiln departs only
  where upstream fails (an upgrade that adds an initializer IR 3 forbids).
- A declared external-data file that is a symbolic link is read through it, keyed
  by what it leads to, and found beside the model where the model names it, even
  when the link leads out of the project; kiln never writes through it.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import needs
import pytest

np = needs.module("numpy")
onnx = needs.module("onnx")
needs.module("iree.compiler")

pytestmark = pytest.mark.in_process

Kiln = Callable[..., Any]


def _onnx_test_model(name: str) -> Path:
    """A model of the onnx package's test data (IR version 3, opset 6)."""
    folder = Path(os.path.dirname(onnx.__file__)) / "backend/test/data/pytorch-converted"
    return folder / name / "model.onnx"


def _upstream_import(model: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """IREE's own importer, as iree.build's ``onnx_import`` runs it (upgrade=True)."""
    tool = [sys.executable, "-m", "iree.compiler.tools.import_onnx"]  # iree-import-onnx
    argv = [*tool, str(model), "-o", str(out), "--opset-version", "17"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120)


def _ir_version(program: str) -> int:
    return int(program.split("torch.onnx_meta.ir_version = ", 1)[1].split(" ", 1)[0])


IMPORT = """
@entrypoint
def imp():
    return [onnx_import(name=f"{m}.mlir", source=source_file(f"{m}.onnx"), params=PARAMS)
            for m in ("pool", "pad")]
"""


@pytest.mark.parametrize("params", ["None", "True"])
def test_an_upgraded_program_is_upstreams_and_departs_only_where_upstream_fails(
    kiln: Kiln, write_module: Callable[..., Path], tmp_path: Path, params: str
) -> None:
    pool, pad = _onnx_test_model("test_AvgPool2d"), _onnx_test_model("test_ConstantPad2d")
    assert onnx.load(str(pool)).ir_version == 3
    shutil.copy(pool, tmp_path / "pool.onnx")
    shutil.copy(pad, tmp_path / "pad.onnx")
    write_module(IMPORT.replace("PARAMS", params))
    r = kiln("build", "build.py")
    assert r.returncode == 0, r.stderr
    ours = (tmp_path / "kiln-out/genfiles/imp/pool.mlir").read_text()
    upstream = _upstream_import(pool, tmp_path / "upstream.mlir")
    assert upstream.returncode == 0, upstream.stderr
    assert _ir_version(ours) == 3
    assert ours == (tmp_path / "upstream.mlir").read_text()  # byte for byte
    # Opset 6's Pad keeps its pads in an attribute; opset 11's takes them as an input,
    # which the converter adds as an initializer that IR 3 wants as a graph input:
    # upstream fails, and kiln raises the IR version to 4 there alone.
    upstream = _upstream_import(pad, tmp_path / "upstream.mlir")
    assert upstream.returncode != 0 and "in initializer but not in graph input" in upstream.stderr
    assert _ir_version((tmp_path / "kiln-out/genfiles/imp/pad.mlir").read_text()) == 4


def test_the_opset_measured_is_the_first_listed_as_upstream_measures_it(
    kiln: Kiln, write_module: Callable[..., Path], tmp_path: Path
) -> None:
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])],
    )
    opsets = [helper.make_opsetid("com.microsoft", 1), helper.make_opsetid("", 18)]
    model = helper.make_model(graph, opset_imports=opsets)
    onnx.save(model, str(tmp_path / "model.onnx"))
    write_module(
        """
        @entrypoint
        def imp():
            return onnx_import(name="m.mlir", source=source_file("model.onnx"))
        """
    )
    r = kiln("build", "build.py")
    assert r.returncode == 0, r.stderr
    upstream = _upstream_import(tmp_path / "model.onnx", tmp_path / "upstream.mlir")
    assert upstream.returncode == 0, upstream.stderr
    ours = (tmp_path / "kiln-out/genfiles/imp/m.mlir").read_text()
    assert "torch.onnx_meta.opset_version = 17 :" in ours
    assert ours == (tmp_path / "upstream.mlir").read_text()


# -- external data through a symbolic link ----------------------------------------

LINKED = """
@entrypoint
def sq(data=cl_arg("data", default="model.onnx.data")):
    return onnx_import(name="m.mlir", source=source_file("model.onnx"), params=PARAMS,
                       external_data=[source_file(data)])
"""


def _matmul_with_external_data(folder: Path, seed: int = 1) -> bytes:
    """``folder/model.onnx``, one MatMul whose weight lives in
    ``folder/model.onnx.data``; returns the data file's bytes."""
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(seed).normal(0.0, 0.25, (16, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        initializer=[numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    folder.mkdir(parents=True, exist_ok=True)
    onnx.save(
        model,
        str(folder / "model.onnx"),
        save_as_external_data=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    return (folder / "model.onnx.data").read_bytes()


def _outputs(tmp_path: Path) -> dict[str, bytes]:
    out = tmp_path / "kiln-out"
    found = {"mlir": (out / "genfiles/sq/m.mlir").read_bytes()}
    archive = out / "params/sq/m.irpa"
    if archive.exists():
        found["irpa"] = archive.read_bytes()
    return found


def _build(kiln: Kiln, *args: str) -> Any:
    r = kiln("build", "build.py", *args)
    assert r.returncode == 0, r.stdout + r.stderr
    return r


@pytest.mark.parametrize("params", ["None", "True"])
@pytest.mark.parametrize("where", ["in the project", "outside the project"])
def test_a_declared_external_data_file_that_is_a_link_imports(
    kiln: Kiln, write_module: Callable[..., Path], tmp_path: Path, params: str, where: str
) -> None:
    write_module(LINKED.replace("PARAMS", params))
    data = _matmul_with_external_data(tmp_path)
    _build(kiln)
    plain = _outputs(tmp_path)
    store = tmp_path / "weights" if where == "in the project" else tmp_path.parent / "store"
    store.mkdir(exist_ok=True)
    target = store / f"blob-{tmp_path.name}"
    os.replace(tmp_path / "model.onnx.data", target)
    link = tmp_path / "model.onnx.data"
    link.symlink_to(os.path.relpath(target, tmp_path) if where == "in the project" else target)
    shutil.rmtree(tmp_path / "kiln-out")
    r = _build(kiln, "--no-cache")  # the same key as the file's: run it, not a cache hit
    assert "1 built" in r.stderr
    assert _outputs(tmp_path) == plain  # the same program and archive as from the file
    # Keyed by what it leads to: unchanged, nothing runs; changed, the import reruns.
    assert "0 built, 1 up to date" in _build(kiln).stderr
    changed = bytearray(data)
    changed[0] ^= 0xFF
    target.write_bytes(bytes(changed))
    assert "1 built" in _build(kiln).stderr
    assert params == "None" or _outputs(tmp_path)["irpa"] != plain["irpa"]
    # Read through, never written through: clean leaves the link and what it leads to.
    assert kiln("clean").returncode == 0
    assert link.is_symlink() and target.read_bytes() == bytes(changed)


def test_a_link_retargeted_reruns_the_import(
    kiln: Kiln, write_module: Callable[..., Path], tmp_path: Path
) -> None:
    write_module(LINKED.replace("PARAMS", "True"))
    _matmul_with_external_data(tmp_path)
    (tmp_path / "store").mkdir()
    os.replace(tmp_path / "model.onnx.data", tmp_path / "store/one.bin")
    _matmul_with_external_data(tmp_path / "other", seed=2)
    os.replace(tmp_path / "other/model.onnx.data", tmp_path / "store/two.bin")
    link = tmp_path / "model.onnx.data"
    link.symlink_to("store/one.bin")
    _build(kiln)
    first = _outputs(tmp_path)["irpa"]
    link.unlink()
    link.symlink_to("store/two.bin")
    assert "1 built" in _build(kiln).stderr
    assert _outputs(tmp_path)["irpa"] != first


def test_a_linked_model_finds_its_data_beside_the_link(
    kiln: Kiln, write_module: Callable[..., Path], tmp_path: Path
) -> None:
    # Both files linked to blobs of a content-addressed store elsewhere, as the
    # Hugging Face cache lays out a snapshot: the data lies beside the model's link,
    # under the name the model gives it, and nowhere beside the model's blob.
    store = tmp_path.parent / f"cache-{tmp_path.name}"
    _matmul_with_external_data(store)
    for name in ("model.onnx", "model.onnx.data"):
        blob = store / hashlib.sha256((store / name).read_bytes()).hexdigest()
        os.replace(store / name, blob)
        (tmp_path / name).symlink_to(blob)
    write_module(LINKED.replace("PARAMS", "True"))
    _build(kiln)
    assert (tmp_path / "kiln-out/params/sq/m.irpa").stat().st_size > 16 * 8 * 4


def test_two_checkouts_linking_to_two_stores_share_the_cache(
    kiln: Kiln, write_module: Callable[..., Path], tmp_path: Path
) -> None:
    # The key names the link as the build names it, not where it leads: the same
    # bytes elsewhere are the same import.
    write_module(LINKED.replace("PARAMS", "True"))
    _matmul_with_external_data(tmp_path)
    data = tmp_path / "model.onnx.data"
    stores = [tmp_path.parent / f"{tmp_path.name}-store{i}" for i in (1, 2)]
    for store in stores:
        store.mkdir()
        shutil.copy(data, store / "blob")
    data.unlink()
    data.symlink_to(stores[0] / "blob")
    _build(kiln)
    first = hashlib.sha256(_outputs(tmp_path)["irpa"]).hexdigest()
    data.unlink()
    data.symlink_to(stores[1] / "blob")
    r = _build(kiln, "--output-dir", "second")
    assert "1 cached" in r.stderr, r.stderr
    second = (tmp_path / "second/params/sq/m.irpa").read_bytes()
    assert hashlib.sha256(second).hexdigest() == first


def test_a_dangling_link_is_a_definition_error(
    kiln: Kiln, write_module: Callable[..., Path], tmp_path: Path
) -> None:
    write_module(LINKED.replace("PARAMS", "True"))
    _matmul_with_external_data(tmp_path)
    (tmp_path / "model.onnx.data").unlink()
    (tmp_path / "model.onnx.data").symlink_to(tmp_path / "gone.bin")
    r = kiln("build", "build.py")
    assert r.returncode == 2, r.stderr
    assert f"model.onnx.data is a link to {tmp_path / 'gone.bin'}, which does not exist" in r.stderr
