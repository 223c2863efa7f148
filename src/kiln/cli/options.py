"""The command line's parsers: kiln's own options, built-in actions' options, and
the options that build modules declare with ``cl_arg``.

A build module's option wins over kiln's option of the same spelling (shark-ai's
modules declare ``cl_arg("target")`` and are run with ``--target=gfx942``): kiln's
option then answers to ``--kiln-<name>`` only, which ``--help`` shows. Only the
options iree.build has itself (``IREE_BUILD_OPTIONS``) and names starting with
``kiln-`` are refused to modules. The module's values are parsed into their own
destinations (``module_values``), so a module's ``jobs`` never becomes kiln's.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import difflib
import sys
from collections.abc import Iterator
from pathlib import Path
from types import MappingProxyType
from typing import IO, Any

from kiln.base.compile_targets import target_name
from kiln.base.cpus import usable_cpus
from kiln.base.errors import BuildDefinitionError, HelpShown, UsageError
from kiln.base.iree_shim import NO_SHIM_ENV
from kiln.cli.cache_options import add_cache_options, directory_path
from kiln.cli.executor_options import add_executor_options
from kiln.graph.args import ClArg, check_cl_args

# Each command and what it does, as ``kiln --help`` lists them.
COMMAND_HELP = MappingProxyType(
    {
        "build": "build the targets (default: every entrypoint)",
        "list": "list the entrypoints (--all: every file and action)",
        "explain": "say which actions would run and why, running nothing",
        "graph": "print the build graph as Graphviz dot text (render it with dot -Tsvg)",
        "clean": "remove the output directory's build products and state",
        "report": "write an HTML report of the last builds (no module needed)",
        "cache": "stats|gc|clear of the shared cache (kiln cache --help)",
        "completion": 'print a bash or zsh completion script: eval "$(kiln completion bash)"',
        "devices": "list the devices kiln finds here, or on every worker of --executor",
        "compare": "compare two builds: what changed, why, faster or slower (no module needed)",
    }
)
COMMANDS = tuple(COMMAND_HELP)
# The options iree.build's command line has itself: a build module cannot declare
# them under iree.build either, so kiln keeps them.
IREE_BUILD_OPTIONS = MappingProxyType(
    {
        "--help": "show the help",
        "--output-dir": "the output directory",
        "--build": "build (the default)",
        "--list": "list the entrypoints",
        "--list-all": "list every graph path",
        "--test-force-console": "a testing flag",
        "--test-long-display-time-threshold": "a testing flag",
        "--iree-compile-out-of-process": "run iree-compile out of process",
        "--no-iree-compile-out-of-process": "run iree-compile in process",
        "--iree-compile-extra-args": "extra iree-compile flags",
        "--iree-hal-target-device": "a compile target device",
        "--iree-rocm-target": "the ROCm chip of hip targets",
        "--iree-hip-target": "the ROCm chip of hip targets (iree.build's older name)",
        "--iree-llvmcpu-target-cpu": "the CPU of llvm-cpu targets",
        "--iree-llvmcpu-target-cpu-features": "the CPU features of llvm-cpu targets",
    }
)
# The default --output-dir (compared by identity: given, a relative directory makes
# the output paths printed relative, as iree.build prints them).
DEFAULT_OUTPUT_DIR = Path("kiln-out")
KILN_SPELLING = "--kiln-"  # kiln's own options answer to it when a module takes their name
_MODULE_DEST = "kiln module option "  # the module's values are parsed under this prefix

# The streams of the command line running in this context: ``--help`` and
# argparse's messages go there, not to the process's sys.stdout and sys.stderr.
_STREAMS: contextvars.ContextVar[tuple[IO[str], IO[str]] | None] = contextvars.ContextVar(
    "kiln_cli_streams", default=None
)


@contextlib.contextmanager
def parser_streams(out: IO[str], err: IO[str]) -> Iterator[None]:
    """Within this block, parsers print help on ``out`` and messages on ``err``."""
    token = _STREAMS.set((out, err))
    try:
        yield
    finally:
        _STREAMS.reset(token)


class KilnArgumentParser(argparse.ArgumentParser):
    """Raises UsageError or HelpShown instead of exiting, and prints on the
    command's streams, so kiln_main can be called as a library and any other
    SystemExit is known to come from the user's code."""

    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{self.prog}: {message}{self._suggestion(message)}")

    def _suggestion(self, message: str) -> str:
        """For options argparse did not recognise, the closest ones this parser
        has (``--jbos`` -> ``--jobs``), as target names are suggested."""
        head, sep, rest = message.partition("unrecognized arguments: ")
        if not sep or head:
            return ""
        known = [s for s in self._option_string_actions if s.startswith("--")]
        hints = []
        for word in rest.split():
            flag = word.split("=", 1)[0]
            if not flag.startswith("-") or flag == "-":
                continue
            close = difflib.get_close_matches(flag, known, n=3, cutoff=0.6)
            if close:
                hints.append(f"{flag}: did you mean {' or '.join(close)}?")
        return f" ({'; '.join(hints)})" if hints else ""

    def exit(self, status: int = 0, message: str | None = None) -> None:  # type: ignore[override]
        if message:
            self._print_message(message, sys.stderr)
        raise HelpShown(status)

    def _print_message(self, message: str, file: Any = None) -> None:
        streams = _STREAMS.get()
        if streams is not None:
            file = streams[1] if file is sys.stderr else streams[0]
        super()._print_message(message, file)


def positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def report_file(text: str) -> Path:
    """An ``--events`` or ``--profile`` file name (``check_report_file`` checks it once
    it is made absolute)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("expected a file name, got an empty one")
    return Path(text)


def check_report_file(option: str, path: Path, given: object) -> None:
    """UsageError for an ``--events`` or ``--profile`` file in no directory (``path``,
    absolute; ``given``, as the user wrote it), so that it fails before the build
    rather than after it. What the file may be is ``kiln.cli.destinations``'s to say."""
    if not path.parent.is_dir():
        raise UsageError(f"{option}: the directory of {given} does not exist")


def target_spec(text: str) -> str:
    """A ``--target`` value, checked now so that a typo fails even where nothing compiles."""
    try:
        target_name(text)
    except UsageError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


def seconds_or_off(text: str) -> float:
    """A number of seconds, at least 1, or 0 for off: a heartbeat more often than
    once a second would flood the log it is meant to keep alive."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if not value >= 0 or value == float("inf"):
        raise argparse.ArgumentTypeError(f"must be 0 (off) or a positive number, got {text}")
    if 0 < value < 1:
        raise argparse.ArgumentTypeError(
            f"{text} seconds would print a line for each running action many times a "
            "second; give 0 (off) or at least 1"
        )
    return value


def pool_limit(text: str) -> tuple[str, int]:
    name, sep, count = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=COUNT, got {text!r}")
    return name, positive_int(count)


def add_common_options(p: argparse.ArgumentParser, command: str) -> None:
    p.add_argument(
        "--output-dir",
        type=directory_path,
        default=DEFAULT_OUTPUT_DIR,
        help="where outputs and build state go (default: ./kiln-out)",
    )
    p.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="more detail: tracebacks, skipped actions, log paths",
    )
    p.add_argument(
        "--console",
        choices=("auto", "live", "plain"),
        default="auto",
        help="live terminal display or plain lines (default: live on a terminal)",
    )
    p.add_argument(
        "--failures",
        choices=("full", "summary"),
        default="full",
        help="full: each failure's details when it fails (the summary then names it); "
        "summary: none then, one line each in the summary at the end (for a script "
        "that reports failures itself, e.g. a table)",
    )
    p.add_argument(
        "--no-iree-build-shim",
        action="store_true",
        help="let the build module's 'import iree.build' load IREE's own package instead "
        f"of kiln's compatible API (also: {NO_SHIM_ENV}=1)",
    )
    add_testing_options(p)
    if command in ("build", "explain"):
        p.add_argument(
            "--strict-keys",
            action="store_true",
            help="stop, instead of running it on every build, at an action holding a "
            "value kiln cannot put in its key",
        )
        p.add_argument(
            "-j",
            "--jobs",
            type=positive_int,
            default=usable_cpus(),
            help="actions running at once (default: the CPUs kiln may use: its affinity "
            "mask and cgroup CPU quota, here %(default)s)",
        )
        p.add_argument(
            "--pool",
            type=pool_limit,
            action="append",
            default=[],
            metavar="NAME=N",
            help="bound the actions of resource pool NAME to N",
        )
        p.add_argument(
            "--action-env",
            action="append",
            default=[],
            metavar="NAME[=VALUE]",
            help="give commands and worker processes the variable NAME (with VALUE, or "
            "as kiln has it); it is in their keys. They see no other variable of yours "
            "(repeatable; docs/reliability.md)",
        )
        p.add_argument(
            "--retry-failed",
            action="store_true",
            help="run again the actions that failed with the same key in an earlier build "
            "(by default they are not run again, and count as failed (unchanged))",
        )
        p.add_argument(
            "--require-devices",
            action="store_true",
            help="a check or action whose device (needs=, a module's target) is on no "
            "machine of the build fails, instead of being skipped (kiln devices)",
        )
        add_cache_options(p)
    if command == "build":
        add_executor_options(p)
        p.add_argument(
            "--fail-fast", action="store_true", help="start no new action after the first failure"
        )
        p.add_argument("--dry-run", action="store_true", help="list what would run; run nothing")
        p.add_argument(
            "--check-reproducible",
            action="store_true",
            help="run every action a second time in a scratch directory and compare its "
            "outputs byte for byte; what differs is listed, exits 1 and is never shared",
        )
        p.add_argument("--explain", action="store_true", help="say why each action runs")
        p.add_argument(
            "--prune",
            action="store_true",
            help="remove the files that earlier builds made and the build module no longer "
            "declares (a renamed or removed action's), when unchanged since kiln wrote them",
        )
        p.add_argument(
            "--strict",
            action="store_true",
            help="stop with an error, instead of a warning, at an action that an "
            "entrypoint declares but does not reach through what it returns",
        )
        p.add_argument(
            "--heartbeat",
            type=seconds_or_off,
            default=30.0,
            metavar="SECONDS",
            help="plain output: a line for each action still running, every SECONDS of "
            "its run (default: 30; at least 1; 0: none)",
        )
        p.add_argument(
            "--no-wait",
            action="store_true",
            help="fail at once if another build holds the output directory",
        )
        p.add_argument(
            "--events",
            type=report_file,
            metavar="FILE",
            help="write the build's events to FILE as JSON lines, as they happen "
            "(format: docs/events.md)",
        )
        p.add_argument(
            "--profile",
            type=report_file,
            metavar="FILE",
            help="write a Chrome trace of the build to FILE (open it in Perfetto "
            "or chrome://tracing)",
        )
    add_action_options(p)


def add_testing_options(p: argparse.ArgumentParser) -> None:
    """Hidden flags that tests of build modules pass (iree.build's spellings):
    the live display even off a terminal, and the age at which an action counts
    as long-running on it."""
    p.add_argument("--test-force-console", action="store_true", help=argparse.SUPPRESS)
    p.add_argument(
        "--test-long-display-time-threshold",
        type=float,
        default=5.0,
        metavar="SECONDS",
        help=argparse.SUPPRESS,
    )


def add_action_options(p: argparse.ArgumentParser) -> None:
    """Options read by the built-in ML actions (targets of ``compile``)."""
    g = p.add_argument_group("compile targets")
    g.add_argument(
        "--target",
        action="append",
        default=[],
        dest="kiln_targets",
        type=target_spec,
        metavar="SPEC",
        help="cpu, cpu:host, cpu:NAME, vmvx, hip:CHIP, vulkan:TARGET, cuda:SM (repeatable)",
    )
    g.add_argument(
        "--iree-hal-target-device",
        action="extend",
        nargs="*",
        default=[],
        metavar="DEVICE",
        help="IREE HAL target devices, as iree.build takes them (several per flag, "
        "and the flag repeatable)",
    )
    g.add_argument(
        "--iree-llvmcpu-target-cpu",
        default=None,
        help="CPU for llvm-cpu targets (with --iree-hal-target-device)",
    )
    g.add_argument(
        "--iree-llvmcpu-target-cpu-features", default=None, help="CPU features for llvm-cpu targets"
    )
    g.add_argument(
        "--iree-hip-target",
        "--iree-rocm-target",
        dest="iree_hip_target",
        default=None,
        help="ROCm chip for hip targets, e.g. gfx942",
    )
    g.add_argument(
        "--iree-compile-extra-args", default="", help="extra iree-compile flags, space separated"
    )
    g.add_argument(
        "--iree-compile-out-of-process",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="accepted as iree.build takes it; kiln always runs iree-compile in a worker process",
    )


def command_parser(command: str, prog: str, description: str | None) -> KilnArgumentParser:
    """The parser of ``kiln COMMAND`` with kiln's own arguments (not yet the module's)."""
    parser = KilnArgumentParser(prog=prog, description=description)
    parser.add_argument(
        "targets",
        nargs="*",
        metavar="TARGET",
        help="entrypoint names or file paths (default: every entrypoint)",
    )
    if command == "list":
        parser.add_argument("--all", action="store_true", help="list every file and action")
        parser.add_argument(
            "--bare",
            action="store_true",
            help="graph paths only, one a line (what --list and --list-all print)",
        )
    if command in ("list", "explain"):
        parser.add_argument(
            "--json", action="store_true", help="print one JSON document, for scripts"
        )
    add_common_options(parser, command)
    return parser


def add_cl_args(p: argparse.ArgumentParser, defs: list[ClArg], command: str) -> None:
    """Add the build module's options to ``p``; where one takes the spelling of an
    option of kiln's, kiln's answers to ``--kiln-<name>`` instead."""
    for d in defs:
        if d.flag.startswith(KILN_SPELLING) or d.name.startswith("kiln_"):
            raise BuildDefinitionError(
                f"cl_arg '{d.name}' at {d.def_site}: names starting with 'kiln-' are "
                "kiln's own options; rename it"
            )
    unique = check_cl_args(defs, dict(IREE_BUILD_OPTIONS))
    if not unique:
        return
    for d in unique:
        _yield_option(p, d.flag)
    group = p.add_argument_group(
        "options of the build module", "declared by its entrypoints' cl_arg()s"
    )
    for d in unique:
        settings = {k: v for k, v in d.settings.items() if v is not None}
        action = group.add_argument(d.flag, dest=_MODULE_DEST + d.dest, **settings)
        if action.metavar is None and action.nargs != 0:
            action.metavar = d.dest.upper()


def _yield_option(p: argparse.ArgumentParser, flag: str) -> None:
    """Give ``flag`` up to the build module: kiln's option that had it keeps its other
    spellings and answers to ``--kiln-<name>``, which its help names."""
    taken = p._option_string_actions.pop(flag, None)
    if taken is None:
        return
    spelling = KILN_SPELLING + flag.lstrip("-")
    taken.option_strings = [*(s for s in taken.option_strings if s != flag), spelling]
    p._option_string_actions[spelling] = taken
    if taken.help != argparse.SUPPRESS:
        taken.help = f"{taken.help or ''} ({flag} is the build module's option)".lstrip()


def module_values(ns: argparse.Namespace) -> tuple[argparse.Namespace, dict[str, Any]]:
    """Split a parsed namespace into kiln's options and the build module's values
    (by their ``cl_arg`` destinations); ``ns`` keeps kiln's alone."""
    values = {}
    for key in [k for k in vars(ns) if k.startswith(_MODULE_DEST)]:
        values[key[len(_MODULE_DEST) :]] = getattr(ns, key)
        delattr(ns, key)
    return ns, values
