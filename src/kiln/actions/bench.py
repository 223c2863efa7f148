"""``benchmark``: time a compiled module with ``iree-benchmark-module`` (from
iree-base-runtime) on its device, in a worker.

The action is in the ``machine`` pool and takes it exclusively (``exclusive``):
it starts only when no import, compile, reference run, verify or other benchmark
is running, and none of them starts while it runs, so timings stay clean.

Result JSON::

    {"status": "measured" | "skipped", "reason": (when skipped), "module", "target",
     "device" (driver), "function", "repetitions", "min_time_s", "flags",
     "inputs": {...as verify's}, "machine": {"cpu", "cpus", "arch"},
     "devices": [runtime device URIs], "time_unit": "us", "median", "mean",
     "stddev", "min", "max", "samples": [per-repetition mean latency],
     "iterations": [per repetition], "runtime_version"}
"""

from __future__ import annotations

import functools
import json
import os
import statistics
import subprocess
import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from kiln.actions import _devices
from kiln.actions._files import atomic_output
from kiln.actions._logs import read_tail, shown_path
from kiln.errors import BuildDefinitionError, ToolError
from kiln.graph import ActionConcurrency, BuildAction, BuildContext, BuildFile
from kiln.manifest import ManifestMeta

_TO_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}
_MAX_RESULTS = 64 << 20  # bytes of JSON results read back; more is not results


@dataclass
class Bench:
    """Everything one benchmark needs, as plain values (it pickles into a worker)."""

    result_path: str
    module: str
    target: str
    driver: str
    function: str | None
    model: str | None
    inputs: list[str]
    shapes: dict[str, Any]
    repetitions: int
    min_time_s: float
    flags: list[str]
    input_names: list[str] = field(default_factory=list)  # the inputs' graph paths
    parameters: list[tuple[str, str]] = field(default_factory=list)  # (scope, archive)
    # Without a model: the inputs' (name, dtype, dims) and the file seeding them.
    signature: list[tuple[str, str, tuple[Any, ...]]] | None = None
    seed_file: str | None = None


def _write(path: str, result: dict[str, Any]) -> None:
    with atomic_output(path) as tmp:
        tmp.write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")


def _function(bench: Bench) -> str:
    from kiln.actions._runtime import bind_function

    found = bind_function(bench.module, bench.driver, None, bench.parameters)[1]
    return bench.function or found


