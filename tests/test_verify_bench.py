"""verify against onnxruntime and on generated inputs, per-dtype tolerances, benchmark,
device skips and GPU target checks, through real builds with the IREE tools."""

from __future__ import annotations

import json
import re
from pathlib import Path

import needs
import pytest

pytestmark = pytest.mark.in_process


onnx = needs.module("onnx")
np = needs.module("numpy")
needs.module("onnxruntime")
needs.module("iree.runtime")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402

from kiln.actions import _tensors  # noqa: E402


def _pb(path: Path, array: np.ndarray) -> None:
    path.write_bytes(numpy_helper.from_array(array).SerializeToString())


def _write_models(folder: Path) -> None:
    """add.onnx: y = x + c (x dynamic in its first dim, "N"), with a correct and a
    wrong reference output; two.onnx: a float and an int64 output."""
    const = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "c")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["y"])],
        "add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 3])],
        initializer=[const],
    )
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "add.onnx"
    )
    x = np.ones((2, 3), dtype=np.float32)
    _pb(folder / "x.pb", x)
    _pb(folder / "y.pb", x + np.arange(6, dtype=np.float32).reshape(2, 3))
    wrong = x + np.arange(6, dtype=np.float32).reshape(2, 3)
    wrong[1, 2] += 1.0
    _pb(folder / "wrong.pb", wrong)
    graph = helper.make_graph(
        [helper.make_node("Relu", ["a"], ["r"]), helper.make_node("Shape", ["a"], ["s"])],
        "two",
        [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["B", 4])],
        [
            helper.make_tensor_value_info("r", TensorProto.FLOAT, ["B", 4]),
            helper.make_tensor_value_info("s", TensorProto.INT64, [2]),
        ],
    )
    onnx.save(
        helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), folder / "two.onnx"
    )


BUILD = """
@entrypoint
def add(expected=cl_arg("expected", default="y.pb")):
    mlir = onnx_import(name="add.mlir", source=source_file("add.onnx"))
    modules = compile(name="add", source=mlir)
    out = []
    for m in modules:
        t = m.path.rsplit("_", 1)[-1].split(".")[0]
        out.append(verify(name=f"both_{t}.json", module=m, inputs=[source_file("x.pb")],
                          expected=[source_file(expected, name="expected.pb")],
                          reference="onnxruntime"))
        out.append(benchmark(name=f"bench_{t}.json", module=m, repetitions=2,
                             min_time_s=0.01, shapes={"N": 2}))
    return [*modules, *out]

@entrypoint
def two():
    mlir = onnx_import(name="two.mlir", source=source_file("two.onnx"))
    modules = compile(name="two", source=mlir)
    return [*modules, *(verify(name=f"gen_{i}.json", module=m, reference="onnxruntime",
                               shapes={"B": 3}) for i, m in enumerate(modules))]
"""


@pytest.fixture
def build(tmp_path: Path, write_module):  # type: ignore[no-untyped-def]
    _write_models(tmp_path)
    return write_module(BUILD)


def _manifest_module(out: Path, ep: str, target: str) -> dict:  # type: ignore[type-arg]
    manifest = json.loads((out / "manifest.json").read_text())
    return next(o for o in manifest["entrypoints"][ep]["outputs"] if o.get("target") == target)


def test_shipped_and_onnxruntime_references_and_a_benchmark(build, kiln, tmp_path: Path):
    r = kiln("build", str(build), "add", "--target", "cpu", "-j", "2")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "kiln-out"
    result = json.loads((out / "genfiles/add/both_cpu-host.json").read_text())
    assert result["passed"] is True and result["target"] == "cpu-host"
    assert set(result["references"]) == {"shipped", "onnxruntime"}
    record = result["references"]["onnxruntime"]["outputs"][0]
    assert record["name"] == "y" and record["passed"] and record["rtol"] == 1e-4
    assert {"max_abs_err", "max_rel_err", "worst_index"} <= set(record)
    bench = json.loads((out / "genfiles/add/bench_cpu-host.json").read_text())
    assert bench["status"] == "measured" and bench["repetitions"] == 2
    assert bench["repetitions_run"] == 2 and bench["over_budget"] is False
    assert 0 < bench["min"] <= bench["median"] <= bench["max"] and bench["time_unit"] == "us"
    assert bench["device"] == "local-task" and bench["machine"]["cpu"]
    assert bench["inputs"]["source"] == "generated" and bench["inputs"]["shapes"] == {"x": [2, 3]}
    module = _manifest_module(out, "add", "cpu-host")
    (check,) = module["verification"]
    assert check["passed"] is True and check["references"]["onnxruntime"]["passed"] is True
    assert module["benchmark"][0]["median"] == bench["median"]
    # Both name the device they ran on: this machine's CPU, as `kiln devices` says.
    listed = json.loads(kiln("devices", "--json").stdout)["here"]
    cpu = next(d["id"] for d in listed if d["kind"] == "cpu")
    assert result["device_id"] == bench["device_id"] == check["device_id"] == cpu
    assert module["benchmark"][0]["device_id"] == cpu

    again = kiln("build", str(build), "add", "--target", "cpu")
    assert again.returncode == 0 and "0 built" in again.stderr


