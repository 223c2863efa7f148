"""kiln: a build system for machine-learning model artifacts.

A build module does ``from kiln import *`` and marks functions with
``@entrypoint``; calling actions inside them declares the build graph, which
``kiln build`` runs concurrently and incrementally.
"""

from __future__ import annotations

from typing import Any

from kiln._version import __version__ as __version__
from kiln.actions.process import run_command, source_file
from kiln.args import cl_arg
from kiln.entrypoints import entrypoint
from kiln.errors import (
    ActionFailed,
    ActionTimeout,
    BuildDefinitionError,
    BuildInterrupted,
    ConfinementError,
    DependenceException,
    KilnError,
    NotRegularFile,
    OutputDirLocked,
    RemoteError,
    StateError,
    ToolError,
    UsageError,
    VerificationFailed,
    WorkerCrashed,
)

__all__ = [
    "ActionFailed",
    "ActionTimeout",
    "BuildDefinitionError",
    "BuildInterrupted",
    "ConfinementError",
    "DependenceException",
    "KilnError",
    "NotRegularFile",
    "OutputDirLocked",
    "RemoteError",
    "StateError",
    "ToolError",
    "UsageError",
    "VerificationFailed",
    "WorkerCrashed",
    "benchmark",
    "cl_arg",
    "compile",
    "entrypoint",
    "fetch_http",
    "iree_build_main",
    "kiln_main",
    "load_build_module",
    "onnx_import",
    "run_command",
    "source_file",
    "verify",
]

# The ML actions and the command line are imported on first use, keeping
# ``import kiln`` fast and the core free of any import of ``kiln.cli``.
_LAZY = {
    "kiln_main": "kiln.cli.main",
    "iree_build_main": "kiln.cli.main",
    "load_build_module": "kiln.cli.loader",
    "fetch_http": "kiln.actions.net",
    "onnx_import": "kiln.actions.onnx",
    "compile": "kiln.actions.iree",
    "verify": "kiln.actions.verify",
    "benchmark": "kiln.actions.bench",
}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'kiln' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
