"""``onnx_import``: ONNX model -> MLIR for the IREE compiler, out of process; with
``params=...`` the weights go into a parameter archive beside it."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

from kiln.actions._compiler import compiler_version
from kiln.actions._devices import MACHINE_POOL
from kiln.actions._onnx_import import import_onnx
from kiln.actions._onnx_params import import_onnx_params
from kiln.actions.iree import CompileSourceMeta
from kiln.actions.params import Params, ParamsMeta, allocate_archive, params_spec
from kiln.graph import ActionConcurrency, BuildAction, BuildContext, BuildFile
from kiln.planning.code_key import distribution_version


class ImportOnnxAction(BuildAction):
    """Imports ``input_file`` (ONNX) to MLIR at ``output_file``; with
    ``opset_version`` the model is first upgraded to that opset. ``data_files`` are
    the model's external-data files (inputs, keyed by content); with ``params`` its
    weights go to ``archive`` (a second output) and the MLIR names them."""

    # 2: the program is upstream's byte for byte (its IR version, its last blank
    # line); an import cached before is not.
    VERSION = 2
    pool = MACHINE_POOL
    # Whose versions the key holds (the importer is iree-base-compiler's, the opset
    # upgrade onnx's): a Dask worker must have the same.
    keyed_tools = ("iree-base-compiler", "onnx")

    def __init__(
        self,
        *,
        input_file: BuildFile,
        output_file: BuildFile,
        opset_version: int | None,
        data_files: Sequence[BuildFile] = (),
        params: Params | None = None,
        archive: BuildFile | None = None,
        **kwargs: Any,
    ):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kwargs)
        self.input_file = input_file
        self.output_file = output_file
        self.opset_version = opset_version
        self.data_files = list(data_files)
        self.param_spec = params
        self.archive = archive
        self.deps.update([input_file, *self.data_files])
        output_file.deps.add(self)
        if archive is not None and params is not None:
            archive.deps.add(self)
            ParamsMeta.get(output_file).archives.append((params.scope, archive))
        CompileSourceMeta.get(output_file).input_type = "onnx"

    def params(self) -> dict[str, Any] | None:
        """Its attributes, and the versions of the importer (iree-base-compiler's)
        and of onnx (its opset converter): another may write another program."""
        out = super().params()
        if out is not None:
            out["importer_version"] = compiler_version()
            out["onnx_version"] = distribution_version("onnx") or ""
        return out

    def _remotable_thunk(self) -> Callable[[], None]:
        return self.sandbox_thunk(lambda f: f.action_path)

    def sandbox_thunk(self, path: Callable[[BuildFile], str]) -> Callable[[], None]:
        """The thunk with its files at ``path(file)`` (a remote sandbox's, or here)."""
        data = [path(f) for f in self.data_files]
        if self.param_spec is not None and self.archive is not None:
            return functools.partial(
                import_onnx_params,
                path(self.input_file),
                path(self.output_file),
                path(self.archive),
                self.opset_version,
                self.param_spec.scope,
                self.param_spec.threshold,
                data,
            )
        return functools.partial(
            import_onnx, path(self.input_file), path(self.output_file), self.opset_version, data
        )


def onnx_import(
    *,
    name: str,
    source: BuildFile | str,
    opset_version: int | None = 17,
    upgrade: bool | None = None,
    params: Params | bool | dict[str, Any] | None = None,
    external_data: Sequence[BuildFile | str] = (),
) -> BuildFile:
    """Declare the import of ONNX ``source`` into the MLIR file ``name``.

    ``opset_version=None`` keeps the model's opset. ``upgrade=False`` is the
    ``iree.build`` spelling of the same. ``external_data`` are the files the model
    keeps weights in (a model naming another file is refused: kiln must key it).
    ``params=True`` (or ``Params(scope=, threshold=)``, or a dict of those) writes the
    weights to ``params/<entrypoint>/<stem>.irpa``, which ``compile``, ``verify`` and
    ``benchmark`` then find by themselves.
    """
    context = BuildContext.current()
    if upgrade is False:
        opset_version = None
    input_file = context.file(source)
    spec = params_spec(params, f"onnx_import of {name}")
    output_file = context.allocate_file(name)
    archive = allocate_archive(context, name) if spec is not None else None
    ImportOnnxAction(
        input_file=input_file,
        output_file=output_file,
        opset_version=opset_version,
        data_files=context.files(list(external_data)) if external_data else [],
        params=spec,
        archive=archive,
        desc=f"Importing ONNX {name} -> {output_file}",  # iree.build's words
        executor=context.executor,
    )
    return output_file