def test_a_wrong_reference_fails_naming_model_target_output(build, kiln, tmp_path: Path):
    r = kiln("build", str(build), "add", "--target", "vmvx", "--expected", "wrong.pb")
    assert r.returncode == 1
    assert "add/add.onnx compiled for vmvx" in r.stderr
    assert "against shipped: output 0 (y)" in r.stderr and "1 elements differ" in r.stderr
    assert "worst: [1, 2] got 6.0 expected 7.0" in r.stderr
    assert "against onnxruntime" not in r.stderr  # onnxruntime agrees with IREE
    check = _manifest_module(tmp_path / "kiln-out", "add", "vmvx")["verification"][0]
    assert check["passed"] is False and check["status"] == "failed"
    assert check["references"]["onnxruntime"]["passed"] is True
    assert check["references"]["shipped"]["outputs"][0]["worst_index"] == [1, 2]


def test_generated_inputs_are_deterministic_and_recorded(build, kiln, tmp_path: Path):
    r = kiln("build", str(build), "two", "--target", "cpu", "--target", "vmvx", "-j", "2")
    assert r.returncode == 0, r.stderr
    results = [
        json.loads((tmp_path / f"kiln-out/genfiles/two/gen_{i}.json").read_text()) for i in (0, 1)
    ]
    seed = _tensors.file_seed(str(tmp_path / "two.onnx"))
    for result in results:
        assert result["passed"] and result["inputs"] == {
            "source": "generated",
            "seed": seed,
            "shapes": {"a": [3, 4]},
            "model": ".kiln/src/two.onnx",  # below the output directory: made again there
        }
        shape_out = result["references"]["onnxruntime"]["outputs"][1]
        assert shape_out["dtype"] == "int64" and (shape_out["rtol"], shape_out["atol"]) == (0, 0)
    # One onnxruntime run serves both targets.
    assert r.stderr.count("in onnxruntime") == 1


def test_generate_inputs_per_dtype_and_shapes() -> None:
    specs = [
        _tensors.InputSpec("f", "float32", ("N", 3)),
        _tensors.InputSpec("i", "int64", (None,)),
        _tensors.InputSpec("b", "bool", (2,)),
        _tensors.InputSpec("h", "float16", (4,)),
    ]
    arrays, shapes = _tensors.generate_inputs(specs, 7, {"N": 5})
    again, _ = _tensors.generate_inputs(specs, 7, {"N": 5})
    assert shapes == {"f": [5, 3], "i": [_tensors.DEFAULT_DIM], "b": [2], "h": [4]}
    assert all(np.array_equal(a, b) for a, b in zip(arrays, again, strict=True))
    f, i, b, h = arrays
    assert f.dtype == np.float32 and f.min() >= -1 and f.max() < 1
    assert i.dtype == np.int64 and i.min() >= 0 and i.max() < _tensors.INT_HIGH
    assert b.dtype == bool and h.dtype == np.float16
    other, _ = _tensors.generate_inputs(specs, 8, {"N": 5})
    assert not np.array_equal(other[0], f)


def test_tolerances_per_dtype() -> None:
    f16 = np.array([1.0, 2.0], np.float16)
    assert _tensors.compare(0, f16, f16 + np.float16(0.001), {})["passed"]
    f32 = np.array([1.0, 2.0], np.float32)
    assert not _tensors.compare(0, f32, f32 + 0.001, {})["passed"]
    ints = np.array([3, 4])
    record = _tensors.compare(0, ints, ints + [0, 1], {})
    assert not record["passed"] and record["worst_index"] == [1]
    assert _tensors.compare(0, f32, f32 + 0.001, {"float32": (0, 0.01)})["passed"]


