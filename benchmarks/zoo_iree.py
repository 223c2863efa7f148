"""The zoo benchmark's models for upstream iree.build: ONNX import + compile.

iree.build has no source files, so a small action copies each model.onnx into
the build tree first. Build with the host CPU as target, as kiln's ``cpu`` does:

    python -m iree.build benchmarks/zoo_iree.py MODEL... --output-dir DIR \\
        --iree-hal-target-device=llvm-cpu --iree-llvmcpu-target-cpu=host
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from iree.build import compile, entrypoint, onnx_import
from iree.build.executor import BuildAction, BuildContext, BuildFile

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _zoo_models import zoo_models  # noqa: E402


class CopyModelAction(BuildAction):
    """Copies a model from the source tree into the build tree."""

    def __init__(self, *, model: str, output: BuildFile, **kwargs: Any):
        super().__init__(**kwargs)
        self.model = model
        self.output = output
        output.deps.add(self)

    def _invoke(self) -> None:
        shutil.copyfile(self.model, self.output.get_fs_path())


def _model_build(name: str, model: str) -> Callable[[], Any]:
    def build() -> Any:
        context = BuildContext.current()
        onnx_file = context.allocate_file("model.onnx")
        CopyModelAction(
            model=model, output=onnx_file, desc=f"Copying {model}", executor=context.executor
        )
        mlir = onnx_import(name=f"{name}.mlir", source=onnx_file)
        return compile(name=name, source=mlir)

    build.__name__ = name
    return build


for _name, _model in zoo_models():
    globals()[_name] = entrypoint(_model_build(_name, _model))
