"""IREE's ``iree.build`` package, as kiln provides it.

While kiln loads and runs a build, ``import iree.build`` (and ``iree.build.<name>``)
executes the files of this package under those names (``kiln.base.iree_shim``), so a
build module written for iree.build, and every action library it imports, runs
on kiln unchanged. Each file holds what its iree.build namesake exports, bound to
kiln's own objects. ``from iree.build import *`` then gives what iree.build's own
package gives: the names below, modules included.
"""

import argparse

from . import (
    args,
    compile_actions,
    console,
    executor,
    lang,
    main,
    metadata,
    net_actions,
    onnx_actions,
    target_machine,
)
from .compile_actions import compile  # noqa: A004 - iree.build's public name
from .lang import cl_arg, entrypoint
from .main import iree_build_main, load_build_module
from .net_actions import fetch_http
from .onnx_actions import onnx_import

# The names ``from iree.build import *`` gives with iree-base-compiler 3.13.
__all__ = [
    "argparse",
    "args",
    "cl_arg",
    "compile",
    "compile_actions",
    "console",
    "entrypoint",
    "executor",
    "fetch_http",
    "iree_build_main",
    "lang",
    "load_build_module",
    "main",
    "metadata",
    "net_actions",
    "onnx_actions",
    "onnx_import",
    "target_machine",
]
