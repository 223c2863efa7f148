"""``verify``: run a compiled module and compare its outputs with references — the
expected outputs shipped with the model, and/or the source ONNX model's outputs
computed by onnxruntime on the same inputs. Inputs are given files or generated
from the model's signature (see `kiln.actions._tensors`)."""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from kiln.actions import _devices
from kiln.actions._module_run import ModuleRunAction, declare_run, importer
from kiln.actions._reference import onnxruntime_version, reference_name, write_reference
from kiln.actions._tensors import TOLERANCE_DTYPES, normalize_shapes
from kiln.actions._verifying import Check, run_check
from kiln.base.errors import BuildDefinitionError
from kiln.graph import ActionConcurrency, BuildAction, BuildContext, BuildFile, BuildMeta
from kiln.graph.manifest_meta import ManifestMeta

if TYPE_CHECKING:
    from kiln.actions.torch_export import TorchExportAction

REFERENCES = ("onnxruntime", "torch")
DEFAULT_OPSET = 17  # onnx_import's default: what a model is upgraded to for onnxruntime


class ReferenceAction(BuildAction):
    """Computes a model's outputs with onnxruntime (in a worker) into one ``.npz``."""

    pool = _devices.MACHINE_POOL
    # Whose version the key holds (``onnxruntime``): a Dask worker must have the same.
    keyed_tools = ("onnxruntime",)

    def __init__(
        self,
        *,
        model: BuildFile,
        inputs: list[BuildFile],
        shapes: dict[str, Any],
        output_file: BuildFile,
        upgrade_to: int | None,
        data_files: list[BuildFile] | None = None,
        **kwargs: Any,
    ):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kwargs)
        self.model, self.inputs, self.shapes = model, inputs, shapes
        self.output_file = output_file
        self.upgrade_to = upgrade_to
        self.onnxruntime = onnxruntime_version()
        # The model's external data (onnxruntime reads it beside the model): keyed.
        self.data_files = data_files or []
        self.deps.update([model, *inputs, *self.data_files])
        output_file.deps.add(self)

    def _remotable_thunk(self) -> Callable[[], None]:
        return self.sandbox_thunk(lambda f: f.action_path)

    def sandbox_thunk(self, path: Callable[[BuildFile], str]) -> Callable[[], None]:
        """The thunk with its files at ``path(file)`` (a remote sandbox's, or here)."""
        return functools.partial(
            write_reference,
            path(self.model),
            [path(f) for f in self.inputs],
            self.shapes,
            path(self.output_file),
            self.upgrade_to,
        )


class _ReferenceMeta(BuildMeta):
    """The onnxruntime outputs already declared for a model, by (inputs, shapes):
    the checks of one model on several targets share one reference run."""

    KEY = "kiln.verify.references"

    def __init__(self) -> None:
        super().__init__()
        self.files: dict[str, BuildFile] = {}


def _reference_file(
    context: BuildContext,
    module: BuildFile,
    model: BuildFile,
    inputs: list[BuildFile],
    shapes: dict[str, Any],
) -> BuildFile:
    memo = _ReferenceMeta.get(model).files
    key = json.dumps([[f.key for f in inputs], shapes], sort_keys=True)
    if key not in memo:
        output = context.allocate_file(reference_name(context, model.path, "onnxruntime", key))
        found = importer(module)
        opset = found.opset_version if found is not None else None
        ReferenceAction(
            model=model,
            inputs=inputs,
            shapes=shapes,
            output_file=output,
            upgrade_to=opset or DEFAULT_OPSET,
            data_files=found.data_files if found is not None else [],
            desc=f"Running {model.path} in onnxruntime",
            executor=context.executor,
        )
        memo[key] = output
    return memo[key]


