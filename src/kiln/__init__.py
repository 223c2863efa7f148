"""kiln: a build system for machine-learning model artifacts.

A build module does ``from kiln import *`` and marks functions with
``@entrypoint``; calling actions inside them declares the build graph, which
``kiln build`` runs concurrently and incrementally.
"""

from __future__ import annotations

from typing import Any

from kiln.actions.process import run_command, source_file
from kiln.args import cl_arg
from kiln.cli.loader import load_build_module
from kiln.cli.main import iree_build_main, kiln_main
from kiln.entrypoints import entrypoint

__version__ = "0.1.0"

__all__ = [
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

# The ML actions are imported on first use, keeping ``import kiln`` fast.
_LAZY = {
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
