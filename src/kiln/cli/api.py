"""``kiln.build``: run a build from Python (a notebook, a test, a script) and get
its result, as ``kiln build`` would run it, without exiting the interpreter."""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Sequence
from types import ModuleType
from typing import IO, cast

from kiln.base.iree_shim import activated as iree_build_shim
from kiln.base.terminal import TerminalStream
from kiln.cli.build_cmd import build as run_build
from kiln.cli.options import parser_streams
from kiln.cli.requested import resolve_targets
from kiln.cli.session import open_session
from kiln.engine.result import BuildResult
from kiln.graph.args import argument_namespace_context


def build(
    module: ModuleType | str | os.PathLike[str],
    targets: Sequence[str] = (),
    output_dir: str | os.PathLike[str] = "kiln-out",
    args: Sequence[str] = (),
    stderr: IO[str] | None = None,
) -> BuildResult:
    """Build ``targets`` (entrypoint names or graph paths; none: every entrypoint)
    of ``module`` into ``output_dir`` and return the build's result (``.ok``,
    ``.built``, ``.failed``, ``.errors``...). ``module`` is a module object, the
    path of a build module (``"build.py"``) or a module name (``"pkg.models"``);
    ``args`` are further ``kiln build`` options (``["-j", "2", "--fail-fast"]``).
    Progress goes to ``stderr`` (default: ``sys.stderr``) as plain lines.

    A failed action gives a result that is not ``ok``; a definition or usage error
    raises ``BuildDefinitionError`` or ``UsageError``, as the command line exits 2."""
    argv = [*targets, "--output-dir", os.fspath(output_dir), "--console", "plain", *args]
    mod: ModuleType | None = None
    if isinstance(module, ModuleType):
        mod = module
    elif isinstance(module, os.PathLike) or str(module).endswith(".py"):
        argv = [os.fspath(module), *argv]
    else:
        argv = ["-m", str(module), *argv]
    out = cast(IO[str], io.StringIO())
    err = cast(IO[str], TerminalStream(stderr if stderr is not None else sys.stderr))
    shim = False if "--no-iree-build-shim" in args else None
    with (
        parser_streams(out, err),
        iree_build_shim(shim),
        open_session("build", argv, mod, out, err) as inv,
        argument_namespace_context(inv.args),
    ):
        return run_build(inv, resolve_targets(inv.executor, inv.ns.targets))


__all__ = ["build"]
