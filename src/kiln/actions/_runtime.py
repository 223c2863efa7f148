"""Running a compiled module with iree.runtime on host arrays, and verifying its
outputs against expected ones with a tolerance. Plain values in, so the calls
pickle into worker processes; iree and numpy are imported on first use."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kiln.actions._logs import short_diagnostic
from kiln.actions._tensors import compare_all, load_tensor
from kiln.base.errors import ToolError
from kiln.output_dir.writing import atomic_write

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class Loads:
    """What a run of a compiled module reads beside the module and its given inputs,
    as plain values: its parameter archives, ``(scope, path)`` each, and for a module
    exported from PyTorch (no ONNX model to read a signature from) its example
    inputs' ``(name, dtype, dims)`` and the file that seeds generated inputs (the
    digest of the model's weights)."""

    parameters: list[tuple[str, str]] = field(default_factory=list)
    signature: list[tuple[str, str, tuple[Any, ...]]] | None = None
    seed_file: str | None = None


@dataclass(kw_only=True)
class RunSpec:
    """What every run of a compiled module (a verify's ``Check``, a benchmark's
    ``Bench``) is told, as plain values (it pickles into a worker): where its result
    goes, the module and how it runs (target, driver, function), its inputs (given
    files, else generated from ``model`` or ``loads``' example inputs, by
    ``shapes``), and, once placed, the id of its device or why it runs no module
    (``ModuleRunAction.placed``)."""

    result_path: str
    module: str
    target: str
    driver: str
    function: str | None
    model: str | None
    inputs: list[str]
    shapes: dict[str, Any]
    input_names: list[str] = field(default_factory=list)  # the inputs' graph paths
    loads: Loads = field(default_factory=Loads)  # archives; torch's example inputs
    device: str | None = None
    absent: str | None = None


def write_result(path: str, result: dict[str, Any]) -> None:
    """Write a run's JSON result (a verify's, a benchmark's) at ``path``, atomically."""
    with atomic_write(path, "w") as f:
        f.write(json.dumps(result, indent=2, sort_keys=True) + "\n")


def _load(module: str, driver: str, parameters: Sequence[tuple[str, str]]) -> Any:
    """The bound module, behind an I/O parameters module serving ``parameters``
    (``(scope, archive)`` pairs) when there are any."""
    import iree.runtime as rt

    # The runtime keeps its drivers and devices for the life of the process, and
    # nanobind reports each as "leaked" on stderr at exit; a run loaded here (kiln
    # compare --measure, an in-process check) must not end a command with that.
    quiet = getattr(getattr(rt, "_binding", None), "disable_leak_checker", None)
    if quiet is not None:
        quiet()
    if not parameters:
        return rt.load_vm_flatbuffer_file(module, driver=driver)
    config = rt.Config(driver_name=driver)
    providers = []
    for scope, archive in parameters:
        index = rt.ParameterIndex()
        index.load(archive)
        providers.append(index.create_provider(scope=scope))
    io_params = rt.create_io_parameters_module(config.vm_instance, *providers)
    vm_module = rt.VmModule.mmap(config.vm_instance, module)
    return rt.load_vm_modules(io_params, vm_module, config=config)[-1]


def bind_function(
    module: str, driver: str, function: str | None, parameters: Sequence[tuple[str, str]] = ()
) -> tuple[Any, str]:
    """Load `module` on `driver` (with its parameter archives, ``(scope, path)``);
    return (invoker, name) of `function` or the only export."""
    try:
        bound = _load(module, driver, parameters)
    except Exception as e:
        raise ToolError(
            f"cannot load module {module} on driver {driver}: {short_diagnostic(e)}"
        ) from e
    # Skip __init and the "$async" twins the compiler adds next to each function.
    names = [n for n in bound.vm_module.function_names if not n.startswith("__") and "$" not in n]
    function = names[0] if function is None and len(names) == 1 else function
    if function is None or function not in names:
        wanted = "a single exported function" if function is None else repr(function)
        raise ToolError(f"module {module} has no {wanted}; it exports {names}")
    return bound[function], function


def run_module(
    module: str,
    args: Sequence[Any],
    driver: str = "local-task",
    function: str | None = None,
    parameters: Sequence[tuple[str, str]] = (),
) -> tuple[str, list[np.ndarray]]:
    """Run `function` (or the only export) of a compiled module on host arrays, its
    parameter archives (``(scope, path)``) loaded; return the function's name and its
    outputs as host arrays."""
    import numpy as np

    invoker, function = bind_function(module, driver, function, parameters)
    try:
        result = invoker(*args)
    except Exception as e:
        raise ToolError(f"running {function} from {module} failed: {short_diagnostic(e)}") from e
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
    return {
        "module": module,
        "function": function,
        "driver": driver,
        "rtol": rtol,
        "atol": atol,
        **result,
    }
