"""Importing an ONNX model to MLIR (torch-mlir's ONNX form) with the importer that
ships in iree-base-compiler, run inside a worker process. Plain values in and
out, so it pickles cheaply; onnx and iree are imported on first use, once, by the
worker template (not by each worker)."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from kiln.actions._logs import short_diagnostic, shown_path
from kiln.base.errors import ToolError
from kiln.execution.process.template import template_modules
from kiln.output_dir.ownership import open_regular
from kiln.output_dir.writing import atomic_write


def uses_external(tensor: Any) -> bool:
    """Whether the initializer ``tensor`` keeps its data in another file."""
    return bool(tensor.HasField("data_location") and tensor.data_location == 1)


def external_locations(model: Any, source: str) -> dict[str, str]:
    """Each initializer stored outside the model: its name -> the path of its data
    file, as the worker names it (relative to where it runs)."""
    from onnx.external_data_helper import ExternalDataInfo

    base = os.path.dirname(source)
    found = {}
    for tensor in model.graph.initializer:
        if uses_external(tensor):
            location = ExternalDataInfo(tensor).location
            found[tensor.name] = os.path.normpath(os.path.join(base, location))
    return found


def check_declared(model: Any, source: str, data_files: Sequence[str]) -> dict[str, str]:
    """``external_locations``, each of which must be a declared input; a ToolError
    naming the file and the fix otherwise."""
    declared = {os.path.normpath(p) for p in data_files}
    locations = external_locations(model, source)
    for path in sorted(set(locations.values())):
        if path not in declared:
            raise ToolError(
                f"ONNX model {shown_path(source)} keeps weights in "
                f"{os.path.basename(path)!r}, which the build does not declare: pass it to "
                "onnx_import(..., external_data=[...]) so that kiln keys it"
            )
    return locations


def read_range(path: str, offset: int, length: int | None) -> bytes:
    """``length`` bytes (all the rest when None) of ``path`` from ``offset``; a
    ToolError when the file is shorter, NotRegularFile when it is no regular file
    (a link is followed: a source file's, in ``.kiln/src``, is one)."""
    with os.fdopen(open_regular(path, follow=True), "rb") as f:
        size = os.fstat(f.fileno()).st_size
        length = size - offset if length is None else length
        if offset < 0 or length < 0 or offset + length > size:
            raise ToolError(
                f"external data range {offset}+{length} lies outside {shown_path(path)}"
            )
        f.seek(offset)
        return f.read(length)


def load_external(model: Any, locations: dict[str, str]) -> None:
    """Read each external initializer's bytes into the model (``locations``: name ->
    data file). kiln reads them itself: onnx refuses a data file reached through a
    link, as a source file is (``.kiln/src``)."""
    for tensor in model.graph.initializer:
        where = locations.get(tensor.name)
        if where is not None:
            load_tensor_data(tensor, where)


def load_tensor_data(tensor: Any, where: str) -> None:
    """Read an external initializer's bytes from its data file ``where`` into it."""
    from onnx import TensorProto
    from onnx.external_data_helper import ExternalDataInfo

    info = ExternalDataInfo(tensor)
    length = int(info.length) if info.length is not None else None
    tensor.raw_data = read_range(where, int(info.offset or 0), length)
    tensor.data_location = TensorProto.DEFAULT
    del tensor.external_data[:]


def _opset(model: Any) -> int:
    """The opset an upgrade is measured against: the first one the model lists, as
    ``iree-import-onnx`` measures it (usually the default domain's; a model that
    lists another domain first is converted, even down, as upstream converts it);
    0 when it lists none."""
    return int(model.opset_import[0].version) if model.opset_import else 0


def _loose_initializers(model: Any) -> set[str]:
    """The initializers that are not graph inputs (which IR versions below 4 forbid)."""
    inputs = {i.name for i in model.graph.input}
    return {t.name for t in model.graph.initializer if t.name not in inputs}


def upgrade(model: Any, opset_version: int | None) -> Any:
    """``model`` upgraded to ``opset_version`` when that is newer than its opset, as
    ``iree-import-onnx --opset-version`` upgrades it: the IR version stays what the
    converter leaves, so the program's ``torch.onnx_meta.ir_version`` is upstream's.
    One departure, where upstream fails: the converter can turn an attribute into an
    initializer (Pad's ``pads``) that IR versions below 4 also want as a graph input,
    which the checker then refuses; only then is the IR version raised to 4, which
    drops that rule and means the same here."""
    import onnx

    if not opset_version or opset_version <= _opset(model):
        return model
    loose = _loose_initializers(model)
    model = onnx.version_converter.convert_version(model, opset_version)
    if model.ir_version < 4 and _loose_initializers(model) - loose:
        model.ir_version = 4
    return model


def _infer_shapes(model: Any, source: str) -> Any:
    """Check the model and infer shapes, which the importer needs for typed tensors."""
    import onnx

    try:
        onnx.checker.check_model(model)
    except ValueError:
        # Over protobuf's 2 GB in-memory limit: infer through files instead (from
        # `source` as is, so without opset upgrades, like upstream iree-import-onnx).
        with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(source))) as tmp:
            inferred = os.path.join(tmp, "inferred.onnx")
            onnx.shape_inference.infer_shapes_path(source, inferred, data_prop=True)
            model = onnx.load(inferred, load_external_data=False)
        onnx.load_external_data_for_model(model, os.path.dirname(os.path.abspath(source)))
        return model
    return onnx.shape_inference.infer_shapes(model, data_prop=True)


