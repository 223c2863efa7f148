"""Tests of the IREE and ONNX helpers (``kiln.base.compile_targets``, ``kiln.actions._compiler``,
``_onnx_import``, ``_runtime``) and of the examples' model zoo list, with the real
IREE compiler, runtime and onnx."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path
from typing import Any

import needs
import pytest

np = needs.module("numpy")
onnx = needs.module("onnx")
needs.module("iree.compiler")
needs.module("iree.runtime")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from kiln.actions._compiler import compile_module, compiler_version  # noqa: E402
from kiln.actions._onnx_import import import_onnx  # noqa: E402
from kiln.actions._runtime import verify_module  # noqa: E402
from kiln.actions._tensors import load_tensor  # noqa: E402
from kiln.base.compile_targets import target_driver, target_flags, target_name  # noqa: E402
from kiln.base.errors import ToolError, UsageError  # noqa: E402

PLAIN_MLIR = """
func.func @add(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
  %0 = arith.addf %a, %b : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.fixture
def zoo(monkeypatch: pytest.MonkeyPatch) -> Any:
    """examples/zoo_models.py, the model zoo list the example and the benchmarks build."""
    monkeypatch.syspath_prepend(str(EXAMPLES))
    import zoo_models

    return zoo_models


RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3)).astype(np.float32)
W = RNG.standard_normal((3, 4)).astype(np.float32)


def save_model(
    path: Path, nodes: list[Any], inputs: list[Any], outputs: list[Any], opset: int
) -> str:
    """Write a single-graph ONNX model named "main_graph" and return its path."""
    graph = helper.make_graph(nodes, "main_graph", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    onnx.save(model, path)
    return str(path)


def matmul_relu_model(path: Path) -> str:
    """Two outputs: y = x @ w and z = relu(y)."""
    return save_model(
        path,
        [helper.make_node("MatMul", ["x", "w"], ["y"]), helper.make_node("Relu", ["y"], ["z"])],
        [
            helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
            helper.make_tensor_value_info("w", TensorProto.FLOAT, [3, 4]),
        ],
        [
            helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4]),
            helper.make_tensor_value_info("z", TensorProto.FLOAT, [2, 4]),
        ],
        opset=17,
    )


