"""``benchmark``: time a compiled module with ``iree-benchmark-module`` (from
iree-base-runtime) on its device, in a worker.

The action is in the ``machine`` pool and takes it exclusively (``exclusive``):
it starts only when no import, compile, reference run, verify or other benchmark
is running, and none of them starts while it runs, so timings stay clean.

Time is bounded by ``time_budget_s``: one call is timed first; the repetitions that
follow are as many as fit in what is left of the budget (each takes about the
longer of one call and ``min_time_s``), at most ``repetitions``, at least one. A
single call longer than the whole budget is measured once, from that call, and
the result says so (``over_budget``).

Result JSON::

    {"status": "measured" | "skipped", "reason": (when skipped), "module", "target",
     "device" (driver), "device_id" (``kiln.devices.identity``), "function",
     "repetitions" (at most), "repetitions_run",
     "min_time_s", "time_budget_s", "single_call_s", "over_budget", "flags",
     "inputs": {...as verify's}, "machine": {"cpu", "cpus", "arch"},
     "devices": [runtime device URIs], "time_unit": "us", "median", "mean",
     "stddev", "min", "max", "samples": [per-repetition mean latency],
     "iterations": [per repetition], "runtime_version"}
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.actions import _devices
from kiln.actions._logs import read_tail, shown_path
from kiln.actions._module_run import ModuleRunAction, declare_run
from kiln.actions._runtime import RunSpec, write_result
from kiln.actions.output_record import element_count
from kiln.base.errors import BuildDefinitionError, ToolError
from kiln.graph import BuildFile
from kiln.graph.manifest_meta import ManifestMeta
from kiln.output_dir.layout import OUTSIDE_VIEW, SOURCE_VIEW
from kiln.output_dir.names import file_below

_TO_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
_MAX_RESULTS = 64 << 20  # bytes of JSON results read back; more is not results


@dataclass(kw_only=True)
class Bench(RunSpec):
    """Everything one benchmark needs: the run (``RunSpec``) and how to time it."""

    repetitions: int
    min_time_s: float
    flags: list[str]
    time_budget_s: float = 5.0


def _function(bench: Bench) -> str:
    from kiln.actions._runtime import bind_function

    found = bind_function(bench.module, bench.driver, None, bench.loads.parameters)[1]
    return bench.function or found


def _measure(
    bench: Bench, function: str, input_dir: str, count: int, repetitions: int, min_time: str
) -> list[dict[str, Any]]:
    """Run iree-benchmark-module (``min_time``: ``0.1s``, or ``1x`` for one call per
    repetition); return its per-repetition records."""
    cmd = [
        _devices.runtime_tool("iree-benchmark-module"),
        f"--module={bench.module}",
        f"--device={bench.driver}",
        f"--function={function}",
        *(f"--parameters={scope}={archive}" for scope, archive in bench.loads.parameters),
        *(f"--input=@{os.path.join(input_dir, f'{i}.npy')}" for i in range(count)),
        f"--benchmark_repetitions={repetitions}",
        "--benchmark_format=json",
        f"--benchmark_min_time={min_time}",
        *bench.flags,
    ]
    # Both streams go to files, not memory: the module may print without bound.
    out_path, err_path = os.path.join(input_dir, "out.json"), os.path.join(input_dir, "err.txt")
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        returncode = subprocess.run(
            cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=err
        ).returncode
    if returncode != 0:
        tail = read_tail(err_path if os.path.getsize(err_path) else out_path, max_lines=12)
        raise ToolError(
            f"iree-benchmark-module failed on {shown_path(bench.module)}:\n{tail}", returncode
        )
    try:
        if os.path.getsize(out_path) > _MAX_RESULTS:
            raise ValueError("too large")
        with open(out_path, encoding="utf-8", errors="replace") as f:
            runs = json.load(f)["benchmarks"]
    except (ValueError, KeyError) as e:
        raise ToolError(
            f"iree-benchmark-module printed no JSON results for {shown_path(bench.module)}"
        ) from e
    return [r for r in runs if r.get("run_type") == "iteration"]


def run_benchmark(bench: Bench) -> None:
    """Worker side of ``benchmark``: measure, summarise, write the JSON result."""
    import statistics

    import numpy as np

    from kiln.actions._reference import run_inputs

    head: dict[str, Any] = {
        "module": bench.module,
        "target": bench.target,
        "device": bench.driver,
        "device_id": bench.device,
        "machine": _devices.machine(),
        "runtime_version": _devices.runtime_version(),
        "repetitions": bench.repetitions,
        "min_time_s": bench.min_time_s,
        "time_budget_s": bench.time_budget_s,
        "flags": bench.flags,
    }
    if bench.absent is not None:
        write_result(bench.result_path, {**head, "status": "skipped", "reason": bench.absent})
        return
    args, how = run_inputs(bench)
    function = _function(bench)
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        for i, array in enumerate(args):
            np.save(os.path.join(tmp, f"{i}.npy"), array)
        probe = _samples(bench, _measure(bench, function, tmp, len(args), 1, "1x"))
        single_s = probe[0] / 1e6
        repetitions = _repetitions(bench, single_s)
        if repetitions:
            runs = _measure(bench, function, tmp, len(args), repetitions, f"{bench.min_time_s:g}s")
        else:  # one call is over the whole budget: that call is the measurement
            runs = [{"real_time": probe[0], "time_unit": "us", "iterations": 1}]
    samples = _samples(bench, runs)
    write_result(
        bench.result_path,
        {
            **head,
            "repetitions_run": len(samples),
            "single_call_s": single_s,
            "over_budget": not repetitions,
            "status": "measured",
            "function": function,
            "inputs": how,
            "devices": _devices.list_devices(bench.driver),
            "time_unit": "us",
            "median": statistics.median(samples),
            "mean": statistics.fmean(samples),
            "stddev": statistics.stdev(samples) if len(samples) > 1 else 0.0,
            "min": min(samples),
            "max": max(samples),
            "samples": samples,
            "iterations": [int(r.get("iterations", 0)) for r in runs],
        },
    )


def _samples(bench: Bench, runs: list[dict[str, Any]]) -> list[float]:
    """Each repetition's mean latency in microseconds."""
    if not runs:
        raise ToolError(f"iree-benchmark-module reported no runs for {shown_path(bench.module)}")
    return [float(r["real_time"]) * _TO_US[r.get("time_unit", "ns")] for r in runs]


