"""The reference side of a check, run inside worker processes: an ONNX model's input
signature, the inputs a check uses (given files or generated), and the model's
outputs computed by onnxruntime.

onnxruntime runs the source model as it is, on the CPU, with graph optimizations
off so that the reference computes what the model says. Only when onnxruntime
cannot load it (it has no kernels for the oldest opsets, e.g. AveragePool-1) is
the model upgraded to the opset its ``onnx_import`` used (default 17) and run
again.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kiln.actions._logs import shown_path
from kiln.actions._tensors import (
    InputSpec,
    file_seed,
    generate_inputs,
    load_bundle,
    load_tensor,
    save_bundle,
)
from kiln.actions.output_record import tensor_sha256
from kiln.base.errors import ToolError, ToolMissing
from kiln.output_dir.writing import atomic_output
from kiln.planning.code_key import distribution_version

if TYPE_CHECKING:
    import numpy as np

    from kiln.actions._runtime import RunSpec
    from kiln.graph import BuildContext


def _short(error: BaseException, max_chars: int = 500) -> str:
    text = " ".join(str(error).strip().split())
    return text if len(text) <= max_chars else text[: max_chars - 3] + "..."


@functools.cache
def onnxruntime_version() -> str:
    """The installed onnxruntime's version (part of reference keys), read once per
    process: reading a distribution's metadata costs milliseconds, and every
    reference action of a build asks."""
    version = distribution_version("onnxruntime")
    if version is None:
        raise ToolMissing("onnxruntime is not installed (pip install 'kiln[iree]')")
    return version


def _load_model(path: str) -> Any:
    import onnx

    try:
        return onnx.load(path, load_external_data=False)
    except Exception as e:
        raise ToolError(f"cannot read ONNX model {shown_path(path)}: {_short(e)}") from e


def model_signature(path: str) -> list[InputSpec]:
    """The model's inputs in call order: graph inputs that are not initializers."""
    from onnx import helper

    graph = _load_model(path).graph
    initializers = {i.name for i in graph.initializer}
    specs = []
    for value in graph.input:
        if value.name in initializers:
            continue
        kind = value.type.WhichOneof("value")
        if kind != "tensor_type":
            where = shown_path(path)
            raise ToolError(
                f"cannot generate input {value.name!r} of {where}: it is a {kind}, not a tensor"
            )
        tensor = value.type.tensor_type
        dtype = str(helper.tensor_dtype_to_np_dtype(tensor.elem_type))
        dims: list[int | str | None] = []
        for d in tensor.shape.dim:
            which = d.WhichOneof("value")
            dims.append(d.dim_value if which == "dim_value" else d.dim_param or None)
        specs.append(InputSpec(value.name, _dtype_name(tensor.elem_type, dtype), tuple(dims)))
    return specs


def _dtype_name(elem_type: int, numpy_name: str) -> str:
    """numpy's name for an ONNX element type; ml_dtypes' names for bfloat16 and float8s."""
    from onnx import TensorProto

    special: dict[int, str] = {
        TensorProto.BFLOAT16: "bfloat16",
        TensorProto.FLOAT8E4M3FN: "float8_e4m3fn",
    }
    return special.get(elem_type, numpy_name)


def output_names(path: str) -> list[str]:
    return [o.name for o in _load_model(path).graph.output]


def check_inputs(
    model: str | None,
    inputs: Sequence[str],
    shapes: Mapping[str, Any],
    names: Sequence[str] | None = None,
    *,
    signature: Sequence[tuple[str, str, tuple[Any, ...]]] | None = None,
    seed_file: str | None = None,
) -> tuple[list[np.ndarray], dict[str, Any]]:
    """The arrays a check runs on, and how they were made (recorded in its result):
    the given files (by their ``names`` in the build, which do not depend on where
    it is, else their paths), else inputs generated from ``model``'s signature, or
    from ``signature`` ((name, dtype, dims) per input) seeded by ``seed_file``."""
    if inputs:
        files = list(names) if names else list(inputs)
        # ``paths``: where they were read, relative to the output directory (or the
        # sandbox laid out as it): ``kiln compare --measure`` reads them there again.
        arrays = [load_tensor(p) for p in inputs]
        # ``sha256``: what they held, so that two builds' checks pair on the same data,
        # not on the same names (``kiln.compare.outputs``).
        how: dict[str, Any] = {
            "source": "given",
            "files": files,
            "paths": list(inputs),
            "sha256": [tensor_sha256(a) for a in arrays],
        }
        return arrays, how
    if signature is not None and seed_file is not None:
        specs = [InputSpec(name, dtype, tuple(dims)) for name, dtype, dims in signature]
        seed = file_seed(seed_file)
    elif model is not None:
        specs, seed = model_signature(model), file_seed(model)
    else:
        raise ToolError("no inputs given and no ONNX model to generate them from")
    arrays, chosen = generate_inputs(specs, seed, shapes)
    how = {"source": "generated", "seed": seed, "shapes": chosen}
    if model is not None and signature is None:
        how["model"] = model  # relative to the output directory, as ``paths`` above
    return arrays, how