def save_pb(path: Path, array: Any) -> str:
    path.write_bytes(numpy_helper.from_array(array).SerializeToString())
    return str(path)


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The MatMul+Relu model imported once and compiled for cpu and vmvx, with data."""
    d = tmp_path_factory.mktemp("built")
    model = matmul_relu_model(d / "mm.onnx")
    import_onnx(model, str(d / "mm.mlir"), None)
    modules = {}
    for target in ("cpu", "vmvx"):
        name = target_name(target)
        vmfb, log = d / f"mm.{name}.vmfb", d / f"mm.{name}.log"
        compile_module(str(d / "mm.mlir"), str(vmfb), "onnx", target_flags(target), str(log))
        modules[target] = str(vmfb)
    y = X @ W
    return {
        "dir": d,
        "mlir": d / "mm.mlir",
        "modules": modules,
        "inputs": [save_pb(d / "input_0.pb", X), save_pb(d / "input_1.pb", W)],
        "outputs": [save_pb(d / "output_0.pb", y), save_pb(d / "output_1.pb", np.maximum(y, 0))],
    }


def test_compiler_version_is_the_installed_distribution() -> None:
    assert compiler_version() == importlib.metadata.version("iree-base-compiler")


@pytest.mark.parametrize(
    ("spec", "flags", "name"),
    [
        ("cpu", ["--iree-llvmcpu-target-cpu=host"], "cpu-host"),
        ("cpu:host", ["--iree-llvmcpu-target-cpu=host"], "cpu-host"),
        ("cpu:znver4", ["--iree-llvmcpu-target-cpu=znver4"], "cpu-znver4"),
        ("vmvx", ["--iree-hal-local-target-device-backends=vmvx"], "vmvx"),
        ("hip:gfx942", ["--iree-hal-target-device=hip", "--iree-rocm-target=gfx942"], "hip-gfx942"),
        ("vulkan:rdna3", ["--iree-vulkan-target=rdna3"], "vulkan-rdna3"),
        ("cuda:sm_80", ["--iree-hal-target-device=cuda", "--iree-cuda-target=sm_80"], "cuda-sm_80"),
        ("CPU:x86-64-v3", ["--iree-llvmcpu-target-cpu=x86-64-v3"], "cpu-x86-64-v3"),
    ],
)
def test_target_flags_and_names(spec: str, flags: list[str], name: str) -> None:
    assert set(flags) <= set(target_flags(spec))
    assert target_name(spec) == name


@pytest.mark.parametrize(
    "spec", ["", "tpu", "cpu:", "hip", "hip:", "vmvx:x", "cuda:sm 80", "cpu:a:b", "vulkan:-x"]
)
def test_unknown_target_is_a_usage_error_listing_valid_forms(spec: str) -> None:
    with pytest.raises(UsageError, match=r"cpu:<cpu name>.*hip:<chip>"):
        target_flags(spec)
    with pytest.raises(UsageError):
        target_name(spec)


def test_every_target_form_is_accepted_by_iree_compile(tmp_path: Path) -> None:
    """Compile-only: the flags must exist in the installed compiler, no GPU needed."""
    source = tmp_path / "add.mlir"
    source.write_text(PLAIN_MLIR)
    for spec in ("cpu", "cpu:znver4", "vmvx", "hip:gfx942", "vulkan:rdna3", "cuda:sm_80"):
        out = tmp_path / f"add.{target_name(spec)}.vmfb"
        compile_module(str(source), str(out), "auto", target_flags(spec), str(out) + ".log")
        assert out.stat().st_size > 0
    assert target_driver("vmvx") == "local-task" and target_driver("hip:gfx942") == "hip"


def test_import_onnx_writes_torch_onnx_mlir(built: dict[str, Any]) -> None:
    text = built["mlir"].read_text()
    assert "func.func @main_graph" in text
    assert 'torch.operator "onnx.MatMul"' in text and "!torch.vtensor<[2,4],f32>" in text
    assert not [p for p in built["dir"].iterdir() if p.name.endswith(".tmp")]


def test_import_onnx_upgrades_opset_and_names_unnamed_graphs(tmp_path: Path) -> None:
    source = save_model(
        tmp_path / "add.onnx",
        [helper.make_node("Add", ["a", "b"], ["c"])],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in "ab"],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [4])],
        opset=13,
    )
    model = onnx.load(source)
    model.graph.name = ""
    onnx.save(model, source)
    import_onnx(source, str(tmp_path / "add.mlir"), 18)
    text = (tmp_path / "add.mlir").read_text()
    assert "torch.onnx_meta.opset_version = 18" in text and "@main_graph" in text


@pytest.mark.parametrize("content", [b"", b"not a model at all", bytes(range(256)) * 4])
def test_corrupt_onnx_is_a_tool_error_naming_the_file(tmp_path: Path, content: bytes) -> None:
    source = tmp_path / "broken.onnx"
    source.write_bytes(content)
    with pytest.raises(ToolError, match="broken.onnx") as info:
        import_onnx(str(source), str(tmp_path / "out.mlir"), None)
    assert len(str(info.value)) < 700
    assert not (tmp_path / "out.mlir").exists()


def test_missing_onnx_is_a_tool_error(tmp_path: Path) -> None:
    with pytest.raises(ToolError, match="nothere.onnx.*No such file"):
        import_onnx(str(tmp_path / "nothere.onnx"), str(tmp_path / "out.mlir"), None)


@pytest.mark.parametrize("target", ["cpu", "vmvx"])
def test_verify_passes_on_correct_outputs(built: dict[str, Any], target: str) -> None:
    result = verify_module(built["modules"][target], built["inputs"], built["outputs"], 1e-5, 1e-5)
    assert result["passed"], result["summary"]
    assert result["function"] == "main_graph"
    assert [o["shape"] for o in result["outputs"]] == [[2, 4], [2, 4]]
    assert all(o["passed"] and o["max_abs_err"] < 1e-5 for o in result["outputs"])
    assert result["summary"].startswith("all 2 output(s) match")


def test_verify_reports_wrong_values_readably(built: dict[str, Any], tmp_path: Path) -> None:
    wrong = np.maximum(X @ W, 0)
    wrong[1, 2] += 0.5
    expected = [built["outputs"][0], save_pb(tmp_path / "output_1.pb", wrong)]
    result = verify_module(built["modules"]["cpu"], built["inputs"], expected, 1e-5, 1e-5)
    assert not result["passed"]
    first, second = result["outputs"]
    assert first["passed"] and not second["passed"]
    assert second["mismatches"] == 1 and abs(second["max_abs_err"] - 0.5) < 1e-4
    assert second["worst"][0]["index"] == [1, 2]
    assert result["summary"].startswith("output 1 (shape [2, 4], float32): 1 elements differ")
    assert "max abs err 0.5" in result["summary"] and "[1, 2] got" in result["summary"]


def test_verify_reports_shape_and_count_mismatches(built: dict[str, Any], tmp_path: Path) -> None:
    short = [save_pb(tmp_path / "o.pb", (X @ W)[:, :3])]
    result = verify_module(built["modules"]["vmvx"], built["inputs"], short, 1e-5, 1e-5)
    assert not result["passed"]
    assert "module returned 2 outputs, expected 1" in result["summary"]
    assert "output 0: shape [2, 4] != expected [2, 3]" in result["summary"]


def test_verify_compares_across_dtypes(built: dict[str, Any], tmp_path: Path) -> None:
    y = X @ W
    as_f64 = [save_pb(tmp_path / "y.pb", y.astype(np.float64)), str(tmp_path / "z.npy")]
    np.save(as_f64[1], np.maximum(y, 0).astype(np.float64))
    result = verify_module(built["modules"]["cpu"], built["inputs"], as_f64, 1e-5, 1e-5)
    assert result["passed"], result["summary"]
    assert result["outputs"][1]["expected_dtype"] == "float64"


def test_verify_runtime_failures_are_tool_errors(built: dict[str, Any], tmp_path: Path) -> None:
    module, inputs, outputs = built["modules"]["cpu"], built["inputs"], built["outputs"]
    with pytest.raises(ToolError, match="expected 2 arguments but passed 1"):
        verify_module(module, inputs[:1], outputs, 1e-5, 1e-5)
    with pytest.raises(ToolError, match="no 'nope'.*main_graph"):
        verify_module(module, inputs, outputs, 1e-5, 1e-5, function="nope")
    not_a_module = tmp_path / "junk.vmfb"
    not_a_module.write_bytes(b"junk" * 10)
    with pytest.raises(ToolError, match="cannot load module .*junk.vmfb"):
        verify_module(str(not_a_module), inputs, outputs, 1e-5, 1e-5)


def test_compile_syntax_error_is_a_tool_error_with_diagnostic(tmp_path: Path) -> None:
    source, out, log = tmp_path / "bad.mlir", tmp_path / "bad.vmfb", tmp_path / "bad.log"
    source.write_text("func.func @f( {\n")
    with pytest.raises(ToolError) as info:
        compile_module(str(source), str(out), "auto", target_flags("vmvx"), str(log))
    message = str(info.value)
    assert "iree-compile failed on" in message and "exit code 1" in message
    assert "bad.mlir:1:14: error: expected non-function type" in message
    assert "expected non-function type" in log.read_text()
    assert not out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bad.log", "bad.mlir"]


def test_compiler_abort_is_a_tool_error_not_a_crash(tmp_path: Path) -> None:
    """LLVM aborts the compiler process on a bad CPU name; kiln must survive that."""
    source = tmp_path / "add.mlir"
    source.write_text(PLAIN_MLIR)
    with pytest.raises(ToolError, match="LLVM ERROR"):
        compile_module(
            str(source),
            str(tmp_path / "o.vmfb"),
            "auto",
            target_flags("cpu:bogus"),
            str(tmp_path / "o.log"),
        )
    assert not (tmp_path / "o.vmfb").exists()


def test_compile_log_records_command_on_success(built: dict[str, Any]) -> None:
    log = (built["dir"] / "mm.vmvx.log").read_text()
    assert log.startswith("$ ") and "--iree-hal-local-target-device-backends=vmvx" in log


def test_load_tensor_pb_and_npy(tmp_path: Path) -> None:
    ints = np.arange(6, dtype=np.int64).reshape(2, 3)
    loaded = load_tensor(save_pb(tmp_path / "t.pb", ints))
    assert loaded.dtype == np.int64 and np.array_equal(loaded, ints)
    np.save(tmp_path / "t.npy", X)
    assert np.array_equal(load_tensor(str(tmp_path / "t.npy")), X)


@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("t.txt", b"1 2 3", "unknown extension"),
        ("t.pb", b"\xff\xff\xff garbage", "Error parsing"),
        ("t.pb", b"", "not a TensorProto"),
        ("t.npy", b"not numpy", "t.npy"),
    ],
)
def test_load_tensor_rejects_bad_files(
    tmp_path: Path, name: str, content: bytes, reason: str
) -> None:
    (tmp_path / name).write_bytes(content)
    with pytest.raises(ToolError, match=f"cannot load tensor .*{name}.*") as info:
        load_tensor(str(tmp_path / name))
    assert reason in str(info.value)


def test_model_zoo_lists_models_with_existing_files(zoo: Any) -> None:
    models = zoo.model_zoo()
    assert len(models) > 100
    assert {m.category for m in models} == set(zoo.ZOO_CATEGORIES)
    assert len({m.name for m in models}) == len(models)
    for m in models:
        assert Path(m.model).is_file() and m.inputs and m.outputs
        assert all(Path(p).is_file() for p in m.inputs + m.outputs)
        assert "/" not in m.name and " " not in m.name
    by_name = {m.name: m for m in models}
    relu = by_name["pytorch-converted__test_ReLU"]
    assert Path(relu.inputs[0]).name == "input_0.pb"


def test_model_zoo_sorts_numerically_and_rejects_unknown_categories(
    zoo: Any, tmp_path: Path
) -> None:
    for n in (10, 2, 1):
        (tmp_path / f"input_{n}.pb").touch()
    assert [Path(p).name for p in zoo._numbered(tmp_path, "input")] == [
        "input_1.pb",
        "input_2.pb",
        "input_10.pb",
    ]
    with pytest.raises(UsageError, match="unknown model zoo category"):
        zoo.model_zoo(["nope"])
    with pytest.raises(UsageError):
        zoo.model_zoo(["../data"])


def test_zoo_model_end_to_end(zoo: Any, tmp_path: Path) -> None:
    zoo = {m.name: m for m in zoo.model_zoo(["pytorch-converted"])}
    m = zoo["pytorch-converted__test_ReLU"]
    import_onnx(m.model, str(tmp_path / "m.mlir"), None)
    out = tmp_path / "m.vmfb"
    compile_module(
        str(tmp_path / "m.mlir"), str(out), "onnx", target_flags("cpu"), str(tmp_path / "log")
    )
    result = verify_module(str(out), list(m.inputs), list(m.outputs), 1e-4, 1e-5)
    assert result["passed"], result["summary"]


def test_compiler_version_is_read_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    # A compile's params() asks for it on every key; the distribution's metadata is
    # read once.
    compiler_version.cache_clear()
    calls: list[str] = []
    real = importlib.metadata.version

    def counting(name: str) -> str:
        calls.append(name)
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", counting)
    assert compiler_version() == compiler_version() == real("iree-base-compiler")
    assert calls == ["iree-base-compiler"]


def test_runtime_and_onnxruntime_versions_and_the_cpu_are_read_once_per_process(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Every verify, reference and benchmark action's key asks for them: a no-op build
    # of the model zoo asked ~1,000 times, most of its time.
    import builtins

    from kiln.actions._devices import cpu_model, runtime_version
    from kiln.actions._reference import onnxruntime_version
    from kiln.devices.details import host_cpu

    for cached in (runtime_version, onnxruntime_version, cpu_model, host_cpu):
        cached.cache_clear()
    calls: list[str] = []
    real, real_open = importlib.metadata.version, builtins.open

    def counting(name: str) -> str:
        calls.append(name)
        return real(name)

    def opening(file: Any, *args: Any, **kwargs: Any) -> Any:
        if str(file) == "/proc/cpuinfo":  # metadata reads files too
            calls.append(str(file))
        return real_open(file, *args, **kwargs)

    monkeypatch.setattr(importlib.metadata, "version", counting)
    monkeypatch.setattr(builtins, "open", opening)
    for _ in range(3):
        runtime_version(), onnxruntime_version(), cpu_model()
    assert sorted(calls) == ["/proc/cpuinfo", "iree-base-runtime", "onnxruntime"]


@pytest.mark.parametrize("params", [False, True])
def test_external_data_that_is_a_fifo_fails_naming_it_instead_of_hanging(
    tmp_path: Path, params: bool
) -> None:
    import os

    from kiln.actions._onnx_params import import_onnx_params
    from kiln.base.errors import NotRegularFile

    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])],
        "main_graph",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
        initializer=[numpy_helper.from_array(W, "w")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    source, data = tmp_path / "mm.onnx", tmp_path / "mm.onnx.data"
    onnx.save(model, source, save_as_external_data=True, location=data.name, size_threshold=0)
    data.unlink()
    os.mkfifo(data)  # nothing ever writes to it: opening it to read would block
    out = str(tmp_path / "mm.mlir")
    with pytest.raises(NotRegularFile, match="mm.onnx.data is a FIFO"):
        if params:
            import_onnx_params(
                str(source), out, str(tmp_path / "mm.irpa"), None, "model", 0, [str(data)]
            )
        else:
            import_onnx(str(source), out, None, [str(data)])
