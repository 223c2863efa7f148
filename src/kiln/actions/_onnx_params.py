"""Importing an ONNX model with its weights moved into a parameter archive, inside a
worker process.

The model is read without its external data: the graph alone is checked, upgraded
and shape-inferred, so the importer's memory does not grow with the weights. Each
weight kept in the program is read when it is imported; each weight that goes to
the archive is handed to IREE's archive writer as a (file, offset, length) range of
its external-data file, so that the archive is written by streaming from disk, never
through Python memory (weights stored inside the ``.onnx`` are in memory already and
are added from there).

The program names each archived weight ``#stream.parameter.named<SCOPE::NAME>``
(NAME: the initializer's name, ``:`` written ``_``). Which weights go to the
archive is `kiln.actions.params.Params`'s rule; with the default every
floating-point weight goes, so the program text is a function of the architecture
alone. An external-data file the model names must be one of the import's declared
inputs (``data_files``): a file kiln does not know of could change without
rerunning the import.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any

from kiln.actions._logs import shown_path
from kiln.actions._onnx_import import (
    load_tensor_data,
    model_errors,
    read_model,
    upgrade,
    uses_external,
    write_program,
)
from kiln.base.errors import ToolError
from kiln.execution.process.template import template_modules
from kiln.output_dir.ownership import open_regular
from kiln.output_dir.writing import atomic_output

# ONNX element types whose external bytes are exactly what the archive holds.
_RAW_TYPES = frozenset({1, 2, 3, 4, 5, 6, 7, 9, 10, 11, 12, 13, 16, 17, 18, 19, 20})
_FLOAT_TYPES = frozenset({1, 10, 11, 14, 15, 16, 17, 18, 19, 20})


def _load_graph(
    source: str, opset_version: int | None, data_files: Sequence[str]
) -> tuple[Any, dict[str, str]]:
    """The model without its external data, upgraded to ``opset_version`` when newer,
    checked and shape-inferred; and where its external initializers are
    (``check_declared``)."""
    import onnx

    model, locations = read_model(source, data_files)
    with model_errors(source, "invalid ONNX model"):
        if not locations:  # the checker would look for external data from here
            onnx.checker.check_model(model)
        if not model.graph.name:
            model.graph.name = "main_graph"
        model = upgrade(model, opset_version)
        return onnx.shape_inference.infer_shapes(model, data_prop=True), locations


def _element_count(tensor: Any) -> int:
    count = 1
    for d in tensor.dims:
        count *= d
    return count


def archived(tensor: Any, threshold: int | None) -> bool:
    """Whether the initializer goes to the archive (`Params`'s rule)."""
    if threshold is None:
        return tensor.data_type in _FLOAT_TYPES
    return _element_count(tensor) >= threshold


def _importer_class() -> Any:
    """IREE's externalizing importer, deciding by `archived` and reading the data of
    a weight kept in the program only when it imports it."""
    import onnx
    from iree.compiler.extras import onnx_importer
    from iree.compiler.tools.import_onnx.importer_externalization_overrides import (
        IREENodeImporter,
    )

    class KilnNodeImporter(IREENodeImporter):  # type: ignore[misc]  # iree is untyped
        kiln_threshold: int | None = None
        kiln_base = "."
        kiln_locations: dict[str, str] = {}

        def import_initializer(self, initializer: Any, extern_name: str | None = None) -> Any:
            # A Constant node's value (named by ``extern_name``) stays in the program.
            if isinstance(initializer, onnx.TensorProto) and (
                extern_name is not None or not archived(initializer, self.kiln_threshold)
            ):
                if uses_external(initializer):
                    load_tensor_data(initializer, self.kiln_locations[initializer.name])
                return onnx_importer.NodeImporter.import_initializer(self, initializer, extern_name)
            return super().import_initializer(initializer, extern_name)

    return KilnNodeImporter


@template_modules(
    "onnx",
    "iree.compiler.extras.onnx_importer",
    "iree.compiler.ir",
    "iree.compiler.tools.import_onnx.importer_externalization_overrides",
    "iree.runtime",
)
def import_onnx_params(
    source: str,
    output: str,
    archive: str,
    opset_version: int | None,
    scope: str,
    threshold: int | None,
    data_files: Sequence[str],
) -> None:
    """Import ``source`` to MLIR at ``output``, its weights (by `archived`) in the
    parameter archive ``archive`` under ``scope``."""
    from iree.compiler.extras import onnx_importer
    from iree.compiler.ir import Context
    from iree.compiler.tools.import_onnx.importer_externalization_overrides import ParamData

    model, locations = _load_graph(source, opset_version, data_files)
    importer = _importer_class()
    importer.kiln_threshold = threshold
    importer.kiln_base = os.path.dirname(source) or "."
    importer.kiln_locations = locations
    with model_errors(source, "cannot import ONNX model"):
        info = onnx_importer.ModelInfo(model)
        module = info.create_module(context=Context()).operation
        data = ParamData(None, 0, scope, importer.kiln_base, archive, None)
        imp = importer.define_function(info.main_graph, module, data)
        # define_function builds IREE's own class whatever it is called on.
        imp.__class__ = importer
        imp.import_all()
        module.verify()
    write_program(module, output)
    tensors = [(symbol, info.main_graph.initializer_map[name]) for name, symbol in imp.globals]
    write_archive(archive, tensors, locations)


def write_archive(path: str, tensors: Sequence[tuple[str, Any]], locations: dict[str, str]) -> None:
    """Write the parameter archive ``path``: each (key, TensorProto), in order; an
    external tensor of a plain dtype is streamed from its file (``locations``)."""
    import iree.runtime as rt
    from onnx import numpy_helper
    from onnx.external_data_helper import ExternalDataInfo

    index = rt.ParameterIndex()
    with ExitStack() as stack:
        handles: dict[str, Any] = {}
        for key, tensor in tensors:
            where = locations.get(tensor.name)
            if where is not None and tensor.data_type in _RAW_TYPES:
                if where not in handles:
                    handles[where] = stack.enter_context(_file_handle(where))
                handle, size = handles[where]
                info = ExternalDataInfo(tensor)
                offset = int(info.offset or 0)
                length = int(info.length) if info.length is not None else size - offset
                if offset + length > size:
                    raise ToolError(
                        f"weight {tensor.name!r} lies past the end of {shown_path(where)}"
                    )
                index.add_from_file_handle(key, handle, length, offset)
            else:
                if where is not None:  # a packed dtype: unpacked as IREE's importer does
                    original, tensor = tensor, type(tensor)()
                    tensor.CopyFrom(original)
                    load_tensor_data(tensor, where)
                index.add_buffer(key, numpy_helper.to_array(tensor))
        with atomic_output(path) as tmp:
            index.create_archive_file(str(tmp))
            os.chmod(tmp, 0o644)


@contextmanager
def _file_handle(path: str) -> Iterator[tuple[Any, int]]:
    """An IREE file handle reading ``path``, and the file's size; NotRegularFile when
    it is no regular file (a link is followed: a source file's is one)."""
    import iree.runtime as rt

    fd = open_regular(path, follow=True)
    try:
        yield rt.FileHandle.wrap_fd(fd, readable=True, writable=False), os.fstat(fd).st_size
    finally:
        os.close(fd)