def _repetitions(bench: Bench, single_s: float) -> int:
    """How many repetitions fit in the budget after one call took ``single_s``: each
    runs for about the longer of a call and ``min_time_s``. At least one, at most
    ``repetitions``; 0 when that one call alone took the whole budget."""
    if single_s >= bench.time_budget_s:
        return 0
    each = max(single_s, bench.min_time_s)
    fit = int((bench.time_budget_s - single_s) // each) if each > 0 else bench.repetitions
    return max(1, min(bench.repetitions, fit))


class BenchmarkAction(ModuleRunAction):
    """Times a compiled module in a worker, alone in the machine pool. Its key holds
    the module's digest, the device it runs on (``needs``: ``kiln.devices.identity``),
    the flags, the repetitions and the machine (CPU model, count, architecture)."""

    exclusive = True
    reproducible = False  # it times this machine: never shared with another
    SPEC = "bench"

    def __init__(self, *, bench: Bench, **kwargs: Any):
        self.bench = bench
        self.machine = _devices.machine()
        super().__init__(**kwargs)
        self.bench = dataclasses.replace(bench, loads=self.loads())

    def keyed_spec(self) -> dict[str, Any]:
        b = self.bench
        return {
            "target": b.target,
            "driver": b.driver,
            "function": b.function,
            "shapes": b.shapes,
            "repetitions": b.repetitions,
            "min_time_s": b.min_time_s,
            "time_budget_s": b.time_budget_s,
            "flags": b.flags,
            "inputs": len(b.inputs),
        }

    def _remotable_thunk(self) -> Callable[[], None]:
        return self.sandbox_thunk(lambda f: f.action_path)

    def sandbox_thunk(self, path: Callable[[BuildFile], str]) -> Callable[[], None]:
        """The benchmark with its files at ``path(file)`` (a remote sandbox's, or
        here), on the device the build's devices place it on."""
        device, absent = self.placed()
        bench = dataclasses.replace(self.spec_at(self.bench, path), device=device, absent=absent)
        return functools.partial(run_benchmark, bench)


def benchmark(
    *,
    name: str,
    module: BuildFile | str,
    inputs: Sequence[BuildFile | str] | None = None,
    repetitions: int = 10,
    model: BuildFile | str | None = None,
    shapes: Mapping[str, Any] | None = None,
    min_time_s: float = 0.1,
    flags: Sequence[str] = (),
    driver: str | None = None,
    function: str | None = None,
    time_budget_s: float = 5.0,
    parameters: Sequence[Any] | None = None,
) -> BuildFile:
    """Declare a benchmark of compiled ``module``; its JSON result goes to ``name``.

    ``inputs=None`` generates inputs from the ONNX ``model`` (default: the model the
    module was imported from), as ``verify`` does. Each repetition runs the function
    for at least ``min_time_s``; there are as many as fit in ``time_budget_s`` of
    measuring, at most ``repetitions`` and at least one (one call longer than the
    budget is the measurement). ``flags`` go to iree-benchmark-module. A module
    compiled from ``torch_export`` generates inputs from its example inputs. The
    module's parameter archives are loaded (``--parameters=SCOPE=FILE``): those of
    its program, or ``parameters`` (files, or ``(scope, file)`` pairs).
    """
    from kiln.actions._tensors import normalize_shapes

    run = declare_run(module, inputs, model, driver, parameters, kind="benchmark")
    module_file, model_file, input_files = run.module, run.model, run.inputs
    if repetitions < 1 or not min_time_s > 0 or not 0 < time_budget_s < float("inf"):
        raise BuildDefinitionError(
            f"benchmark of {module_file.path}: repetitions must be >= 1, min_time_s > 0 "
            "and time_budget_s a positive number of seconds"
        )
    if not input_files and model_file is None and run.exporter is None:
        raise BuildDefinitionError(
            f"benchmark of {module_file.path}: generating inputs needs the ONNX model: pass "
            "inputs=[...] or model=..., or compile a module imported with onnx_import or "
            "exported with torch_export"
        )
    output = run.context.allocate_file(name)
    generated = model_file is not None and not input_files
    bench = Bench(
        result_path=output.action_path,
        module=module_file.action_path,
        target=run.target,
        driver=run.driver,
        function=function,
        model=model_file.action_path if generated and model_file is not None else None,
        inputs=[f.action_path for f in input_files],
        input_names=[f.path for f in input_files],
        shapes=normalize_shapes(shapes),
        repetitions=repetitions,
        min_time_s=min_time_s,
        flags=list(flags),
        time_budget_s=float(time_budget_s),
    )
    files = [module_file, *input_files]
    if generated and model_file is not None:
        files.append(model_file)
    action = BenchmarkAction(
        bench=bench,
        files=files,
        output_file=output,
        needs=run.needs,
        archives=run.archives,
        exporter=run.exporter,
        desc=f"Benchmarking {module_file.path}",
        executor=run.context.executor,
    )
    ManifestMeta.get(module_file).benchmarks.append((action, output))
    ManifestMeta.get(output).result_of = ("benchmark", action)
    return output


def measure_module(
    module: str,
    driver: str,
    function: str,
    input_dir: str,
    count: int,
    repetitions: int,
    min_time_s: float,
) -> list[float]:
    """One ``iree-benchmark-module`` run of ``function`` on the inputs ``0.npy`` ...
    in ``input_dir``: each repetition's mean latency in µs (``kiln compare --measure``
    measures with this, as the benchmark action does)."""
    bench = Bench(
        result_path="",
        module=module,
        target="",
        driver=driver,
        function=function,
        model=None,
        inputs=[],
        shapes={},
        repetitions=repetitions,
        min_time_s=min_time_s,
        flags=[],
    )
    runs = _measure(bench, function, input_dir, count, repetitions, f"{min_time_s:g}s")
    return _samples(bench, runs)


def module_signature(module: str, driver: str) -> tuple[str, str]:
    """The function ``module`` exports (the one a benchmark times) and its ABI
    declaration (``iree.abi.declaration``: its arguments' tensor types)."""
    from kiln.actions._runtime import bind_function

    invoker, name = bind_function(module, driver, None)
    reflection: dict[str, str] = getattr(getattr(invoker, "vm_function", None), "reflection", {})
    return name, reflection.get("iree.abi.declaration", "")


def driver_for_flags(flags: list[str]) -> str:
    """The runtime driver a module compiled with ``flags`` runs on."""
    return _devices.driver_for_flags(flags)


def recorded_inputs(inputs: dict[str, Any], root: str) -> list[Any] | None:
    """The arrays a benchmark ran on, made again from what its result recorded
    (``inputs``: given files by ``paths``, or generated from ``model`` with
    ``shapes``), reading below the output directory ``root``; None when the result
    recorded too little (an older kiln, a PyTorch module's example inputs), or when
    what is made now is not what it recorded (a given file edited since, a model
    whose inputs are other than the shapes name)."""
    from kiln.actions._reference import check_inputs, model_signature

    def inside(rel: Any) -> str | None:  # a regular file, through real directories
        # a link at its end only where kiln links the build's sources
        linked = isinstance(rel, str) and rel.startswith((f"{SOURCE_VIEW}/", f"{OUTSIDE_VIEW}/"))
        found = file_below(Path(root), rel, follow_last=linked)
        return str(found) if found is not None else None

    if inputs.get("source") == "given":
        paths = inputs.get("paths")
        found = [inside(p) for p in paths] if isinstance(paths, list) and paths else [None]
        if any(f is None for f in found):
            return None
        arrays, how = check_inputs(None, [f for f in found if f is not None], {})
        recorded = inputs.get("sha256")
        return arrays if recorded is None or recorded == how["sha256"] else None
    model = inside(inputs.get("model"))
    shapes = inputs.get("shapes")
    if inputs.get("source") != "generated" or model is None or not sane_shapes(shapes):
        return None
    assert isinstance(shapes, dict)  # sane_shapes says so
    if {spec.name for spec in model_signature(model)} != set(shapes):
        return None  # an input the shapes do not bound would take the model's own
    arrays, how = check_inputs(model, [], shapes)
    return arrays if how["seed"] == inputs.get("seed") and how["shapes"] == shapes else None


_MAX_ELEMENTS = 1 << 28  # the inputs a record asks to make: at most this many elements in all


def sane_shapes(shapes: Any) -> bool:
    """Whether ``shapes`` (read from a result kiln does not trust) names inputs of
    whole, non-negative dimensions, of at most ``_MAX_ELEMENTS`` elements in all
    (``kiln.actions.output_record.element_count``)."""
    if not isinstance(shapes, dict):
        return False
    left = _MAX_ELEMENTS
    for dims in shapes.values():
        count = element_count(dims, left)
        if count is None:
            return False
        left -= count
    return True
