"""``kiln compare --measure``'s measuring on this machine: ``iree-benchmark-module``
through the benchmark action's own code (``kiln.actions.bench.measure_module``). A
and B of one module run on the same inputs, made once: those a build's benchmark
recorded (its given files, read again below the output directory, or its generated
inputs made again from the model, seed and shapes, each checked against the record:
``kiln.actions.bench.recorded_inputs``); else zeros of the shapes the module's
function declares (a dynamic dimension takes the size the build's checks recorded
for that input), and the notes say so where a record could not be made again."""

from __future__ import annotations

import os
import re
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.actions.bench import sane_shapes
from kiln.base.errors import ToolError
from kiln.compare.builds import Artifact, Build
from kiln.compare.measure import Job

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
    """Zeros for each argument type, a dynamic dimension of the size ``shapes`` gives
    it; refused before anything is made when they would hold more than
    ``sane_shapes`` allows in all."""
    import numpy as np

    wanted: list[tuple[list[int], str]] = []
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
        wanted.append((shape, numpy_type))
    if not sane_shapes({str(i): shape for i, (shape, _) in enumerate(wanted)}):
        raise ToolError(f"its {len(wanted)} inputs would be larger than --measure makes")
    return [np.zeros(shape, dtype=numpy_type) for shape, numpy_type in wanted]


def recorded_inputs_of(art: Artifact) -> dict[str, Any] | None:
    """What the build's benchmark of ``art`` recorded of its inputs."""
    for entry in art.benchmark:
        inputs = entry.get("inputs")
        if isinstance(inputs, dict):
            return inputs
    return None


@dataclass
class _Inputs:
    """What A and B of one module both run on: the records of the builds' benchmarks
    (each with the output directory it reads below), else the shapes their checks
    recorded; once made, the directory of the arrays, their count, and the argument
    types they were made for (None: from a record)."""

    path: str  # the module's, in both builds
    records: list[tuple[dict[str, Any], Path]]
    shapes: list[list[int]]
    made: tuple[str, int, list[str] | None] | None = None


class Measurer:
    """Runs one module's benchmark here; counts the runs (``runs``). What a module
    runs on (its function, its inputs written once for A and B alike) is prepared at
    its first run and kept until ``close``; ``fell_back`` names the modules run on
    zeros though a record named their inputs."""

    def __init__(self) -> None:
        self.runs = 0
        self.fell_back: list[str] = []
        self._scratch = tempfile.TemporaryDirectory(prefix="kiln-compare-")
        self._inputs: dict[Path, _Inputs] = {}
        self._functions: dict[tuple[Path, str], tuple[str, list[str]]] = {}

    def close(self) -> None:
        self._scratch.cleanup()

    def add(self, job: Job, a: Build, b: Build) -> None:
        """``job``'s A and B run on the same inputs, whichever build's record makes them."""
        records = []
        for art, build in ((job.a, a), (job.b, b)):
            found = recorded_inputs_of(art)
            if found is not None and build.root is not None:
                records.append((found, build.root))
        shapes = recorded_shapes(job.a) or recorded_shapes(job.b)
        self._inputs[job.file_a] = self._inputs[job.file_b] = _Inputs(job.path, records, shapes)

    def __call__(self, module: Path, flags: list[str]) -> list[float]:
        from kiln.actions.bench import driver_for_flags, measure_module

        driver = driver_for_flags(flags)
        function = self._functions.get((module, driver))
        if function is None:
            function = self._functions[(module, driver)] = _signature(module, driver)
        name, types = function
        inputs, count = self._made(module, types)
        self.runs += 1
        return measure_module(str(module), driver, name, inputs, count, REPETITIONS, MIN_TIME_S)

    def _made(self, module: Path, types: list[str]) -> tuple[str, int]:
        """The directory of ``module``'s inputs and their count, made at its first run
        (or its pair's): for the other side, zeros made for one function's arguments
        fit only a function of the same arguments."""
        shared = self._inputs[module]
        if shared.made is not None:
            directory, count, made_for = shared.made
            if made_for is not None and made_for != types:
                raise ToolError("its function takes other arguments in A than in B")
            return directory, count
        import numpy as np

        arrays = self._recorded(shared)
        made_for = None
        if arrays is None:
            if shared.records:
                self.fell_back.append(shared.path)
            if not types:
                raise ToolError(
                    "its benchmark recorded no inputs kiln can read again, and its "
                    "function declares no argument types"
                )
            arrays, made_for = _arrays(types, shared.shapes), types
        directory = os.path.join(self._scratch.name, str(len(os.listdir(self._scratch.name))))
        os.mkdir(directory)
        for i, array in enumerate(arrays):
            np.save(os.path.join(directory, f"{i}.npy"), array)
        shared.made = (directory, len(arrays), made_for)
        return directory, len(arrays)

    def _recorded(self, shared: _Inputs) -> list[Any] | None:
        from kiln.actions.bench import recorded_inputs

        for record, root in shared.records:
            try:
                arrays = recorded_inputs(record, str(root))
            except (OSError, ValueError, ToolError):
                arrays = None  # moved or damaged since
            if arrays is not None:
                return arrays
        return None
