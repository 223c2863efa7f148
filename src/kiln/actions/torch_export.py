"""``torch_export``: a PyTorch ``nn.Module`` -> MLIR for the IREE compiler, through
iree-turbine's ``aot.export``, in a worker process (``pip install 'kiln[torch]'``).

Three actions, all out of process, so that kiln's own process never imports torch
(about 4 s on a 2-core machine; a no-op build of a torch model stays as fast as any):

- ``TorchWeightsAction`` makes the model and writes the digest of its weights
  (``state_dict`` and buffers) to ``<name>.weights.json``;
- ``TorchExportAction`` exports it to ``<name>`` (``.mlir``), with ``params=`` its
  weights to ``params/<entrypoint>/<stem>.irpa``. Its inputs are the weights file
  and the declared ``weights=`` files, so its key holds the digest of the weights;
- ``TorchReferenceAction`` computes a check's expected outputs in eager PyTorch, for
  ``verify(reference="torch")``.

Each is keyed by the factory's code (a callable as kiln keys the user's code,
deeply; a ``"package.module:factory"`` spec by its installed distribution's version,
or by the source of the user's package), the installed torch, torchvision and
iree-turbine versions, the example inputs' shapes and dtypes, and the declared
weight files' contents. The factory is called in every worker with the random
generators seeded with 0 and the weight files' paths as arguments.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import json
import os
import sys
from collections.abc import Callable, Sequence
from importlib.machinery import ModuleSpec
from typing import Any

from kiln.actions import _devices
from kiln.actions._reference import reference_name
from kiln.actions._torch_worker import export_model, write_torch_reference, write_weights
from kiln.actions.params import Params, ParamsMeta, allocate_archive, params_spec
from kiln.base.errors import BuildDefinitionError, NotRegularFile
from kiln.graph import ActionConcurrency, BuildAction, BuildContext, BuildFile, BuildMeta
from kiln.output_dir.digests import hash_file
from kiln.planning.code_key import distribution_version, is_user_file, library_dirs, package_version

Factory = Callable[..., Any] | str
_DTYPES: tuple[str, ...] = ("float32", "float64", "float16", "bfloat16", "int64", "int32")
_DTYPES += ("int16", "int8", "uint8", "bool")


@functools.cache
def torch_versions() -> dict[str, str | None]:
    """The installed torch, torchvision and iree-turbine versions (part of the keys),
    looked up once per process (every torch action holds them). Do not change the
    dict returned: it is shared."""
    return {dist: distribution_version(dist) for dist in ("torch", "torchvision", "iree-turbine")}


_LOADERS = (
    (importlib.machinery.SourceFileLoader, importlib.machinery.SOURCE_SUFFIXES),
    (importlib.machinery.SourcelessFileLoader, importlib.machinery.BYTECODE_SUFFIXES),
    (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
)


def _code_spec(module: str) -> ModuleSpec | None:
    """The spec of the package that holds ``module``'s code, found on ``sys.path``
    without importing anything: its top-level package, or, through namespace
    packages (no code of their own, and one may span a whole checkout), the first
    regular package or module on the way down to it. None when it is not there."""
    parts = module.split(".")
    spec = importlib.machinery.PathFinder.find_spec(parts[0], sys.path)
    depth = 1
    while spec is not None and spec.origin is None and depth < len(parts):
        name = ".".join(parts[: depth + 1])
        portions: list[str] = []
        found = None
        for location in spec.submodule_search_locations or ():
            found = importlib.machinery.FileFinder(location, *_LOADERS).find_spec(name)
            if found is None:
                continue
            if found.origin is not None:
                break
            portions += found.submodule_search_locations or ()
        else:
            found = None
            if portions:
                found = ModuleSpec(name, None, is_package=True)
                found.submodule_search_locations = portions
        spec, depth = found, depth + 1
    return spec


def factory_key(factory: Factory) -> Any:
    """What keys a ``"package.module:factory"`` spec without importing it: an
    installed package's distribution and version, else the digest of the source of
    the user's package (its ``.py`` files) or module; a namespace package's by the
    package or module below it that holds the spec's module. Computed once per
    ``torch_export`` (a package's every file is read)."""
    if callable(factory):
        return factory  # keyed by its code (kiln.planning.code_key)
    module = factory.split(":", 1)[0]
    spec = _code_spec(module)
    if spec is None:  # unkeyable, and the worker could not import it either
        raise BuildDefinitionError(
            f"model {factory!r}: no module {module} on sys.path {sys.path!r}: install its "
            "package, or put the folder that holds it on PYTHONPATH"
        )
    if spec.origin is None:
        raise BuildDefinitionError(
            f"model {factory!r}: {module} is a namespace package, which holds no code; "
            "name the module that defines the factory"
        )
    if not is_user_file(os.path.abspath(spec.origin), library_dirs()):
        return {"spec": factory, "installed": package_version(module)}
    try:
        if not spec.submodule_search_locations:
            return {"spec": factory, "source": hash_file(spec.origin)}
        return {"spec": factory, "source": _package_digest(spec.submodule_search_locations)}
    except (OSError, NotRegularFile) as e:
        raise BuildDefinitionError(
            f"model {factory!r}: cannot read its source to key it: {e}"
        ) from None


def factory_sources(factory: Factory) -> tuple[str, ...]:
    """The user's files and folders whose ``.py`` files ``factory_key`` digests: the
    worker imports them at run time, and they need no recording as run-time
    dependencies (``kiln.planning.run_deps``): a spec's module, or its package's folders."""
    if callable(factory):
        return ()
    spec = _code_spec(factory.split(":", 1)[0])
    if spec is None or spec.origin is None:
        return ()
    if not is_user_file(os.path.abspath(spec.origin), library_dirs()):
        return ()
    roots = spec.submodule_search_locations or [spec.origin]
    return tuple(os.path.abspath(r) for r in roots)


def _package_digest(roots: Sequence[str]) -> str:
    """The digest of the ``.py`` files below ``roots``: each one's path relative to its
    root and the digest of its content."""
    h = hashlib.sha256()
    for root in sorted(roots):
        for folder, dirs, files in os.walk(root):
            dirs.sort()
            for name in sorted(f for f in files if f.endswith(".py")):
                path = os.path.join(folder, name)
                h.update(os.path.relpath(path, root).encode() + b"\0")
                h.update(bytes.fromhex(hash_file(path)))
    return h.hexdigest()


def signature_of(args: Sequence[Any], where: str) -> list[tuple[str, str, tuple[int, ...]]]:
    """The example inputs as ``(name, dtype, shape)``: each given as ``(shape,
    dtype)``, a dict with ``shape``, ``dtype`` (and ``name``), or an array (numpy, or
    a torch tensor when the build imported torch itself)."""
    out = []
    for i, arg in enumerate(args):
        name = f"arg{i}"
        shape: Any
        dtype: Any
        if hasattr(arg, "shape") and hasattr(arg, "dtype"):
            shape, dtype = tuple(arg.shape), str(arg.dtype).removeprefix("torch.")
        elif isinstance(arg, dict):
            shape, dtype, name = (
                arg.get("shape"),
                arg.get("dtype", "float32"),
                arg.get("name", name),
            )
        elif isinstance(arg, list | tuple) and len(arg) == 2:
            shape, dtype = arg
        else:
            shape, dtype = None, None
        if (
            not isinstance(shape, list | tuple)
            or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape)
            or dtype not in _DTYPES
        ):
            raise BuildDefinitionError(
                f"{where}: args[{i}] = {arg!r}: give each example input as (shape, dtype), "
                f"e.g. ((1, 3, 224, 224), 'float32'); dtypes: {', '.join(_DTYPES)}"
            )
        out.append((str(name), str(dtype), tuple(int(d) for d in shape)))
    return out