class VerifyAction(ModuleRunAction):
    """Runs a compiled module on inputs and compares with its references, in a
    worker. Its key holds every file it reads, the tolerances, the runtime's
    version and the device it runs on (``needs``: ``kiln.devices.identity``)."""

    # 3: dtypes of different kinds fail; NaN and inf are counted in the result.
    # 4: integers and booleans compare exactly (a result cached before may have
    # passed int64 values above 2**53 that differ).
    VERSION = 4
    SPEC = "check"

    def __init__(self, *, check: Check, **kwargs: Any):
        self.check = check
        super().__init__(**kwargs)
        self.check = dataclasses.replace(check, loads=self.loads())

    def keyed_spec(self) -> dict[str, Any]:
        c = self.check
        return {
            "label": c.label,  # the result's "model": for a torch module, no input's path
            "target": c.target,
            "driver": c.driver,
            "function": c.function,
            "shapes": c.shapes,
            "tolerances": c.tolerances,
            "reference": bool(c.reference),
            "reference_name": c.reference_name,
            "inputs": [f.key for f in self.files[1 : 1 + len(c.inputs)]],
            "expected": len(c.expected),
        }

    def _remotable_thunk(self) -> Callable[[], None]:
        return functools.partial(run_check, self._placed(self.check))

    def _placed(self, check: Check) -> Check:
        device, absent = self.placed()
        return dataclasses.replace(check, device=device, absent=absent)

    def sandbox_thunk(self, path: Callable[[BuildFile], str]) -> Callable[[], None]:
        """The check with every path of its files replaced by ``path(file)``."""
        where = self.paths_at(path)
        check = self.spec_at(self.check, path)
        check = dataclasses.replace(
            check,
            expected=[where.get(p, p) for p in check.expected],
            reference=(
                where.get(check.reference, check.reference) if check.reference is not None else None
            ),
        )
        return functools.partial(run_check, self._placed(check))


def _tolerances(
    where: str,
    rtol: float | None,
    atol: float | None,
    tolerances: Mapping[str, Sequence[float]] | None,
) -> dict[str, list[float]]:
    """The tolerances by dtype name (``*``: any), each a finite number >= 0; a
    definition error naming what is wrong otherwise (NaN would pass anything)."""
    out: dict[str, list[float]] = {}
    if not isinstance(tolerances, Mapping | None):
        raise BuildDefinitionError(
            f"{where}: tolerances must map dtype names to (rtol, atol), got {tolerances!r}"
        )
    for key, pair in (tolerances or {}).items():
        if key not in TOLERANCE_DTYPES:
            raise BuildDefinitionError(
                f"{where}: tolerances: unknown dtype {key!r}; known: {', '.join(TOLERANCE_DTYPES)}"
            )
        if not isinstance(pair, Sequence) or isinstance(pair, str | bytes) or len(pair) != 2:
            raise BuildDefinitionError(
                f"{where}: tolerances[{key!r}] must be (rtol, atol), got {pair!r}"
            )
        out[key] = [_tolerance(where, f"tolerances[{key!r}]", v) for v in pair]
    if rtol is not None or atol is not None:
        out["*"] = [_tolerance(where, "rtol", rtol or 0.0), _tolerance(where, "atol", atol or 0.0)]
    return out