def _measure(bench: Bench, function: str, input_dir: str, count: int) -> list[dict[str, Any]]:
    """Run iree-benchmark-module; return its per-repetition records."""
    cmd = [
        _devices.runtime_tool("iree-benchmark-module"),
        f"--module={bench.module}",
        f"--device={bench.driver}",
        f"--function={function}",
        *(f"--parameters={scope}={archive}" for scope, archive in bench.parameters),
        *(f"--input=@{os.path.join(input_dir, f'{i}.npy')}" for i in range(count)),
        f"--benchmark_repetitions={bench.repetitions}",
        "--benchmark_format=json",
        f"--benchmark_min_time={bench.min_time_s:g}s",
        *bench.flags,
    ]
    # Both streams go to files, not memory: the module may print without bound.
    out_path, err_path = os.path.join(input_dir, "out.json"), os.path.join(input_dir, "err.txt")
    with open(out_path, "wb") as out, open(err_path, "wb") as err:
        returncode = subprocess.run(cmd, stdout=out, stderr=err).returncode
    if returncode != 0:
        tail = read_tail(err_path if os.path.getsize(err_path) else out_path, max_lines=12)
        raise ToolError(f"iree-benchmark-module failed on {shown_path(bench.module)}:\n{tail}")
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
    import numpy as np

    from kiln.actions._reference import check_inputs

    head: dict[str, Any] = {
        "module": bench.module,
        "target": bench.target,
        "device": bench.driver,
        "machine": _devices.machine(),
        "runtime_version": _devices.runtime_version(),
        "repetitions": bench.repetitions,
        "min_time_s": bench.min_time_s,
        "flags": bench.flags,
    }
    reason = _devices.absent_device_reason(bench.driver)
    if reason is not None:
        _write(bench.result_path, {**head, "status": "skipped", "reason": reason})
        return
    args, how = check_inputs(
        bench.model,
        bench.inputs,
        bench.shapes,
        bench.input_names,
        signature=bench.signature,
        seed_file=bench.seed_file,
    )
    function = _function(bench)
    with tempfile.TemporaryDirectory(prefix="kiln-bench-") as tmp:
        for i, array in enumerate(args):
            np.save(os.path.join(tmp, f"{i}.npy"), array)
        runs = _measure(bench, function, tmp, len(args))
    if not runs:
        raise ToolError(f"iree-benchmark-module reported no runs for {shown_path(bench.module)}")
    samples = [float(r["real_time"]) * _TO_US[r.get("time_unit", "ns")] for r in runs]
    _write(
        bench.result_path,
        {
            **head,
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


class BenchmarkAction(BuildAction):
    """Times a compiled module in a worker, alone in the machine pool. Its key holds
    the module's digest, the device (driver and, for GPUs, the devices present),
    the flags, the repetitions and the machine (CPU model, count, architecture)."""

    pool = _devices.MACHINE_POOL
    exclusive = True
    reproducible = False  # it times this machine: never shared with another

    def __init__(
        self,
        *,
        bench: Bench,
        files: list[BuildFile],
        output_file: BuildFile,
        device: dict[str, Any],
        **kwargs: Any,
    ):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kwargs)
        self.bench = bench
        self.files = files
        self.output_file = output_file
        self.device = device
        self.machine = _devices.machine()
        self.runtime = _devices.runtime_version()
        self.deps.update(files)
        output_file.deps.add(self)

    def params(self) -> dict[str, Any] | None:
        out = super().params()
        if out is not None:
            b = self.bench
            out["bench"] = {
                "target": b.target,
                "driver": b.driver,
                "function": b.function,
                "shapes": b.shapes,
                "repetitions": b.repetitions,
                "min_time_s": b.min_time_s,
                "flags": b.flags,
                "inputs": len(b.inputs),
                "scopes": [scope for scope, _ in b.parameters],
                "signature": b.signature,
            }
        return out

    def _remotable_thunk(self) -> Callable[[], None]:
        return functools.partial(run_benchmark, self.bench)


def benchmark(
    *,
    name: str,
    module: BuildFile | str,
    inputs: Sequence[BuildFile | str] | None = None,
    repetitions: int = 5,
    model: BuildFile | str | None = None,
    shapes: Mapping[str, Any] | None = None,
    min_time_s: float = 0.1,
    flags: Sequence[str] = (),
    driver: str | None = None,
    function: str | None = None,
    parameters: Sequence[Any] | None = None,
) -> BuildFile:
    """Declare a benchmark of compiled ``module``; its JSON result goes to ``name``.

    ``inputs=None`` generates inputs from the ONNX ``model`` (default: the model the
    module was imported from), as ``verify`` does. Each of ``repetitions`` runs the
    function for at least ``min_time_s``; ``flags`` go to iree-benchmark-module. A
    module compiled from ``torch_export`` generates inputs from its example inputs.
    The module's parameter archives are loaded (``--parameters=SCOPE=FILE``): those of
    its program, or ``parameters`` (files, or ``(scope, file)`` pairs).
    """
    from kiln.actions._params import parameters_arg
    from kiln.actions._tensors import normalize_shapes
    from kiln.actions.torch_export import torch_exporter
    from kiln.actions.verify import module_target, source_model

    context = BuildContext.current()
    module_file = context.file(module)
    model_file = context.file(model) if model is not None else source_model(module_file)
    exporter = torch_exporter(module_file) if model_file is None else None
    input_files = context.files(list(inputs)) if inputs else []
    archives = parameters_arg(context, module_file, parameters, f"benchmark of {module_file.path}")
    if repetitions < 1 or min_time_s <= 0:
        raise BuildDefinitionError(
            f"benchmark of {module_file.path}: repetitions must be >= 1 and min_time_s > 0"
        )
    if not input_files and model_file is None and exporter is None:
        raise BuildDefinitionError(
            f"benchmark of {module_file.path}: generating inputs needs the ONNX model: pass "
            "inputs=[...] or model=..., or compile a module imported with onnx_import"
        )
    target, default_driver = module_target(module_file)
    driver = driver or default_driver
    output = context.allocate_file(name)
    bench = Bench(
        result_path=output.action_path,
        module=module_file.action_path,
        target=target or "its own target",
        driver=driver,
        function=function,
        model=model_file.action_path if model_file is not None and not input_files else None,
        inputs=[f.action_path for f in input_files],
        input_names=[f.path for f in input_files],
        shapes=normalize_shapes(shapes),
        repetitions=repetitions,
        min_time_s=min_time_s,
        flags=list(flags),
        parameters=[(scope, f.action_path) for scope, f in archives],
        signature=exporter.signature if exporter is not None else None,
        seed_file=exporter.weights.action_path if exporter is not None else None,
    )
    files = [module_file, *input_files, *(f for _, f in archives)]
    if model_file is not None and not input_files:
        files.append(model_file)
    if exporter is not None:
        files.append(exporter.weights)
    action = BenchmarkAction(
        bench=bench,
        files=files,
        output_file=output,
        device=_devices.device_key(driver, context.registry.get_context("")),
        desc=f"Benchmarking {module_file.path}",
        executor=context.executor,
    )
    ManifestMeta.get(module_file).benchmarks.append((action, output))
    return output