def test_cuda_module_checks_are_skipped_without_a_device(build, kiln, tmp_path: Path):
    r = kiln("build", str(build), "add", "--target", "cuda:sm_80", "-j", "2")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "kiln-out"
    result = json.loads((out / "genfiles/add/both_80.json").read_text())
    assert result["status"] == "skipped" and result["passed"] is None
    assert result["reason"] == "no cuda:sm_80 device here"
    module = _manifest_module(out, "add", "cuda-sm_80")
    assert module["verification"][0] == {
        "passed": None,
        "status": "skipped",
        "reason": "no cuda:sm_80 device here",
    }
    assert module["benchmark"][0]["status"] == "skipped"
    # The results' own entries (the entrypoint returns them) say so too, not "built".
    manifest = json.loads((out / "manifest.json").read_text())
    own = {Path(o["path"]).name: o for o in manifest["entrypoints"]["add"]["outputs"]}
    assert own["both_80.json"]["status"] == "skipped"
    assert own["both_80.json"]["verification"] == module["verification"][0]
    assert own["bench_80.json"]["status"] == "skipped"
    assert own["bench_80.json"]["benchmark"]["reason"] == "no cuda:sm_80 device here"
    assert "2 check(s) skipped:" in r.stderr
    assert "Benchmarking add/add_cuda-sm_80.vmfb: skipped: no cuda:sm_80 device here" in r.stderr
    assert "device_id" not in module["verification"][0]
    # --require-devices fails them instead; the skipped results are not served.
    r = kiln("build", str(build), "add", "--target", "cuda:sm_80", "--require-devices")
    assert r.returncode == 1 and "no cuda:sm_80 device here (--require-devices)" in r.stderr
    # A stand-in device takes them: keyed by its id, they run no module and say so.
    r = kiln(
        "build", str(build), "add", "--target", "cuda:sm_80", env={"KILN_DEVICES": "cuda:sm_80"}
    )
    assert r.returncode == 0, r.stderr
    result = json.loads((out / "genfiles/add/both_80.json").read_text())
    assert result["status"] == "skipped" and "@standin-" in result["device_id"]
    assert result["reason"] == f"{result['device_id']} is a stand-in device (KILN_DEVICES): " + (
        "it runs no module"
    )


def test_unsupported_gpu_target_fails_before_compiling(build, kiln, tmp_path: Path):
    r = kiln("build", str(build), "add", "--target", "cuda:sm_90")
    assert r.returncode == 2
    assert "--target cuda:sm_90" in r.stderr and "missing GPU target" in r.stderr
    assert "use --target cuda:sm_89" in r.stderr
    assert not (tmp_path / "kiln-out/bin").exists()


def test_verify_definition_errors(kiln, write_module, tmp_path: Path):
    _write_models(tmp_path)
    module = write_module(
        """
        @entrypoint
        def bad():
            (m,) = compile(name="add", source=source_file("add.onnx"), targets=["vmvx"])
            return verify(name="v.json", module=m, reference="onnxruntime")
        """
    )
    r = kiln("build", str(module))
    assert r.returncode == 2
    assert "verify of bad/add_vmvx.vmfb" in r.stderr and "needs the ONNX model" in r.stderr


def test_a_shipped_model_on_generated_inputs_against_onnxruntime(
    kiln, write_module, tmp_path, monkeypatch
):
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "examples"))
    from zoo_models import model_zoo

    (shipped,) = [m for m in model_zoo(["pytorch-converted"]) if m.name.endswith("test_Softmax")]
    module = write_module(
        f"""
        @entrypoint
        def softmax():
            mlir = onnx_import(name="m.mlir", source=source_file({shipped.model!r}, name="m.onnx"))
            (m,) = compile(name="m", source=mlir, targets=["vmvx"])
            return [m, verify(name="v.json", module=m, reference="onnxruntime")]
        """
    )
    r = kiln("build", str(module))
    assert r.returncode == 0, r.stderr
    result = json.loads((tmp_path / "kiln-out/genfiles/softmax/v.json").read_text())
    assert result["passed"] and result["inputs"]["source"] == "generated"
    assert result["references"]["onnxruntime"]["outputs"][0]["max_abs_err"] < 1e-5