def _tolerance(where: str, name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise BuildDefinitionError(f"{where}: {name} must be a number, got {value!r}")
    if not (0 <= value < math.inf):  # NaN fails it too
        raise BuildDefinitionError(f"{where}: {name} must be a finite number >= 0, got {value!r}")
    return float(value)


def verify(
    *,
    name: str,
    module: BuildFile | str,
    inputs: Sequence[BuildFile | str] | None = None,
    expected: Sequence[BuildFile | str] | None = None,
    reference: str | None = None,
    model: BuildFile | str | None = None,
    shapes: Mapping[str, Any] | None = None,
    rtol: float | None = None,
    atol: float | None = None,
    tolerances: Mapping[str, Sequence[float]] | None = None,
    driver: str | None = None,
    function: str | None = None,
    parameters: Sequence[Any] | None = None,
) -> BuildFile:
    """Declare a check of compiled ``module``; its JSON result goes to ``name``.

    ``expected`` (``.pb`` or ``.npy`` files) are outputs shipped with the model;
    ``reference="onnxruntime"`` adds the outputs of the source ONNX ``model``
    (default: the model the module was imported from) run in onnxruntime. Both
    may be asked at once. ``inputs=None`` generates inputs from the model's
    signature (``shapes`` sizes its dynamic dimensions). ``rtol``/``atol`` apply to
    every dtype; ``tolerances`` per dtype name, e.g. ``{"float16": (1e-2, 1e-3)}``;
    otherwise each dtype's default (`kiln.actions._tensors.DEFAULT_TOLERANCES`).
    A module compiled from ``torch_export`` generates its inputs from the example
    inputs' shapes, and ``reference="torch"`` runs its model in eager PyTorch. The
    module's parameter archives are loaded (those of its program, or ``parameters``:
    files, or ``(scope, file)`` pairs).
    """
    run = declare_run(module, inputs, model, driver, parameters, kind="verify")
    context, module_file, model_file, input_files = run.context, run.module, run.model, run.inputs
    exporter = run.exporter
    expected_files = context.files(list(expected)) if expected else []
    shape_map = normalize_shapes(shapes)
    where = f"verify of {module_file.path}"
    _check_arguments(
        module_file, model_file, reference, input_files, expected_files, exporter is not None
    )
    ref_file = None
    if reference == "torch" and exporter is not None:
        ref_file = exporter.reference(context, input_files, shape_map)
    elif reference and model_file is not None:
        ref_file = _reference_file(context, module_file, model_file, input_files, shape_map)
    output = context.allocate_file(name)
    check = Check(
        result_path=output.action_path,
        module=module_file.action_path,
        label=_label(module_file, model_file, exporter),
        target=run.target,
        driver=run.driver,
        function=function,
        model=model_file.action_path if model_file is not None else None,
        inputs=[f.action_path for f in input_files],
        input_names=[f.path for f in input_files],
        shapes=shape_map,
        expected=[f.action_path for f in expected_files],
        reference=ref_file.action_path if ref_file is not None else None,
        tolerances=_tolerances(where, rtol, atol, tolerances),
        reference_name=reference or "onnxruntime",
    )
    files = [module_file, *input_files, *expected_files]
    files += [f for f in (model_file, ref_file) if f is not None]
    action = VerifyAction(
        check=check,
        files=files,
        output_file=output,
        needs=run.needs,
        archives=run.archives,
        exporter=exporter,
        desc=f"Verifying {module_file.path}",
        executor=context.executor,
    )
    ManifestMeta.get(module_file).verifications.append((action, output))
    ManifestMeta.get(output).result_of = ("verification", action)
    return output


def _label(module: BuildFile, model: BuildFile | None, exporter: TorchExportAction | None) -> str:
    """What a check names in its messages: the model as the build names it."""
    if model is not None:
        return model.path
    return exporter.output_file.path if exporter is not None else module.path


def _check_arguments(
    module: BuildFile,
    model: BuildFile | None,
    reference: str | None,
    inputs: list[BuildFile],
    expected: list[BuildFile],
    from_torch: bool = False,
) -> None:
    """Definition errors, named by module, before anything runs."""
    where = f"verify of {module.path}"
    if reference is not None and reference not in REFERENCES:
        raise BuildDefinitionError(
            f"{where}: unknown reference {reference!r}; known: {', '.join(REFERENCES)}"
        )
    if not expected and reference is None:
        raise BuildDefinitionError(
            f"{where}: nothing to compare with: pass expected=[...] and/or reference='onnxruntime'"
            " (or 'torch' for a module exported with torch_export)"
        )
    if reference == "torch" and not from_torch:
        raise BuildDefinitionError(
            f"{where}: reference='torch' needs a module compiled from a torch_export program"
        )
    if from_torch and reference != "onnxruntime":
        return
    if model is None and (reference or not inputs):
        raise BuildDefinitionError(
            f"{where}: {'onnxruntime' if reference else 'generating inputs'} needs the ONNX "
            "model: pass model=..., or compile a module imported with onnx_import"
        )
    if expected and not inputs:
        raise BuildDefinitionError(
            f"{where}: expected outputs need the inputs they came from: pass inputs=[...]"
        )