def read_model(source: str, data_files: Sequence[str]) -> tuple[Any, dict[str, str]]:
    """The ONNX model at ``source`` without its external data, and where its external
    initializers are (``check_declared``); a ToolError naming it when it cannot be
    read."""
    import onnx

    try:
        model = onnx.load(source, load_external_data=False)
    except Exception as e:
        raise ToolError(
            f"cannot read ONNX model {shown_path(source)}: {short_diagnostic(e)}"
        ) from e
    return model, check_declared(model, source, data_files)


@contextmanager
def model_errors(source: str, saying: str) -> Iterator[None]:
    """Any error raised inside becomes a ToolError: ``saying`` (``invalid ONNX
    model`` while checking, upgrading and inferring shapes; ``cannot import ONNX
    model`` while importing), the model at ``source``, and the error."""
    try:
        yield
    except Exception as e:
        raise ToolError(f"{saying} {shown_path(source)}: {short_diagnostic(e)}") from e


def _load_onnx(source: str, opset_version: int | None, data_files: Sequence[str] = ()) -> Any:
    """Load (with its external data, which must be among ``data_files``), optionally
    upgrade, check and shape-infer an ONNX model."""
    model, locations = read_model(source, data_files)
    if locations:
        load_external(model, locations)
    with model_errors(source, "invalid ONNX model"):
        if not model.graph.name:  # the checker rejects it; the function needs a name
            model.graph.name = "main_graph"
        return _infer_shapes(upgrade(model, opset_version), source)


@template_modules("onnx", "iree.compiler.extras.onnx_importer", "iree.compiler.ir")
def import_onnx(
    source: str, output: str, opset_version: int | None, data_files: Sequence[str] = ()
) -> None:
    """Import an ONNX model to MLIR (torch-mlir ONNX form) at exactly `output`.

    The function is named after the ONNX graph ("main_graph" when unnamed); with
    `opset_version` the model is first upgraded, which can help shape inference.
    """
    from iree.compiler.extras import onnx_importer
    from iree.compiler.ir import Context

    model = _load_onnx(source, opset_version, data_files)
    with model_errors(source, "cannot import ONNX model"):
        info = onnx_importer.ModelInfo(model)
        module = info.create_module(context=Context()).operation
        onnx_importer.NodeImporter.define_function(info.main_graph, module).import_all()
        module.verify()
    write_program(module, output)


def write_program(module: Any, output: str) -> None:
    """Write the imported ``module`` at ``output`` as ``iree-import-onnx`` writes it
    (its text, then a blank line), printed straight to the file."""
    with atomic_write(output, "w") as f:
        module.print(file=f, assume_verified=True)
        f.write("\n")
