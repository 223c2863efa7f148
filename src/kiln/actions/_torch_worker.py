"""The worker side of ``torch_export``: make the model, digest its weights, export it
with iree-turbine, and run it in eager PyTorch for ``verify(reference="torch")``.

Plain values in, so the calls pickle into worker processes; torch and iree-turbine
are imported in the worker template once per build (``template_modules``), never in
kiln's own process. Every call makes the model the same way (``make_model``): the
random generators seeded with 0, the factory called with the declared weight files'
paths, the module put in eval mode. Each call checks that the weights it got are
those the build keyed (``check_weights``): a factory that gives other weights on
every call (unseeded, or reading a file it was not given) fails, and says so.
The files a factory opens for reading that it was not given (a checkpoint at a
path of its own) are recorded with the action's result and checked on the next
build (``kiln.base.reached.watching_opens``, ``kiln.planning.run_deps``): a new checkpoint there
reruns the weights' digest, and so the export; where nothing records them (a
factory called outside kiln's worker), the call fails naming the file.
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import tempfile
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from kiln.actions._logs import short_diagnostic
from kiln.base.errors import ToolError
from kiln.base.reached import watching_opens
from kiln.execution.process.template import template_modules
from kiln.output_dir.ownership import read_regular
from kiln.output_dir.writing import atomic_output, atomic_write

if TYPE_CHECKING:
    import numpy as np

WEIGHTS_FORMAT = "kiln-torch-weights/1"
Signature = Sequence[tuple[str, str, tuple[Any, ...]]]


def _scratch_caches() -> None:
    """Point torch's on-disk caches into the worker's scratch directory (``TMPDIR``,
    which kiln gives every worker), never the user's home."""
    scratch = tempfile.gettempdir()
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(scratch, "torchinductor"))
    os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(scratch, "triton"))


def resolve_factory(factory: Callable[..., Any] | str) -> Callable[..., Any]:
    """The factory itself, or the one a ``"package.module:name"`` spec names."""
    if callable(factory):
        return factory
    module_name, _, attr = factory.partition(":")
    try:
        found: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            found = getattr(found, part)
    except Exception as e:
        raise ToolError(f"cannot load the model factory {factory!r}: {short_diagnostic(e)}") from e
    if not callable(found):
        raise ToolError(f"the model factory {factory!r} is not callable")
    made: Callable[..., Any] = found
    return made


def make_model(factory: Callable[..., Any] | str, weight_files: Sequence[str]) -> Any:
    """Seed the generators, call the factory with the weight files' paths, and
    return the module in eval mode."""
    import random

    import numpy as np
    import torch

    _scratch_caches()
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    make = resolve_factory(factory)
    try:
        with watching_opens(weight_files, f"the model factory {_name(factory)}"), torch.no_grad():
            model = make(*weight_files)
    except ToolError:
        raise  # it read a file it was not given (``watching_opens``)
    except Exception as e:
        raise ToolError(f"the model factory {_name(factory)} failed: {short_diagnostic(e)}") from e
    if not isinstance(model, torch.nn.Module):
        raise ToolError(
            f"the model factory {_name(factory)} returned a {type(model).__name__}, "
            "not a torch.nn.Module"
        )
    return model.eval()


def _name(factory: Callable[..., Any] | str) -> str:
    return factory if isinstance(factory, str) else getattr(factory, "__qualname__", "?")


def weights_digest(model: Any) -> dict[str, Any]:
    """The SHA-256 over the model's state (its ``state_dict`` and the buffers it does
    not save), each tensor by name, dtype, shape and bytes, in the module's order."""
    import torch

    h = hashlib.sha256(WEIGHTS_FORMAT.encode())
    tensors = dict(model.state_dict())
    for name, buffer in model.named_buffers():
        tensors.setdefault(name, buffer)
    total = 0
    for name, tensor in tensors.items():
        t = tensor.detach().cpu().contiguous().reshape(-1)
        raw = t.view(torch.uint8).numpy() if t.numel() else b""
        h.update(f"{name}\0{t.dtype}\0{list(tensor.shape)}\0".encode())
        h.update(raw)
        total += len(raw)
    return {
        "format": WEIGHTS_FORMAT,
        "sha256": h.hexdigest(),
        "tensors": len(tensors),
        "bytes": total,
    }


@template_modules("torch", "numpy")
def write_weights(factory: Callable[..., Any] | str, weight_files: Sequence[str], out: str) -> None:
    """Worker side of the weights action: the digest of the model's weights, as JSON."""
    digest = weights_digest(make_model(factory, weight_files))
    with atomic_write(out, "w") as f:
        f.write(json.dumps(digest, sort_keys=True) + "\n")


def check_weights(model: Any, weights_json: str) -> None:
    """Fail unless ``model`` has the weights whose digest the build keyed."""
    keyed = json.loads(read_regular(weights_json))["sha256"]
    if weights_digest(model)["sha256"] != keyed:
        raise ToolError(
            "the model factory gave other weights than when kiln keyed them: seed its "
            "random initialization, and pass every checkpoint it reads as weights=[...]"
        )


