"""kiln: a build system for machine-learning model artifacts.

A build module does ``from kiln import *`` and marks functions with
``@entrypoint``; calling actions inside them declares the build graph, which
``kiln build`` runs concurrently and incrementally. ``from kiln import *`` gives
what ``from iree.build import *`` gives (names and kinds, the modules
``executor``, ``args``, ``main``... included) and kiln's own names.
"""

from __future__ import annotations

import argparse as argparse
from typing import Any

from kiln._version import __version__ as __version__
from kiln.actions.process import run_command, source_file
from kiln.base.errors import (
    ActionFailed,
    ActionTimeout,
    BuildDefinitionError,
    BuildInterrupted,
    ClusterFailure,
    ConfinementError,
    DependenceException,
    KilnError,
    NotRegularFile,
    OutputDirLocked,
    RemoteError,
    StateError,
    ToolError,
    ToolMissing,
    UnchangedFailure,
    UsageError,
    VerificationFailed,
    WorkerCrashed,
)
from kiln.graph.args import cl_arg
from kiln.graph.entrypoints import entrypoint

__all__ = [
    "ActionConcurrency",
    "ActionFailed",
    "ActionTimeout",
    "BuildAction",
    "BuildContext",
    "BuildDefinitionError",
    "BuildFile",
    "BuildInterrupted",
    "ClusterFailure",
    "ConfinementError",
    "DependenceException",
    "FileNamespace",
    "KilnError",
    "NotRegularFile",
    "OutputDirLocked",
    "Params",
    "RemoteError",
    "StateError",
    "ToolError",
    "ToolMissing",
    "UnchangedFailure",
    "UsageError",
    "VerificationFailed",
    "WorkerCrashed",
    "argparse",
    "args",
    "benchmark",
    "cl_arg",
    "compile",
    "compile_actions",
    "console",
    "entrypoint",
    "executor",
    "fetch_http",
    "iree_build_main",
    "kiln_main",
    "lang",
    "load_build_module",
    "main",
    "metadata",
    "net_actions",
    "onnx_actions",
    "onnx_import",
    "requested_targets",
    "run_command",
    "source_file",
    "target_machine",
    "torch_export",
    "verify",
]

# The ML actions and the command line are imported on first use, keeping
# ``import kiln`` fast and the core free of any import of ``kiln.cli``.
_LAZY = {
    "build": "kiln.cli.api",
    "BuildAction": "kiln.executor",
    "BuildContext": "kiln.executor",
    "BuildFile": "kiln.executor",
    "ActionConcurrency": "kiln.executor",
    "FileNamespace": "kiln.executor",
    "kiln_main": "kiln.cli.main",
    "iree_build_main": "kiln.cli.main",
    "load_build_module": "kiln.cli.loader",
    "fetch_http": "kiln.actions.net",
    "onnx_import": "kiln.actions.onnx",
    "compile": "kiln.actions.iree",
    "requested_targets": "kiln.actions.iree",
    "verify": "kiln.actions.verify",
    "benchmark": "kiln.actions.bench",
    "torch_export": "kiln.actions.torch_export",
    "Params": "kiln.actions.params",
}


# The modules ``from iree.build import *`` gives, by name: kiln's own, or its
# compatible modules of iree.build's names (``kiln.iree_build``).
_MODULES = {
    "args": "kiln.graph.args",
    "executor": "kiln.executor",
    **{
        name: f"kiln.iree_build.{name}"
        for name in (
            "compile_actions",
            "console",
            "lang",
            "main",
            "metadata",
            "net_actions",
            "onnx_actions",
            "target_machine",
        )
    },
}


def __dir__() -> list[str]:
    """The public names, the ones loaded on first use included (not the names this
    module imports for itself)."""
    return sorted({*__all__, *_LAZY, "__version__"})


def __getattr__(name: str) -> Any:
    import importlib

    if name in _MODULES:
        return importlib.import_module(_MODULES[name])
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kiln' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
