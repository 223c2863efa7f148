"""Build modules inside a worker process, whose functions arrive pickled by value.

kiln loads a build module under a private name (``kiln.base.modnames``) and marks it
to be pickled by value, so a worker gets the module's functions and classes
without importing the file. In the worker that name imports nothing, and code
that finds a function's module by its name fails there although it works in
kiln's own process: torch 2.13's dynamo, tracing a model whose class a build
module defines, does ``importlib.import_module(f.__globals__["__name__"])``
(iree-turbine's ``turbine_generate`` in an iree.build module hits it).

``install`` adds an import finder that answers those private names, and only
them, with a module holding the globals that the unpickled functions of that
build module share. It costs nothing until such an import happens; then one
pass over the process's functions finds the globals. The module's namespace is
a copy taken at that import.
"""

from __future__ import annotations

import gc
import importlib.machinery
import sys
import types
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from kiln.base.modnames import is_build_module_name

if TYPE_CHECKING:
    import importlib.abc


class _UnpickledBuildModules:
    """A meta path finder and its loader (by protocol: importlib.abc imports
    importlib.resources, a cost every worker would pay)."""

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        namespace = _globals_named(fullname) if is_build_module_name(fullname) else None
        if namespace is None:
            return None
        loader = cast("importlib.abc.Loader", self)
        return importlib.machinery.ModuleSpec(fullname, loader, loader_state=namespace)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module

    def exec_module(self, module: types.ModuleType) -> None:
        spec = module.__spec__
        namespace: dict[str, Any] = spec.loader_state if spec is not None else {}
        keep = ("__name__", "__spec__", "__loader__")
        module.__dict__.update((k, v) for k, v in namespace.items() if k not in keep)


def _globals_named(name: str) -> dict[str, Any] | None:
    """The globals of an unpickled function of the build module ``name``, if any."""
    for obj in gc.get_objects():
        if type(obj) is types.FunctionType and obj.__globals__.get("__name__") == name:
            return obj.__globals__
    return None


def install() -> None:
    """Let this process import the build modules its unpickled functions came from."""
    if not any(isinstance(f, _UnpickledBuildModules) for f in sys.meta_path):
        sys.meta_path.append(_UnpickledBuildModules())
