"""What ``verify`` and ``benchmark`` share: a compiled module run on a device in a
worker process, in the machine pool, keyed by the files it reads, a summary of
what it is asked to do, the runtime's version and the device; and how a
declaration finds the module's target, its source model, its inputs and what the
module loads with it (its parameter archives; for a module exported from PyTorch,
the example inputs to generate inputs from)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from kiln.actions import _devices
from kiln.actions._runtime import Loads, RunSpec
from kiln.actions.iree import CompileAction
from kiln.actions.onnx import ImportOnnxAction
from kiln.actions.params import parameters_arg
from kiln.actions.torch_export import TorchExportAction, torch_exporter
from kiln.devices.identity import STAND_IN_VAR, is_stand_in, need_for_driver, need_for_flags
from kiln.graph import ActionConcurrency, BuildAction, BuildContext, BuildFile

_Spec = TypeVar("_Spec", bound=RunSpec)


class ModuleRunAction(BuildAction):
    """Runs a compiled module in a worker; its result JSON is ``output_file``.

    ``SPEC`` names the attribute holding the run's description as plain values
    (paths included, so that it pickles into a worker); its key holds
    ``keyed_spec()`` instead, which names files by their keys, never by path.

    What the module loads is held here, for every kind of run alike: ``archives``
    (``(scope, archive)``, loaded with the module) and ``exporter`` (the
    ``torch_export`` of its program, whose example inputs and weights' digest
    generate inputs when there is no ONNX model). Both are inputs, keyed with the
    scopes and the example inputs; ``loads(path)`` gives them to the worker."""

    pool = _devices.MACHINE_POOL
    # A run whose device is absent is not skipped by the scheduler: it runs, and
    # its result file says "skipped" and why (the manifest shows it).
    records_absence = True
    SPEC = ""
    # Whose versions the key holds (``runtime``): a Dask worker must have the same.
    keyed_tools = ("iree-base-runtime",)
    relative_paths = True  # its spec names files by ``action_path`` (a benchmark too)

    def __init__(
        self,
        *,
        files: list[BuildFile],
        output_file: BuildFile,
        needs: str,
        archives: Sequence[tuple[str, BuildFile]] = (),
        exporter: TorchExportAction | None = None,
        **kwargs: Any,
    ):
        super().__init__(concurrency=ActionConcurrency.PROCESS, needs=needs, **kwargs)
        self.files = files
        self.output_file = output_file
        self.runtime = _devices.runtime_version()
        # Keyed by params() (an action is no key value): private.
        self._archives = list(archives)
        self._exporter = exporter
        self.deps.update(files)
        self.deps.update(f for _, f in self._archives)
        if exporter is not None:
            self.deps.add(exporter.weights)
        output_file.deps.add(self)

    def keyed_spec(self) -> dict[str, Any]:
        raise NotImplementedError

    def placed(self) -> tuple[str | None, str | None]:
        """(the id of the device it runs on, why it runs no module: its device is
        absent, or a stand-in), as the build's devices say (``kiln.devices.identity``)."""
        assert self.needs is not None
        devices = self.run_context.devices
        device = devices.resolve(self.needs)
        if device is None:
            return None, devices.absent_reason(self.needs)
        if is_stand_in(device):
            return device, f"{device} is a stand-in device ({STAND_IN_VAR}): it runs no module"
        return device, None

    def loads(self, path: Callable[[BuildFile], str] = lambda f: f.action_path) -> Loads:
        """What the worker loads beside the module, each file at ``path(file)``."""
        exporter = self._exporter
        return Loads(
            parameters=[(scope, path(f)) for scope, f in self._archives],
            signature=exporter.signature if exporter is not None else None,
            seed_file=path(exporter.weights) if exporter is not None else None,
        )

    def spec_at(self, spec: _Spec, path: Callable[[BuildFile], str]) -> _Spec:
        """``spec`` with every path of the action's files (its result, the module,
        the model, the inputs, what it loads) at ``path(file)``: a remote sandbox's,
        or here."""
        where = self.paths_at(path)
        return dataclasses.replace(
            spec,
            result_path=path(self.output_file),
            module=where.get(spec.module, spec.module),
            model=where.get(spec.model, spec.model) if spec.model is not None else None,
            inputs=[where.get(p, p) for p in spec.inputs],
            loads=self.loads(path),
        )

    def paths_at(self, path: Callable[[BuildFile], str]) -> dict[str, str]:
        """``path(file)`` of each of the action's files, by its ``action_path``."""
        return {f.action_path: path(f) for f in [*self.files, self.output_file]}

    def params(self) -> dict[str, Any] | None:
        out = super().params()
        if out is not None:
            spec = self.keyed_spec()
            if self._archives:
                spec["parameters"] = [[scope, f.key] for scope, f in self._archives]
            if self._exporter is not None:
                spec["signature"] = self._exporter.signature
            out[self.SPEC] = spec
        return out


@dataclass
class ModuleRun:
    """A declared run of a compiled module: what the declaration resolved."""

    context: BuildContext
    module: BuildFile
    model: BuildFile | None  # the source ONNX model, given or found
    inputs: list[BuildFile]
    target: str  # the compile target's name, or "its own target"
    driver: str
    needs: str  # the device it needs (``kiln.devices.identity``), from the compile target
    archives: list[tuple[str, BuildFile]]  # the parameter archives it loads
    exporter: TorchExportAction | None  # with no ONNX model: the torch_export, if any


def declare_run(
    module: BuildFile | str,
    inputs: Sequence[BuildFile | str] | None,
    model: BuildFile | str | None,
    driver: str | None,
    parameters: Sequence[Any] | None = None,
    kind: str = "run",
) -> ModuleRun:
    """Resolve the files and the device of a run of ``module`` (a ``kind``, for
    errors): the archives are ``parameters`` when given (``kiln.actions.params.
    parameters_arg``), else those of the module's program."""
    context = BuildContext.current()
    module_file = context.file(module)
    model_file = context.file(model) if model is not None else source_model(module_file)
    target, default_driver, need = module_target(module_file)
    where = f"{kind} of {module_file.path}"
    if driver is not None and driver != default_driver:
        need = need_for_driver(driver)
    return ModuleRun(
        context=context,
        module=module_file,
        model=model_file,
        inputs=context.files(list(inputs)) if inputs else [],
        target=target or "its own target",
        driver=driver or default_driver,
        needs=need,
        archives=parameters_arg(context, module_file, parameters, where),
        exporter=torch_exporter(module_file) if model_file is None else None,
    )


def importer(module: BuildFile) -> ImportOnnxAction | None:
    """The onnx_import action whose output ``module`` was compiled from, if any."""
    compiles = [d for d in module.deps if isinstance(d, CompileAction)]
    if not compiles:
        return None
    imports = [d for d in compiles[0].input_file.deps if isinstance(d, ImportOnnxAction)]
    return imports[0] if imports else None


def source_model(module: BuildFile) -> BuildFile | None:
    """The ONNX model that ``module`` was compiled from (via onnx_import), if any."""
    found = importer(module)
    return found.input_file if found is not None else None


def module_target(module: BuildFile) -> tuple[str, str, str]:
    """(target name, runtime driver, device need) of a module compiled in this
    build, else ("", "local-task", "cpu")."""
    compiles = [d for d in module.deps if isinstance(d, CompileAction)]
    if not compiles:
        return "", "local-task", "cpu"
    target = compiles[0].target
    return target.name, target.driver, need_for_flags(compiles[0].flags)
