"""IREE and ONNX helpers that kiln's model actions run inside worker processes.

Plain functions taking plain values (str, list, float) so they pickle cheaply into
spawned workers.  iree, onnx and numpy are imported lazily so that importing kiln
stays fast when they are not installed.  Failures of the external tools surface as
`ToolError` with short, readable diagnostics; bad ``--target`` values as `UsageError`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import re
import subprocess
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln._redact import redact_urls
from kiln.actions._files import atomic_output, atomic_write
from kiln.actions._logs import open_log, read_tail
from kiln.actions._tensors import compare_all, load_tensor
from kiln.errors import ToolError, UsageError

if TYPE_CHECKING:
    import numpy as np

DIAGNOSTIC_TAIL_LINES = 40
TARGET_FORMS = "cpu, cpu:host, cpu:<cpu name>, vmvx, hip:<chip>, vulkan:<target>, cuda:<sm>"
ZOO_CATEGORIES = ("pytorch-converted", "pytorch-operator", "simple")
_TARGET_ARG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*\Z")
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]+")


def _short(error: BaseException | str, max_lines: int = 8, max_chars: int = 600) -> str:
    """Condense an exception or text to a few lines, so messages stay readable."""
    text = str(error).strip() or type(error).__name__
    lines = text.splitlines()
    if len(lines) > max_lines:
        lines = [*lines[:max_lines], f"... ({len(lines) - max_lines} more lines)"]
    text = "\n".join(lines)
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


def compiler_version() -> str:
    """Return the installed iree-base-compiler version (part of compile action keys)."""
    try:
        return importlib.metadata.version("iree-base-compiler")
    except importlib.metadata.PackageNotFoundError:
        raise ToolError("iree-base-compiler is not installed (pip install 'kiln[iree]')") from None


# --- targets
def _parse_target(spec: str) -> tuple[str, str]:
    """Split a ``--target`` value into (kind, argument), rejecting unknown forms."""
    kind, colon, arg = spec.strip().partition(":")
    kind = kind.lower()
    if kind == "cpu" and not colon:
        arg = "host"
    valid = kind in ("cpu", "hip", "vulkan", "cuda") and _TARGET_ARG.match(arg) is not None
    if valid or (kind == "vmvx" and not arg):
        return kind, arg
    raise UsageError(f"unknown --target {spec!r}; valid forms: {TARGET_FORMS}")


def target_flags(spec: str) -> list[str]:
    """Return the iree-compile flags selecting the device named by a ``--target`` value."""
    kind, arg = _parse_target(spec)
    if kind == "cpu":
        return [
            "--iree-hal-target-device=local",
            "--iree-hal-local-target-device-backends=llvm-cpu",
            f"--iree-llvmcpu-target-cpu={arg}",
        ]
    if kind == "vmvx":
        return ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=vmvx"]
    option = {"hip": "--iree-rocm-target", "vulkan": "--iree-vulkan-target"}.get(
        kind, "--iree-cuda-target"
    )
    return [f"--iree-hal-target-device={kind}", f"{option}={arg}"]


def target_name(spec: str) -> str:
    """Return a short filesystem-safe name for a target, e.g. "cpu" or "hip_gfx942"."""
    kind, arg = _parse_target(spec)
    if kind == "vmvx" or (kind == "cpu" and arg == "host"):
        return kind
    return _UNSAFE_NAME_CHARS.sub("_", f"{kind}_{arg}")


def target_driver(spec: str) -> str:
    """Return the iree.runtime driver that runs modules compiled for a target."""
    kind, _ = _parse_target(spec)
    return "local-task" if kind in ("cpu", "vmvx") else kind


# --- ONNX import
def _opset(model: Any) -> int:
    """Return the model's default-domain opset version (0 when it declares none)."""
    versions = [o.version for o in model.opset_import if o.domain in ("", "ai.onnx")]
    return max(versions, default=0)