def example_args(signature: Signature) -> list[Any]:
    """Example tensors for ``signature`` (seeded: the same in every worker)."""
    import torch

    from kiln.actions._tensors import InputSpec, generate_inputs

    specs = [InputSpec(n, d, tuple(dims)) for n, d, dims in signature]
    arrays, _ = generate_inputs(specs, 0, {})
    return [torch.from_numpy(a) for a in arrays]


def _dynamic(dynamic_shapes: Sequence[Any] | None) -> Any:
    """The plain ``dynamic_shapes`` spec ({dim: name | (name, min, max)} per argument)
    as torch.export takes it, one ``Dim`` per name."""
    if dynamic_shapes is None:
        return None
    from torch.export import Dim

    dims: dict[str, Any] = {}

    def dim(spec: Any) -> Any:
        name, low, high = (spec, None, None) if isinstance(spec, str) else spec
        if name not in dims:
            bounds = {k: v for k, v in (("min", low), ("max", high)) if v is not None}
            dims[name] = Dim(name, **bounds)
        return dims[name]

    return tuple(
        None if per_arg is None else {int(i): dim(s) for i, s in per_arg.items()}
        for per_arg in dynamic_shapes
    )


def _externalize(model: Any, scope: str, threshold: int | None) -> list[tuple[str, Any]]:
    """Mark the weights that go to the archive (all, or those of at least
    ``threshold`` elements) as external; return them by name."""
    from iree.turbine.aot import ExternalTensorTrait

    chosen = []
    seen: set[int] = set()
    for name, tensor in model.state_dict(keep_vars=True).items():
        if id(tensor) in seen or (threshold is not None and tensor.numel() < threshold):
            continue
        seen.add(id(tensor))
        ExternalTensorTrait(external_scope=scope, external_name=name).set(tensor)
        chosen.append((name, tensor.detach()))
    return chosen


@template_modules("torch", "numpy", "iree.turbine.aot")
def export_model(
    factory: Callable[..., Any] | str,
    weight_files: Sequence[str],
    weights_json: str,
    signature: Signature,
    dynamic_shapes: Sequence[Any] | None,
    output: str,
    archive: str | None,
    scope: str,
    threshold: int | None,
) -> None:
    """Worker side of ``torch_export``: the module's MLIR at ``output`` and, with an
    ``archive``, its weights there (named in the MLIR as ``scope::name``)."""
    import iree.turbine.aot as aot

    model = make_model(factory, weight_files)
    check_weights(model, weights_json)
    external = _externalize(model, scope, threshold) if archive is not None else []
    try:
        exported = aot.export(
            model, args=tuple(example_args(signature)), dynamic_shapes=_dynamic(dynamic_shapes)
        )
    except Exception as e:
        raise ToolError(
            f"iree-turbine cannot export {_name(factory)}: {short_diagnostic(e)}"
        ) from e
    with atomic_output(output) as tmp:
        exported.save_mlir(str(tmp))
    if archive is not None:
        new_builder: Callable[[], Any] = aot.ParameterArchiveBuilder  # untyped
        builder = new_builder()
        for name, tensor in external:
            builder.add_tensor(name, tensor)
        with atomic_output(archive) as tmp:
            builder.save(str(tmp))
            os.chmod(tmp, 0o644)


def run_eager(model: Any, args: Sequence[np.ndarray]) -> list[np.ndarray]:
    """The model's outputs on ``args`` in eager PyTorch, flattened, as arrays."""
    import numpy as np
    import torch
    from torch.utils._pytree import tree_flatten

    with torch.no_grad():
        result = model(*(torch.from_numpy(np.ascontiguousarray(a)) for a in args))
    leaves, _ = tree_flatten(result)
    return [
        np.asarray(t.detach().cpu().numpy()) if torch.is_tensor(t) else np.asarray(t)
        for t in leaves
    ]


@template_modules("torch", "numpy")
def write_torch_reference(
    factory: Callable[..., Any] | str,
    weight_files: Sequence[str],
    weights_json: str,
    signature: Signature,
    inputs: Sequence[str],
    shapes: dict[str, Any],
    output: str,
) -> None:
    """Worker side of ``verify(reference="torch")``: the model's eager outputs on the
    check's inputs (given, or generated as the check generates them) to ``output``."""
    from kiln.actions._reference import check_inputs
    from kiln.actions._tensors import save_bundle

    model = make_model(factory, weight_files)
    check_weights(model, weights_json)
    args, _ = check_inputs(None, inputs, shapes, signature=signature, seed_file=weights_json)
    try:
        outputs = run_eager(model, args)
    except Exception as e:
        raise ToolError(f"eager PyTorch cannot run {_name(factory)}: {short_diagnostic(e)}") from e
    with atomic_output(output) as tmp:
        save_bundle(str(tmp), outputs)
