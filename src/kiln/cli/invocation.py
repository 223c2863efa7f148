"""What one command of the command line works on (its own module, so that the
commands and the session that makes it import it without importing ``main``)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import IO

from kiln.engine.request import BuildRequest
from kiln.executor import Executor


@dataclass
class Invocation:
    """Everything a command needs: parsed options, the analysed graph, what its
    builds are asked (made once from the options), streams."""

    command: str
    ns: argparse.Namespace  # kiln's own options
    executor: Executor
    request: BuildRequest
    stdout: IO[str]
    stderr: IO[str]
    # What ``cl_arg`` defaults resolve from: kiln's options and the build module's,
    # the module's winning where both have a name.
    args: argparse.Namespace = field(default_factory=argparse.Namespace)
    module_file: str | None = None  # the build module's file, when it has one
    # The entrypoints whose analysis failed (their nodes are not in the graph).
    broken: frozenset[str] = frozenset()
