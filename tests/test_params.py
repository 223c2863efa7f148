"""Parameter archives through the CLI, on a real model of the onnx package's light set
with real (seeded random) weights (a one-MatMul model where any weight will do):
``onnx_import(params=...)`` writes the archive, ``compile`` lists it in the manifest,
``verify`` and ``benchmark`` load it, and a weights-only change reruns the import and
the checks but not the compile."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from light_models import materialize, write_light

pytestmark = [pytest.mark.slow, pytest.mark.in_process]

BUILD = """
@entrypoint
def sq():
    mlir = onnx_import(name="sq.mlir", source=source_file("model.onnx"), params=PARAMS)
    outs = []
    for vmfb in compile(name="sq", source=mlir):
        outs += [
            vmfb,
            verify(name="sq.verify.json", module=vmfb, reference="onnxruntime"),
            benchmark(name="sq.bench.json", module=vmfb, repetitions=1, min_time_s=0.001),
        ]
    return outs
"""


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _events(path: Path) -> dict[str, str]:
    """Each action's description -> what happened to it in the build."""
    out = {}
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if event["event"] in ("up_to_date", "cached", "finished", "failed", "not_run"):
            out[event["desc"]] = event["event"]
    return out


def _build(kiln, tmp_path: Path, *extra: str):  # type: ignore[no-untyped-def]
    events = tmp_path / "events.jsonl"
    result = kiln(
        "build", "build.py", "--target", "cpu", "--no-cache", "--events", str(events), *extra
    )
    return result, _events(events) if events.exists() else {}


