"""Benchmark-only kiln build of zoo models: ONNX import + compile for the host CPU.

The same stages as ``zoo_iree.py`` builds with upstream iree.build (the model-zoo
example also compiles for vmvx and verifies, which upstream cannot do). Each model
is an entrypoint named as in ``examples/model_zoo.py``:

    kiln build benchmarks/zoo_kiln.py MODEL... --output-dir DIR -j 2
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from kiln import compile, entrypoint, onnx_import, source_file
from kiln.graph import BuildFile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _zoo_models import zoo_models  # noqa: E402


def _model_build(name: str, model: str) -> Callable[[], list[BuildFile]]:
    def build() -> list[BuildFile]:
        onnx_file = source_file(model, name="model.onnx")
        mlir = onnx_import(name=f"{name}.mlir", source=onnx_file)
        return compile(name=name, source=mlir, targets=["cpu"])

    build.__name__ = name
    build.__doc__ = f"import + compile (cpu) of {model}"
    return build


for _name, _model in zoo_models():
    globals()[_name] = entrypoint(_model_build(_name, _model))