def _infer_shapes(model: Any, source: str) -> Any:
    """Check the model and infer shapes, which the importer needs for typed tensors."""
    import onnx

    try:
        onnx.checker.check_model(model)
    except ValueError:
        # Over protobuf's 2 GB in-memory limit: infer through files instead (from
        # `source` as is, so without opset upgrades, like upstream iree-import-onnx).
        with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(source))) as tmp:
            inferred = os.path.join(tmp, "inferred.onnx")
            onnx.shape_inference.infer_shapes_path(source, inferred, data_prop=True)
            model = onnx.load(inferred, load_external_data=False)
        onnx.load_external_data_for_model(model, os.path.dirname(os.path.abspath(source)))
        return model
    return onnx.shape_inference.infer_shapes(model, data_prop=True)


def _load_onnx(source: str, opset_version: int | None) -> Any:
    """Load, optionally upgrade, check and shape-infer an ONNX model."""
    import onnx

    try:
        model = onnx.load(source)
    except Exception as e:
        raise ToolError(f"cannot read ONNX model {source}: {_short(e)}") from e
    try:
        if not model.graph.name:  # the checker rejects it; the function needs a name
            model.graph.name = "main_graph"
        if opset_version and opset_version > _opset(model):
            model = onnx.version_converter.convert_version(model, opset_version)
            # The converter can add initializers (e.g. Pad's pads) that IR < 4 also
            # wants as graph inputs; IR 4 drops that rule and means the same here.
            model.ir_version = max(model.ir_version, 4)
        return _infer_shapes(model, source)
    except Exception as e:
        raise ToolError(f"invalid ONNX model {source}: {_short(e)}") from e


def import_onnx(source: str, output: str, opset_version: int | None) -> None:
    """Import an ONNX model to MLIR (torch-mlir ONNX form) at exactly `output`.

    The function is named after the ONNX graph ("main_graph" when unnamed); with
    `opset_version` the model is first upgraded, which can help shape inference.
    """
    from iree.compiler.extras import onnx_importer
    from iree.compiler.ir import Context

    model = _load_onnx(source, opset_version)
    try:
        info = onnx_importer.ModelInfo(model)
        module = info.create_module(context=Context()).operation
        onnx_importer.NodeImporter.define_function(info.main_graph, module).import_all()
        module.verify()
    except Exception as e:
        raise ToolError(f"cannot import ONNX model {source}: {_short(e)}") from e
    with atomic_write(output, "w") as f:
        module.print(file=f, assume_verified=True)


# --- compiling
def compile_module(
    source: str, output: str, input_type: str, flags: list[str], log_path: str
) -> None:
    """Compile MLIR to a .vmfb at `output` by running the iree-compile executable.

    A child process isolates kiln from compiler crashes (LLVM aborts the whole
    process).  Its output streams to `log_path` (never held in memory); on
    failure a bounded tail of it is also the ToolError's message.
    """
    from iree.compiler.tools.binaries import find_tool

    try:
        exe = os.path.normpath(find_tool("iree-compile"))
    except ValueError as e:
        raise ToolError(f"cannot find iree-compile: {_short(e)}") from e
    with atomic_output(output, create=False) as tmp:
        cmd = [exe, source, f"--iree-input-type={input_type}"]
        cmd += ["--mlir-print-op-on-diagnostic=false", *flags, "-o", str(tmp)]
        header = f"$ {redact_urls(subprocess.list2cmdline(cmd))}\n"
        fd = open_log(log_path, header)
        try:
            returncode = subprocess.run(cmd, stdout=fd, stderr=fd).returncode
        finally:
            os.close(fd)
        if returncode != 0:
            status = f"exit code {returncode}"
            if returncode < 0:
                status = f"killed by signal {-returncode}"
            tail = read_tail(log_path, max_lines=DIAGNOSTIC_TAIL_LINES)
            raise ToolError(
                f"iree-compile failed on {source} ({status}):\n{tail}\n(full log: {log_path})"
            )
        if not os.path.lexists(tmp):
            raise ToolError(f"iree-compile finished without writing its output {output}")