def _write_matmul(path: Path) -> None:
    """A one-MatMul ONNX model whose one weight (16x8, seeded) goes to the archive."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(1).normal(0.0, 0.25, (16, 8)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "mm",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 8])],
        initializer=[numpy_helper.from_array(weight, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.save(model, str(path))


def _kind(events: dict[str, str], prefix: str) -> list[str]:
    return [what for desc, what in events.items() if desc.startswith(prefix)]


def test_weights_only_change_reruns_import_and_checks_not_compile(
    kiln, write_module, tmp_path: Path
) -> None:
    write_module(BUILD.replace("PARAMS", "True"))
    write_light("squeezenet", 1, tmp_path / "model.onnx")
    result, events = _build(kiln, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = tmp_path / "kiln-out"
    mlir, archive = out / "genfiles/sq/sq.mlir", out / "params/sq/sq.irpa"
    first_mlir, first_archive = _sha(mlir), _sha(archive)
    assert '#stream.parameter.named<"model"::' in mlir.read_text()
    assert "dense_resource" not in mlir.read_text()  # no weight left in the program

    manifest = json.loads((out / "manifest.json").read_text())
    module = next(o for o in manifest["entrypoints"]["sq"]["outputs"] if o["namespace"] == "bin")
    assert module["parameters"] == [
        {
            "scope": "model",
            "path": "params/sq/sq.irpa",
            "status": "built",
            "sha256": first_archive,
            "size": archive.stat().st_size,
        }
    ]
    assert module["verification"][0]["passed"] is True
    assert module["benchmark"][0]["status"] == "measured"

    write_light("squeezenet", 2, tmp_path / "model.onnx")  # same architecture, new weights
    result, events = _build(kiln, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _sha(mlir) == first_mlir
    assert _sha(archive) != first_archive
    assert _kind(events, "Importing ONNX") == ["finished"]
    assert _kind(events, "Compiling") == ["up_to_date"]
    assert _kind(events, "Verifying") == ["finished"]
    assert _kind(events, "Benchmarking") == ["finished"]
    assert _kind(events, "Running") == ["finished"]  # onnxruntime, on the new model

    result, events = _build(kiln, tmp_path)  # no-op
    assert result.returncode == 0
    assert set(events.values()) == {"up_to_date"}


def test_a_module_without_its_archive_fails_to_run(kiln, write_module, tmp_path: Path) -> None:
    write_module(
        """
        @entrypoint
        def sq():
            mlir = onnx_import(name="sq.mlir", source=source_file("model.onnx"), params=True)
            (vmfb,) = compile(name="sq", source=mlir)
            return verify(name="v.json", module=vmfb, reference="onnxruntime", parameters=[])
        """
    )
    _write_matmul(tmp_path / "model.onnx")  # any weight will do: a small model compiles fast
    result, events = _build(kiln, tmp_path)
    assert result.returncode == 1
    assert _kind(events, "Compiling") == ["finished"]
    assert _kind(events, "Verifying") == ["failed"]
    # The runtime's words: the module cannot load without a parameter provider.
    assert "required module 'io_parameters' not registered" in result.stdout + result.stderr


def test_threshold_and_scope_and_the_same_bytes_elsewhere(
    kiln, write_module, tmp_path: Path
) -> None:
    write_module(BUILD.replace("PARAMS", 'Params(scope="weights", threshold=1001)'))
    write_light("squeezenet", 1, tmp_path / "model.onnx")
    result, _ = _build(kiln, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    text = (tmp_path / "kiln-out/genfiles/sq/sq.mlir").read_text()
    assert '#stream.parameter.named<"weights"::"conv10_w_0">' in text
    # Same key, same bytes: another output directory gives the same program and archive
    # (the import alone: the compile and the checks have nothing to say about them).
    result, events = _build(kiln, tmp_path, "--output-dir", "other", "sq/sq.mlir")
    assert list(events.values()) == ["finished"], events
    assert result.returncode == 0, result.stdout + result.stderr
    for path in ("genfiles/sq/sq.mlir", "params/sq/sq.irpa"):
        assert _sha(tmp_path / "kiln-out" / path) == _sha(tmp_path / "other" / path)
    assert '"weights"::"conv10_b_0"' not in text  # 1000 elements, below 1001: kept
    assert "conv1_b_0" in text and '"weights"::"conv1_b_0"' not in text  # 64 elements


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ('{"scope": "a=b"}', "parameter scope 'a=b'"),
        ('{"threshold": -1}', "threshold must be None or a number"),
        ('{"size": 3}', "unknown key(s) ['size']"),
        ('"yes"', "params must be True"),
    ],
)
def test_bad_params_are_definition_errors(
    kiln, write_module, tmp_path: Path, params: str, message: str
) -> None:
    write_module(BUILD.replace("PARAMS", params))
    write_light("squeezenet", 1, tmp_path / "model.onnx")
    result, _ = _build(kiln, tmp_path)
    assert result.returncode == 2
    assert message in result.stderr


def test_external_data_must_be_declared_and_is_keyed(kiln, write_module, tmp_path: Path) -> None:
    import onnx

    from_light = write_light("squeezenet", 1, tmp_path / "light.onnx")
    model = onnx.load(str(from_light))
    onnx.save(
        model,
        str(tmp_path / "model.onnx"),
        save_as_external_data=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    write_module(
        """
        @entrypoint
        def sq():
            return onnx_import(name="sq.mlir", source=source_file("model.onnx"), params=True)
        """
    )
    result, _ = _build(kiln, tmp_path)
    assert result.returncode == 1
    assert "'model.onnx.data', which the build does not declare" in result.stdout + result.stderr

    write_module(
        """
        @entrypoint
        def sq():
            return onnx_import(name="sq.mlir", source=source_file("model.onnx"), params=True,
                               external_data=[source_file("model.onnx.data")])
        """
    )
    result, events = _build(kiln, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    archive = tmp_path / "kiln-out/params/sq/sq.irpa"
    first = _sha(archive)

    onnx.save(
        materialize("squeezenet", 2),
        str(tmp_path / "model.onnx"),
        save_as_external_data=True,
        location="model.onnx.data",
        size_threshold=0,
    )
    result, events = _build(kiln, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _kind(events, "Importing ONNX") == ["finished"]
    assert _sha(archive) != first