def run_inputs(run: RunSpec) -> tuple[list[np.ndarray], dict[str, Any]]:
    """``check_inputs`` for a verify's or a benchmark's run: given, else generated."""
    return check_inputs(
        run.model,
        run.inputs,
        run.shapes,
        run.input_names,
        signature=run.loads.signature,
        seed_file=run.loads.seed_file,
    )


_FATAL_ONLY = 4  # onnxruntime's severities: 0 verbose ... 3 error, 4 fatal


def _session(model: str | bytes, where: str) -> Any:
    import onnxruntime as ort

    # onnxruntime logs what it raises (errors in red, with escape sequences) on the
    # worker's stderr, which is the user's terminal: its exception says it all, and
    # reaches the console escaped, in the action's failure.
    ort.set_default_logger_severity(_FATAL_ONLY)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = _FATAL_ONLY
    try:
        return ort.InferenceSession(model, options, providers=["CPUExecutionProvider"])
    except Exception as e:
        raise ToolError(f"onnxruntime cannot load {where}: {_short(e)}") from e


def _upgraded(model: str, opset: int) -> bytes:
    """``model`` converted to ``opset`` (as onnx_import does), serialized."""
    import onnx

    try:
        converted = onnx.version_converter.convert_version(_load_model(model), opset)
        converted.ir_version = max(converted.ir_version, 4)
        return bytes(converted.SerializeToString())
    except Exception as e:
        raise ToolError(f"cannot upgrade {shown_path(model)} to opset {opset}: {_short(e)}") from e


def run_onnxruntime(
    model: str, args: Sequence[Any], upgrade_to: int | None = None
) -> tuple[list[np.ndarray], int | None]:
    """The outputs of ``model`` on ``args``, computed by onnxruntime on the CPU, and
    the opset the model was upgraded to (None: run as it is). onnxruntime has no
    kernels for the oldest opsets: such a model is upgraded to ``upgrade_to``."""
    import numpy as np

    upgraded = None
    try:
        session = _session(model, model)
    except ToolError as first:
        if upgrade_to is None:
            raise
        try:
            session, upgraded = _session(_upgraded(model, upgrade_to), model), upgrade_to
        except ToolError:
            raise first from None
    names = [i.name for i in session.get_inputs()]
    if len(names) != len(args):
        raise ToolError(f"{shown_path(model)} takes {len(names)} inputs {names}, given {len(args)}")
    try:
        outputs = session.run(None, dict(zip(names, args, strict=True)))
    except Exception as e:
        raise ToolError(f"onnxruntime cannot run {shown_path(model)}: {_short(e)}") from e
    return [np.asarray(o) for o in outputs], upgraded


def write_reference(
    model: str, inputs: list[str], shapes: dict[str, Any], output: str, upgrade_to: int | None
) -> None:
    """Worker side of the onnxruntime reference: its outputs, in order, to ``output``."""
    args, _ = check_inputs(model, inputs, shapes)
    outputs, _ = run_onnxruntime(model, args, upgrade_to)
    with atomic_output(output) as tmp:
        save_bundle(str(tmp), outputs)


def read_reference(path: str) -> list[np.ndarray]:
    return load_bundle(path)


def reference_name(context: BuildContext, model_path: str, kind: str, key: str) -> str:
    """The name, in ``context``, of a model's reference outputs computed by ``kind``
    (``onnxruntime``, ``torch``) on the inputs ``key`` stands for: ``model.KIND.npz``
    for the first inputs declared, ``model.KIND-<digest of the inputs>.npz`` for
    others (the same inputs give the same name in every build)."""
    stem = model_path.rsplit("/", 1)[-1].rsplit(".", 1)[0]
    base = f"{context.path}/{stem}" if context.path else stem
    name = f"{stem}.{kind}.npz"
    if f"{base}.{kind}.npz" in context.registry.all:
        digest = hashlib.sha256(key.encode()).hexdigest()[:12]
        name = f"{stem}.{kind}-{digest}.npz"
    return name