def _dynamic_spec(dynamic_shapes: Any, count: int, where: str) -> list[Any] | None:
    """``dynamic_shapes`` as plain data: per argument None or {dim: name | (name, min,
    max)}."""
    if dynamic_shapes is None:
        return None
    if not isinstance(dynamic_shapes, list | tuple) or len(dynamic_shapes) != count:
        raise BuildDefinitionError(
            f"{where}: dynamic_shapes must give one entry per example input ({count}): "
            "None, or {dimension index: 'name' or ('name', min, max)}"
        )
    out: list[Any] = []
    for per_arg in dynamic_shapes:
        if per_arg is None:
            out.append(None)
            continue
        if not isinstance(per_arg, dict) or not all(
            isinstance(k, int) and (isinstance(v, str) or isinstance(v, tuple) and len(v) == 3)
            for k, v in per_arg.items()
        ):
            raise BuildDefinitionError(
                f"{where}: dynamic_shapes entry {per_arg!r}: expected "
                "{dimension index: 'name' or ('name', min, max)}"
            )
        out.append({int(k): v for k, v in per_arg.items()})
    return out


class _TorchAction(BuildAction):
    """What the three torch actions share: the factory, the declared weight files
    and the installed versions; each runs in a worker, in the machine pool."""

    pool = _devices.MACHINE_POOL
    # Keyed through ``factory_key``; ``keyed_sources`` names where (``kiln.planning.run_deps``).
    key_exclude = ("factory", "keyed_sources")
    # Whose versions the key holds (``versions``): a Dask worker must have the same.
    keyed_tools = ("torch", "torchvision", "iree-turbine")

    def __init__(
        self,
        *,
        factory: Factory,
        factory_key: Any,
        weight_files: list[BuildFile],
        **kwargs: Any,
    ):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kwargs)
        self.factory = factory
        self.factory_key = factory_key  # factory_key(factory), made once per torch_export
        self.keyed_sources = factory_sources(factory)
        self.weight_files = weight_files
        self.versions = torch_versions()
        self.deps.update(weight_files)

    def check_runnable(self) -> None:
        if self.versions["torch"] is None or self.versions["iree-turbine"] is None:
            raise BuildDefinitionError(
                f"'{self}' needs torch and iree-turbine: pip install 'kiln[torch]'"
            )

    def _remotable_thunk(self) -> Callable[[], None]:
        return self.sandbox_thunk(lambda f: f.action_path)

    def sandbox_thunk(self, path: Callable[[BuildFile], str]) -> Callable[[], None]:
        raise NotImplementedError


