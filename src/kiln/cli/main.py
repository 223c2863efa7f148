"""``kiln COMMAND MODULE [TARGET ...] [OPTIONS]``: parse, load, dispatch, exit.

Exit status: 0 built, 1 an action failed, 2 a usage or build-definition error,
128 + N when stopped by signal N (130 for Ctrl-C, 143 for SIGTERM).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import signal
import sys
import traceback
from collections.abc import Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import IO, Any

from kiln.args import argument_namespace_context
from kiln.errors import BuildDefinitionError, BuildInterrupted, KilnError, StateError
from kiln.lock import OutputDirLocked

USAGE = """usage: kiln COMMAND MODULE.py|-m MODULE [TARGET ...] [OPTIONS]

commands:
  build     build the targets (default: every entrypoint)
  list      list the entrypoints (--all: every file and action)
  explain   say which actions would run and why, running nothing
  graph     print the build graph in Graphviz dot format
  clean     remove the output directory's build products and state

Run 'kiln COMMAND MODULE --help' for the options of a command and module."""


@dataclass
class Invocation:
    """Everything a command needs: parsed options, the analysed graph, streams."""

    command: str
    ns: argparse.Namespace
    executor: Any
    stdout: IO[str]
    stderr: IO[str]


def main(argv: list[str] | None = None) -> int:
    """The ``kiln`` console script."""
    # Like other command-line tools, end quietly when a pipe's reader goes away
    # (``kiln graph m.py | head``).
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    return run_cli(sys.argv[1:] if argv is None else argv)


def kiln_main(
    module: str | ModuleType = "__main__",
    args: list[str] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
) -> None:
    """Run kiln's command line on the build module ``module`` (call it from the
    module's ``if __name__ == "__main__":`` block). Exits on failure."""
    mod = importlib.import_module(module) if isinstance(module, str) else module
    code = run_cli(sys.argv[1:] if args is None else args, mod, stdout, stderr)
    if code:
        raise SystemExit(code)


iree_build_main = kiln_main


def run_cli(
    argv: list[str],
    module: ModuleType | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
) -> int:
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    verbose = any(a in ("-v", "-vv", "--verbose") for a in argv)
    try:
        with _signals_interrupt():
            return _dispatch(argv, module, out, err)
    except BuildInterrupted as e:
        print(f"kiln: interrupted by {signal.Signals(e.signum).name}", file=err)
        return 128 + e.signum
    except KeyboardInterrupt:
        print("kiln: interrupted", file=err)
        return 130
    except (BuildDefinitionError, OutputDirLocked, StateError) as e:
        if verbose:
            traceback.print_exc(file=err)
        print(f"kiln: error: {e}", file=err)
        return 2
    except KilnError as e:
        if verbose:
            traceback.print_exc(file=err)
        print(f"kiln: error: {e}", file=err)
        return 1


def _dispatch(argv: list[str], module: ModuleType | None, out: IO[str], err: IO[str]) -> int:
    command, rest = _split_command(argv, module is not None)
    if command is None:
        print(USAGE, file=out if argv and argv[0] in ("-h", "--help") else err)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    commands = importlib.import_module(f"kiln.cli.{command}_cmd")
    if command == "clean":
        return commands.run(rest, out, err)
    from kiln.cli.session import open_session

    with open_session(command, rest, module, out, err) as inv, argument_namespace_context(inv.ns):
        return commands.run(inv)


def _split_command(argv: list[str], in_module: bool) -> tuple[str | None, list[str]]:
    from kiln.cli.options import COMMANDS

    if argv and argv[0] in COMMANDS:
        return argv[0], argv[1:]
    if in_module:  # iree.build's spellings: --list, --list-all, --build
        rest = [a for a in argv if a not in ("--list", "--list-all", "--build")]
        if "--list-all" in argv:
            return "list", [*rest, "--all"]
        return ("list" if "--list" in argv else "build"), rest
    return None, argv


@contextlib.contextmanager
def _signals_interrupt() -> Iterator[None]:
    """Turn SIGINT and SIGTERM into BuildInterrupted in the main thread."""
    def handler(signum: int, frame: object) -> None:
        raise BuildInterrupted(signum)

    try:
        old = {s: signal.signal(s, handler) for s in (signal.SIGINT, signal.SIGTERM)}
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
