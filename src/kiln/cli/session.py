"""Setting up a command: load the build module, parse the full command line
(with the module's options), choose the console, analyse the entrypoints."""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Iterator
from types import ModuleType
from typing import IO

from kiln.args import argument_namespace_context
from kiln.cli.loader import collect_entrypoints, guarded, load_build_module
from kiln.cli.main import Invocation
from kiln.cli.options import KilnArgumentParser, add_cl_args, add_common_options
from kiln.errors import UsageError
from kiln.executor import Executor
from kiln.reporting import PlainReporter, ProgressReporter


@contextlib.contextmanager
def open_session(
    command: str, argv: list[str], module: ModuleType | None, out: IO[str], err: IO[str]
) -> Iterator[Invocation]:
    if module is None:
        module, argv, prog = _load_from_argv(command, argv)
    else:
        prog = f"{os.path.basename(getattr(module, '__file__', None) or 'build')} {command}"
    entrypoints = collect_entrypoints(module)
    parser = KilnArgumentParser(prog=prog, description=(module.__doc__ or "").strip() or None)
    parser.add_argument("targets", nargs="*", metavar="TARGET",
                        help="entrypoint names or file paths (default: every entrypoint)")
    if command == "list":
        parser.add_argument("--all", action="store_true", help="list every file and action")
        parser.add_argument("--bare", action="store_true",
                            help="graph paths only, one a line (what --list and --list-all print)")
    add_common_options(parser, command)
    add_cl_args(parser, [d for ep in entrypoints.values() for d in ep.cl_arg_defs], command)
    ns = parser.parse_args(argv)
    reporter = make_reporter(ns, err)
    executor = Executor(ns.output_dir, stderr=err, reporter=reporter)
    executor.verbose_level = ns.verbose
    where = getattr(module, "__file__", None) or module.__name__
    with argument_namespace_context(ns):
        guarded(where, lambda: executor.analyze(*entrypoints.values()),
                doing="analysing the entrypoints of")
    # The graph lives as long as this process: later collections need not walk it.
    gc.freeze()
    try:
        yield Invocation(command, ns, executor, out, err)
    finally:
        executor.close()
    # fmt: skip


def _load_from_argv(command: str, argv: list[str]) -> tuple[ModuleType, list[str], str]:
    if not argv or argv[0] in ("-h", "--help"):
        raise UsageError(f"kiln {command}: give the build module: kiln {command} MODULE.py "
                         f"or kiln {command} -m package.module")
    if argv[0] == "-m":
        if len(argv) < 2:
            raise UsageError(f"kiln {command}: -m needs a module name")
        return load_build_module(argv[1], as_module=True), argv[2:], f"kiln {command} -m {argv[1]}"
    return load_build_module(argv[0]), argv[1:], f"kiln {command} {argv[0]}"


def make_reporter(ns: object, err: IO[str]) -> ProgressReporter:
    console = getattr(ns, "console", "auto")
    verbose = getattr(ns, "verbose", 0)
    if getattr(ns, "test_force_console", False):
        console = "live"
    if console == "auto":
        tty = hasattr(err, "isatty") and err.isatty()
        live = tty and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
        console = "live" if live else "plain"
    if console == "live":
        from kiln.reporting_rich import RichReporter

        threshold = getattr(ns, "test_long_display_time_threshold", 5.0)
        return RichReporter(err, verbose=verbose, long_threshold_s=threshold, force_terminal=True)
    return PlainReporter(err, verbose=verbose)