# --- running and verifying
def _bind_function(module: str, driver: str, function: str | None) -> tuple[Any, str]:
    """Load `module` on `driver`; return (invoker, name) of `function` or the only export."""
    import iree.runtime as rt

    try:
        bound = rt.load_vm_flatbuffer_file(module, driver=driver)
    except Exception as e:
        raise ToolError(f"cannot load module {module} on driver {driver}: {_short(e)}") from e
    # Skip __init and the "$async" twins the compiler adds next to each function.
    names = [n for n in bound.vm_module.function_names if not n.startswith("__") and "$" not in n]
    function = names[0] if function is None and len(names) == 1 else function
    if function is None or function not in names:
        wanted = "a single exported function" if function is None else repr(function)
        raise ToolError(f"module {module} has no {wanted}; it exports {names}")
    return bound[function], function


def run_module(
    module: str, args: Sequence[Any], driver: str = "local-task", function: str | None = None
) -> tuple[str, list[np.ndarray]]:
    """Run `function` (or the only export) of a compiled module on host arrays;
    return the function's name and its outputs as host arrays."""
    import numpy as np

    invoker, function = _bind_function(module, driver, function)
    try:
        result = invoker(*args)
    except Exception as e:
        raise ToolError(f"running {function} from {module} failed: {_short(e)}") from e
    results = [] if result is None else result if isinstance(result, list | tuple) else [result]
    return function, [np.asarray(r) for r in results]  # device arrays -> host copies


def verify_module(
    module: str,
    inputs: list[str],
    expected: list[str],
    rtol: float,
    atol: float,
    driver: str = "local-task",
    function: str | None = None,
) -> dict[str, Any]:
    """Run a compiled module on `inputs` and compare its outputs with `expected`,
    with one tolerance for every dtype.

    A numeric mismatch is a result (``passed`` False and a ``summary``), not an
    error; failures to load or run the module raise ToolError.
    """
    args = [load_tensor(p) for p in inputs]
    wanted = [load_tensor(p) for p in expected]
    function, actual = run_module(module, args, driver, function)
    result = compare_all(actual, wanted, {"*": (rtol, atol)})
    return {"module": module, "function": function, "driver": driver, "rtol": rtol,
            "atol": atol, **result}  # fmt: skip


# --- model zoo
@dataclass(frozen=True)
class ZooModel:
    """One ONNX backend test model shipped inside the onnx package, with its data."""

    name: str
    category: str
    model: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def _numbered(folder: Path, prefix: str) -> tuple[str, ...]:
    """Paths of ``<prefix>_<n>.pb`` files in `folder`, sorted by n (10 after 9)."""
    found = [(p.stem[len(prefix) + 1 :], p) for p in folder.glob(f"{prefix}_*.pb")]
    return tuple(str(p) for n, p in sorted((int(n), p) for n, p in found if n.isdigit()))


def model_zoo(categories: Sequence[str] = ZOO_CATEGORIES) -> list[ZooModel]:
    """List the onnx package's backend test models with their first test data set.

    Offline by design: the data ships in onnx/backend/test/data/<category>/<test>/.
    Models without a test_data_set_0 are skipped, since they cannot be verified.
    """
    spec = importlib.util.find_spec("onnx")
    if spec is None or spec.origin is None:
        raise ToolError("the onnx package is not installed (pip install 'kiln[iree]')")
    data = Path(spec.origin).parent / "backend" / "test" / "data"
    models = []
    for category in categories:
        if not (data / category).is_dir() or category != Path(category).name:
            known = sorted(p.name for p in data.iterdir() if p.is_dir())
            raise UsageError(f"unknown model zoo category {category!r}; known: {known}")
        for test in sorted((data / category).iterdir()):
            data_set = test / "test_data_set_0"
            if not (test / "model.onnx").is_file() or not data_set.is_dir():
                continue
            name = _UNSAFE_NAME_CHARS.sub("_", f"{category}__{test.name}")
            inputs, outputs = _numbered(data_set, "input"), _numbered(data_set, "output")
            models.append(ZooModel(name, category, str(test / "model.onnx"), inputs, outputs))
    return models