STRNORM = """
@entrypoint
def strnorm():
    return verify(name="v.json", module=source_file("fake.vmfb"), model=source_file("s.onnx"),
                  inputs=[source_file("words.pb")], reference="onnxruntime")
"""


def test_onnxruntime_own_log_lines_stay_off_the_console(
    tmp_path: Path, write_module, kiln_subprocess
) -> None:
    # A locale no machine has: onnxruntime fails to make the kernel, and logs the
    # failure in red on the process's stderr besides raising it.
    node = helper.make_node(
        "StringNormalizer", ["x"], ["y"], case_change_action="UPPER", locale="xx_XX.UTF-8"
    )
    graph = helper.make_graph(
        [node],
        "strnorm",
        [helper.make_tensor_value_info("x", TensorProto.STRING, [2])],
        [helper.make_tensor_value_info("y", TensorProto.STRING, [2])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "s.onnx")
    words = helper.make_tensor("x", TensorProto.STRING, [2], [b"monday", b"tuesday"])
    (tmp_path / "words.pb").write_bytes(words.SerializeToString())
    (tmp_path / "fake.vmfb").write_bytes(b"not a module")
    write_module(STRNORM)

    r = kiln_subprocess("build", "build.py")

    assert r.returncode == 1
    assert "Failed to construct locale" in r.stderr  # in kiln's own failure message
    assert "\x1b" not in r.stderr and "[E:onnxruntime" not in r.stderr


BUDGET = """
@entrypoint
def budget():
    mlir = onnx_import(name="add.mlir", source=source_file("add.onnx"))
    (module,) = compile(name="add", source=mlir)
    # A budget no call fits in; and one that holds a few repetitions of 50 ms.
    return [benchmark(name="over.json", module=module, shapes={"N": 2}, time_budget_s=1e-7),
            benchmark(name="few.json", module=module, shapes={"N": 2}, repetitions=50,
                      min_time_s=0.05, time_budget_s=0.3)]
"""


def test_benchmark_keeps_to_its_time_budget(tmp_path: Path, write_module, kiln):
    _write_models(tmp_path)
    write_module(BUDGET)

    r = kiln("build", "build.py", "--target", "cpu")

    assert r.returncode == 0, r.stderr
    out = tmp_path / "kiln-out" / "genfiles" / "budget"
    over = json.loads((out / "over.json").read_text())
    assert over["status"] == "measured" and over["over_budget"] is True
    assert over["repetitions_run"] == 1 and over["samples"] == [over["median"]]
    assert over["single_call_s"] > over["time_budget_s"]
    few = json.loads((out / "few.json").read_text())
    assert few["over_budget"] is False and 1 <= few["repetitions_run"] <= 6
    assert "1 benchmark(s) over budget:" in r.stderr
    assert "Benchmarking budget/add_cpu-host.vmfb: one call took" in r.stderr
    assert "over its time budget of 1e-07s: measured once" in r.stderr


def test_references_on_other_inputs_are_named_by_them_not_numbered(
    tmp_path: Path, write_module, kiln
) -> None:
    _write_models(tmp_path)
    write_module(
        """
        @entrypoint
        def refs():
            mlir = onnx_import(name="add.mlir", source=source_file("add.onnx"))
            (m,) = compile(name="add", source=mlir, targets=["vmvx"])
            return [verify(name=f"v_{i}.json", module=m, inputs=[source_file(f"{x}.pb")],
                           reference="onnxruntime") for i, x in enumerate(("x", "y", "x"))]
        """
    )

    def names() -> list[str]:
        r = kiln("list", "build.py", "--all", "--json")
        assert r.returncode == 0, r.stderr
        return sorted(f["path"] for f in json.loads(r.stdout)["files"] if ".npz" in f["path"])

    first = names()
    assert len(first) == 2 and "refs/add.onnxruntime.npz" in first
    (other,) = set(first) - {"refs/add.onnxruntime.npz"}
    assert re.fullmatch(r"refs/add\.onnxruntime-[0-9a-f]{12}\.npz", other)
    assert names() == first  # the same inputs, the same names
