"""``onnx_import``: ONNX model -> MLIR for the IREE compiler, out of process."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from kiln.actions._devices import MACHINE_POOL
from kiln.actions._onnx_import import import_onnx
from kiln.actions.iree import CompileSourceMeta
from kiln.graph import ActionConcurrency, BuildAction, BuildContext, BuildFile


class ImportOnnxAction(BuildAction):
    """Imports ``input_file`` (ONNX) to MLIR at ``output_file``; with
    ``opset_version`` the model is first upgraded to that opset."""

    pool = MACHINE_POOL

    def __init__(
        self,
        *,
        input_file: BuildFile,
        output_file: BuildFile,
        opset_version: int | None,
        **kwargs: Any,
    ):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kwargs)
        self.input_file = input_file
        self.output_file = output_file
        self.opset_version = opset_version
        self.deps.add(input_file)
        output_file.deps.add(self)
        CompileSourceMeta.get(output_file).input_type = "onnx"

    def _remotable_thunk(self) -> Callable[[], None]:
        return self.sandbox_thunk(lambda f: f.action_path)

    def sandbox_thunk(self, path: Callable[[BuildFile], str]) -> Callable[[], None]:
        """The thunk with its files at ``path(file)`` (a remote sandbox's, or here)."""
        return functools.partial(
            import_onnx, path(self.input_file), path(self.output_file), self.opset_version
        )


def onnx_import(
    *,
    name: str,
    source: BuildFile | str,
    opset_version: int | None = 17,
    upgrade: bool | None = None,
) -> BuildFile:
    """Declare the import of ONNX ``source`` into the MLIR file ``name``.

    ``opset_version=None`` keeps the model's opset. ``upgrade=False`` is the
    ``iree.build`` spelling of the same.
    """
    context = BuildContext.current()
    if upgrade is False:
        opset_version = None
    input_file = context.file(source)
    output_file = context.allocate_file(name)
    ImportOnnxAction(
        input_file=input_file,
        output_file=output_file,
        opset_version=opset_version,
        desc=f"Importing ONNX {name} -> {output_file}",  # iree.build's words
        executor=context.executor,
    )
    return output_file
