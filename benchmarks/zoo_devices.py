"""Benchmark-only kiln build of zoo models for a host CPU and a device: ONNX import,
compile for ``cpu`` and for ``cuda:sm_89``, then verify each module against the
model's ``test_data_set_0`` and benchmark it. The CPU checks run anywhere; the
CUDA checks need a ``cuda:sm_89`` device (derived from the compile target), so on
a Dask cluster they go only to the worker that advertises one, and where there is
none (this machine, or a stand-in device) they are skipped:

    kiln build benchmarks/zoo_devices.py MODEL... --output-dir DIR -j 2

The models are read from the JSON file named by ``KILN_BENCH_ZOO_DEVICES`` (``[name,
model, inputs, outputs]`` each), written by ``_dask_devices.py``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from kiln import benchmark, compile, entrypoint, onnx_import, source_file, verify
from kiln.graph import BuildFile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _devices_row import ZOO_ENV  # noqa: E402

TARGETS = ("cpu", "cuda:sm_89")
FLAGS = ("--iree-input-demote-f64-to-f32=false",)  # as examples/model_zoo.py


def _model_build(
    name: str, model: str, inputs: list[str], outputs: list[str]
) -> Callable[[], list[BuildFile]]:
    def build() -> list[BuildFile]:
        data = [source_file(p, name=f"data/{Path(p).name}") for p in inputs]
        expected = [source_file(p, name=f"data/{Path(p).name}") for p in outputs]
        mlir = onnx_import(name=f"{name}.mlir", source=source_file(model, name="model.onnx"))
        modules = compile(name=name, source=mlir, targets=list(TARGETS), flags=FLAGS)
        checks = []
        for target, module in zip(TARGETS, modules, strict=True):
            label = target.replace(":", "-")
            checks.append(
                verify(
                    name=f"verify_{label}.json",
                    module=module,
                    inputs=data,
                    expected=expected,
                    rtol=1e-3,
                    atol=1e-4,
                )
            )
            checks.append(
                benchmark(
                    name=f"bench_{label}.json",
                    module=module,
                    inputs=data,
                    repetitions=3,
                    min_time_s=0.01,
                )
            )
        return [mlir, *modules, *checks]

    build.__name__ = name
    build.__doc__ = f"import, compile (cpu, cuda:sm_89), verify and benchmark {model}"
    return build


def _listing() -> list[tuple[str, str, list[str], list[str]]]:
    with open(os.environ[ZOO_ENV], encoding="utf-8") as f:
        return [(n, m, list(i), list(o)) for n, m, i, o in json.load(f)]


for _name, _model, _inputs, _outputs in _listing():
    globals()[_name] = entrypoint(_model_build(_name, _model, _inputs, _outputs))
