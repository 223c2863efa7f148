"""``kiln compare --measure``'s measuring on this machine: ``iree-benchmark-module``
through the benchmark action's own code (``kiln.actions.bench.measure_module``), on
the inputs the build's benchmark recorded (its given files, read again below the
output directory, or its generated inputs made again from the model, seed and
shapes: ``kiln.actions.bench.recorded_inputs``); else on inputs of the shapes the
module's function declares (zeros; a dynamic dimension takes the size the build's
checks recorded for that input)."""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path
from typing import Any

from kiln.actions.bench import sane_shapes
from kiln.base.errors import ToolError
from kiln.compare.builds import Artifact

_TENSOR = re.compile(r"%\w+: tensor<([^>]*)>")
_DTYPES = {
    "f32": "float32",
    "f16": "float16",
    "f64": "float64",
    "i8": "int8",
    "i16": "int16",
    "i32": "int32",
    "i64": "int64",
    "i1": "bool",
    "ui8": "uint8",
    "bf16": None,
}
REPETITIONS = 3  # per run of iree-benchmark-module
MIN_TIME_S = 0.05


def recorded_shapes(art: Artifact) -> list[list[int]]:
    """The input shapes the build's checks and benchmarks ran the module on, in order."""
    for entry in [*art.benchmark, *art.verification]:
        inputs = entry.get("inputs")
        shapes = inputs.get("shapes") if isinstance(inputs, dict) else None
        if isinstance(shapes, dict) and shapes:
            found = [s for s in shapes.values() if isinstance(s, list)]
            if sane_shapes({str(i): s for i, s in enumerate(found)}):
                return found
    return []


def _signature(module: Path, driver: str) -> tuple[str, list[str]]:
    """The exported function's name and its arguments' tensor types (``?x3xf32``)."""
    from kiln.actions.bench import module_signature

    name, declaration = module_signature(str(module), driver)
    head = declaration.split("->", 1)[0]
    return name, _TENSOR.findall(head)


def _arrays(types: list[str], shapes: list[list[int]]) -> list[Any]:
    import numpy as np

    arrays = []
    for i, text in enumerate(types):
        *dims, dtype = text.split("x")
        numpy_type = _DTYPES.get(dtype)
        if numpy_type is None:
            raise ToolError(f"input {i} is of type {dtype}, which --measure cannot make")
        shape = []
        for j, d in enumerate(dims):
            if d == "?":
                if i >= len(shapes) or j >= len(shapes[i]):
                    raise ToolError(f"input {i} has a dynamic dimension no check recorded")
                shape.append(shapes[i][j])
            else:
                shape.append(int(d))
        if not sane_shapes({"input": shape}):
            raise ToolError(f"input {i} would be of shape {shape}, larger than --measure makes")
        arrays.append(np.zeros(shape, dtype=numpy_type))
    return arrays


def recorded_inputs_of(art: Artifact) -> dict[str, Any] | None:
    """What the build's benchmark of ``art`` recorded of its inputs."""
    for entry in art.benchmark:
        inputs = entry.get("inputs")
        if isinstance(inputs, dict):
            return inputs
    return None


class Measurer:
    """Runs one module's benchmark here; counts the runs (``runs``). What a module
    runs on (its function, its inputs written once) is prepared at its first run
    and kept until ``close``."""

    def __init__(self, shapes: dict[Path, list[list[int]]]):
        self.shapes = shapes
        # Per module file: what its build's benchmark recorded of its inputs, and
        # the output directory that holds them.
        self.recorded: dict[Path, tuple[dict[str, Any], Path]] = {}
        self.runs = 0
        self._scratch = tempfile.TemporaryDirectory(prefix="kiln-compare-")
        # Per (module, driver): its function, the directory of its inputs, their count.
        self._prepared: dict[tuple[Path, str], tuple[str, str, int]] = {}

    def close(self) -> None:
        self._scratch.cleanup()

    def __call__(self, module: Path, flags: list[str]) -> list[float]:
        from kiln.actions.bench import driver_for_flags, measure_module

        driver = driver_for_flags(flags)
        prepared = self._prepared.get((module, driver))
        if prepared is None:
            prepared = self._prepared[(module, driver)] = self._prepare(module, driver)
        function, inputs, count = prepared
        self.runs += 1
        return measure_module(str(module), driver, function, inputs, count, REPETITIONS, MIN_TIME_S)

    def _prepare(self, module: Path, driver: str) -> tuple[str, str, int]:
        import numpy as np

        function, types = _signature(module, driver)
        arrays = self._recorded(module)
        if arrays is None:
            if not types:
                raise ToolError(
                    "its benchmark recorded no inputs kiln can read again, and its "
                    "function declares no argument types"
                )
            arrays = _arrays(types, self.shapes.get(module, []))
        inputs = os.path.join(self._scratch.name, str(len(self._prepared)))
        os.mkdir(inputs)
        for i, array in enumerate(arrays):
            np.save(os.path.join(inputs, f"{i}.npy"), array)
        return function, inputs, len(arrays)

    def _recorded(self, module: Path) -> list[Any] | None:
        from kiln.actions.bench import recorded_inputs

        found = self.recorded.get(module)
        if found is None:
            return None
        try:
            return recorded_inputs(found[0], str(found[1]))
        except (OSError, ValueError, ToolError):
            return None  # moved or damaged since: the declared shapes, if any
