"""Running a compiled module with iree.runtime on host arrays, and verifying its
outputs against expected ones with a tolerance. Plain values in, so the calls
pickle into worker processes; iree and numpy are imported on first use."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kiln.actions._logs import short_diagnostic
from kiln.actions._tensors import compare_all, load_tensor
from kiln.errors import ToolError

if TYPE_CHECKING:
    import numpy as np


def bind_function(module: str, driver: str, function: str | None) -> tuple[Any, str]:
    """Load `module` on `driver`; return (invoker, name) of `function` or the only export."""
    import iree.runtime as rt

    try:
        bound = rt.load_vm_flatbuffer_file(module, driver=driver)
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
    module: str, args: Sequence[Any], driver: str = "local-task", function: str | None = None
) -> tuple[str, list[np.ndarray]]:
    """Run `function` (or the only export) of a compiled module on host arrays;
    return the function's name and its outputs as host arrays."""
    import numpy as np

    invoker, function = bind_function(module, driver, function)
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