class TorchWeightsAction(_TorchAction):
    """Writes the digest of the factory's model's weights to ``output_file``."""

    def __init__(self, *, output_file: BuildFile, **kwargs: Any):
        super().__init__(**kwargs)
        self.output_file = output_file
        output_file.deps.add(self)

    def sandbox_thunk(self, path: Callable[[BuildFile], str]) -> Callable[[], None]:
        """The thunk with its files at ``path(file)`` (a remote sandbox's, or here)."""
        files = [path(f) for f in self.weight_files]
        return functools.partial(write_weights, self.factory, files, path(self.output_file))


class TorchExportAction(_TorchAction):
    """Exports the factory's model to MLIR (``output_file``) and, with ``params``, its
    weights to ``archive``; ``weights`` (the digest file) is an input."""

    def __init__(
        self,
        *,
        weights: BuildFile,
        signature: list[tuple[str, str, tuple[int, ...]]],
        dynamic_shapes: list[Any] | None,
        output_file: BuildFile,
        params: Params | None,
        archive: BuildFile | None,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.weights = weights
        self.signature = signature
        self.dynamic_shapes = dynamic_shapes
        self.output_file = output_file
        self.param_spec = params
        self.archive = archive
        self.deps.add(weights)
        output_file.deps.add(self)
        if archive is not None and params is not None:
            archive.deps.add(self)
            ParamsMeta.get(output_file).archives.append((params.scope, archive))

    def sandbox_thunk(self, path: Callable[[BuildFile], str]) -> Callable[[], None]:
        """The thunk with its files at ``path(file)`` (a remote sandbox's, or here)."""
        spec = self.param_spec or Params()
        return functools.partial(
            export_model,
            self.factory,
            [path(f) for f in self.weight_files],
            path(self.weights),
            self.signature,
            self.dynamic_shapes,
            path(self.output_file),
            path(self.archive) if self.archive is not None else None,
            spec.scope,
            spec.threshold,
        )

    def reference(
        self, context: BuildContext, inputs: list[BuildFile], shapes: dict[str, Any]
    ) -> BuildFile:
        """The eager-PyTorch outputs on ``inputs`` (or generated ones), made once per
        (inputs, shapes) however many targets are checked."""
        memo = _TorchReferences.get(self.output_file).files
        key = json.dumps([[f.key for f in inputs], shapes], sort_keys=True)
        if key not in memo:
            name = reference_name(context, self.output_file.path, "torch", key)
            output = context.allocate_file(name)
            TorchReferenceAction(
                factory=self.factory,
                factory_key=self.factory_key,
                weight_files=self.weight_files,
                weights=self.weights,
                signature=self.signature,
                inputs=inputs,
                shapes=shapes,
                output_file=output,
                desc=f"Running {self.output_file.path}'s model in eager PyTorch",
                executor=context.executor,
            )
            memo[key] = output
        return memo[key]


class _TorchReferences(BuildMeta):
    """The eager outputs already declared for an exported program, by (inputs, shapes)."""

    KEY = "kiln.torch.references"

    def __init__(self) -> None:
        super().__init__()
        self.files: dict[str, BuildFile] = {}


class TorchReferenceAction(_TorchAction):
    """Computes the model's outputs in eager PyTorch on a check's inputs (``.npz``)."""

    def __init__(
        self,
        *,
        weights: BuildFile,
        signature: list[tuple[str, str, tuple[int, ...]]],
        inputs: list[BuildFile],
        shapes: dict[str, Any],
        output_file: BuildFile,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.weights, self.signature = weights, signature
        self.inputs, self.shapes = inputs, shapes
        self.output_file = output_file
        self.deps.update([weights, *inputs])
        output_file.deps.add(self)

    def sandbox_thunk(self, path: Callable[[BuildFile], str]) -> Callable[[], None]:
        """The thunk with its files at ``path(file)`` (a remote sandbox's, or here)."""
        return functools.partial(
            write_torch_reference,
            self.factory,
            [path(f) for f in self.weight_files],
            path(self.weights),
            self.signature,
            [path(f) for f in self.inputs],
            self.shapes,
            path(self.output_file),
        )


def torch_exporter(module: BuildFile) -> TorchExportAction | None:
    """The ``torch_export`` the program of compiled ``module`` came from, if any."""
    for action in module.deps:
        source = getattr(action, "input_file", None)
        if isinstance(source, BuildFile):
            for producer in source.deps:
                if isinstance(producer, TorchExportAction):
                    return producer
    return None


def torch_export(
    *,
    name: str,
    model: Factory,
    args: Sequence[Any],
    dynamic_shapes: Sequence[Any] | None = None,
    params: Params | bool | dict[str, Any] | None = None,
    weights: Sequence[BuildFile | str] = (),
) -> BuildFile:
    """Declare the export of a PyTorch model to the MLIR file ``name``.

    ``model`` is a callable returning the ``nn.Module`` (import torch inside it, not
    at the top of the build module, to keep kiln's process free of torch), or a
    ``"package.module:factory"`` spec; it is called with the paths of ``weights``
    (checkpoint files it reads, keyed by content). ``args`` are the example inputs,
    each ``(shape, dtype)``; ``dynamic_shapes`` per input None or ``{dim: "name"}``.
    ``params=True`` (or ``Params(scope=, threshold=)``) puts the weights in
    ``params/<entrypoint>/<stem>.irpa`` instead of the program.
    """
    context = BuildContext.current()
    where = f"torch_export of {name}"
    if not (callable(model) or isinstance(model, str) and ":" in model):
        raise BuildDefinitionError(
            f"{where}: model must be a callable returning the nn.Module, or "
            f"'package.module:factory'; got {model!r}"
        )
    signature = signature_of(args, where)
    dynamic = _dynamic_spec(dynamic_shapes, len(signature), where)
    spec = params_spec(params, where)
    weight_files = context.files(list(weights)) if weights else []
    keyed = factory_key(model)
    digest = context.allocate_file(f"{name.rsplit('.', 1)[0]}.weights.json")
    TorchWeightsAction(
        factory=model,
        factory_key=keyed,
        weight_files=weight_files,
        output_file=digest,
        desc=f"Digesting the weights of {name}",
        executor=context.executor,
    )
    output = context.allocate_file(name)
    TorchExportAction(
        factory=model,
        factory_key=keyed,
        weight_files=weight_files,
        weights=digest,
        signature=signature,
        dynamic_shapes=dynamic,
        output_file=output,
        params=spec,
        archive=allocate_archive(context, name) if spec is not None else None,
        desc=f"Exporting PyTorch {name} -> {output}",
        executor=context.executor,
    )
    return output
