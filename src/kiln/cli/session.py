"""Setting up a command: load the build module, parse the full command line
(with the module's options), choose the console, analyse the entrypoints."""

from __future__ import annotations

import argparse
import contextlib
import functools
import gc
import os
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import IO

from kiln.base.errors import BuildDefinitionError, HelpShown, UsageError
from kiln.base.terminal import user_streams
from kiln.cli import project_config
from kiln.cli.build_request import request_from
from kiln.cli.invocation import Invocation
from kiln.cli.loader import collect_entrypoints, guarded, loaded_for_command
from kiln.cli.options import (
    COMMAND_HELP,
    add_cl_args,
    check_report_file,
    command_parser,
    module_values,
)
from kiln.executor import Executor
from kiln.graph import BuildAction, BuildEntrypoint
from kiln.graph.args import argument_namespace_context
from kiln.graph.entrypoints import Entrypoint
from kiln.graph.progress import ProgressReporter
from kiln.graph.reach import unproduced_outputs, unreturned_actions
from kiln.observe.summary import PlainReporter


@contextlib.contextmanager
def open_session(
    command: str, argv: list[str], module: ModuleType | None, out: IO[str], err: IO[str]
) -> Iterator[Invocation]:
    # Where kiln started: every path of the command line is taken from here, though
    # the build module (which runs next) may change the working directory.
    start_dir = os.getcwd()
    with contextlib.ExitStack() as stack:
        if module is None:
            with user_streams(err):  # the module's prints: not kiln's output, escaped
                module, argv, prog = _load_from_argv(command, argv, stack)
        else:
            prog = f"{os.path.basename(getattr(module, '__file__', None) or 'build')} {command}"
        yield from _open(command, argv, module, prog, out, err, stack, start_dir)


def _open(
    command: str,
    argv: list[str],
    module: ModuleType,
    prog: str,
    out: IO[str],
    err: IO[str],
    stack: contextlib.ExitStack,
    start_dir: str,
) -> Iterator[Invocation]:
    entrypoints = collect_entrypoints(module)
    parser = command_parser(command, prog, (module.__doc__ or "").strip() or None)
    add_cl_args(parser, [d for ep in entrypoints.values() for d in ep.cl_arg_defs], command)
    module_file = getattr(module, "__file__", None)
    module_dir = os.path.dirname(os.path.abspath(module_file)) if module_file else None
    config_start = module_dir or start_dir
    ns, values = module_values(project_config.parse(parser, argv, config_start))
    _resolve_paths(ns, start_dir)
    args = argparse.Namespace(**{**vars(ns), **values})
    reporter = make_reporter(ns, err)
    request = request_from(command, ns, reporter.message, start_dir)
    executor = Executor(
        ns.output_dir,
        stderr=err,
        reporter=reporter,
        request=request,
        source_root=module_dir,
    )
    where = getattr(module, "__file__", None) or module.__name__
    with argument_namespace_context(args), user_streams(err):
        broken, declared = _analyse(executor, where, entrypoints)
    _check_requested(broken, ns.targets, reporter)
    if command == "build":
        _warn_unreturned(executor, declared, ns.targets, bool(ns.strict), reporter)
    stack.callback(executor.close)
    stack.enter_context(_graph_frozen())
    yield Invocation(
        command,
        ns,
        executor,
        request,
        out,
        err,
        args,
        module_file=module_file,
        broken=frozenset(broken),
    )


def _resolve_paths(ns: object, start_dir: str) -> None:
    """Make the paths kiln owns absolute, from the directory kiln started in (a build
    module that calls ``os.chdir`` at import moves none of them)."""
    # The output directory as given: the output paths kiln prints are under it.
    ns.output_dir_given = getattr(ns, "output_dir", None)  # type: ignore[attr-defined]
    for name in ("output_dir", "events", "profile", "cache_dir"):
        value = getattr(ns, name, None)
        if value is not None:
            setattr(ns, name, Path(os.path.join(start_dir, value)))
            if name in ("events", "profile"):
                check_report_file(f"--{name}", getattr(ns, name), value)


@contextlib.contextmanager
def _graph_frozen() -> Iterator[None]:
    """While the command runs, collections need not walk the graph (it lives until
    the command ends); afterwards it is collectable again, so that running the
    command line many times in one process does not keep every graph. A process
    that froze objects of its own keeps them frozen: kiln then freezes nothing."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _analyse(
    executor: Executor, where: str, entrypoints: dict[str, Entrypoint]
) -> tuple[dict[str, BuildDefinitionError], dict[str, list[BuildAction]]]:
    """Analyse each entrypoint on its own; one that fails is undone from the graph
    and its error kept, so that it stops only the commands that need it. Also
    gives the actions each entrypoint that did not fail declared."""
    broken: dict[str, BuildDefinitionError] = {}
    declared: dict[str, list[BuildAction]] = {}
    for name, ep in entrypoints.items():
        mark = executor.checkpoint()
        try:
            guarded(
                where,
                functools.partial(executor.analyze, ep),
                doing=f"analysing entrypoint '{name}' of",
            )
            _check_produced(executor.graph.entrypoints[mark[1] :])
        except BuildDefinitionError as e:
            executor.rollback(mark)
            broken[name] = e
        else:
            new = executor.graph.actions[mark[3] :]
            declared[name] = [a for a in new if isinstance(a, BuildAction)]
    return broken, declared


def _check_produced(declared: list[BuildEntrypoint]) -> None:
    """An entrypoint hands out only files that an action produces, source files, or
    files already in the output directory: kiln would otherwise print the path of
    a file it never built."""
    for bep in declared[:1]:  # the entrypoint called; the others are nested in it
        # A file placed by hand in the output directory is an input iree.build's
        # builders hand out as it is (``kiln.output_dir.prefilled``).
        missing = [f for f in unproduced_outputs(bep) if not os.path.lexists(f.fs_str)]
        if missing:
            f = missing[0]
            more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
            raise BuildDefinitionError(
                f"{f.def_site}: '{f.path}'{more} is an output of entrypoint '{bep.path}' "
                "that no action produces: pass it to the action that writes it (as the "
                "output it declares, in the file's deps), or return a source_file()"
            )


def _warn_unreturned(
    executor: Executor,
    declared: dict[str, list[BuildAction]],
    targets: list[str],
    strict: bool,
    reporter: ProgressReporter,
) -> None:
    """Name the actions that the requested entrypoints (all, when none are named)
    declare but that no entrypoint reaches through what it returns: they never run.
    With ``--strict``, that is a definition error."""
    wanted = {t.strip("/").split("/", 1)[0] for t in targets}
    tops = [e for e in executor.graph.entrypoints if "/" not in e.path]
    asked = [a for name, acts in declared.items() if not targets or name in wanted for a in acts]
    lost = unreturned_actions(asked, tops)
    if not lost:
        return
    lines = [f"  '{a.desc}' (at {a.def_site})" for a in lost[:10]]
    if len(lost) > 10:
        lines.append(f"  ... and {len(lost) - 10} more")
    text = (
        f"{len(lost)} action(s) declared but not reached from what their entrypoint "
        "returns, so never run (return their outputs, or a file made from them):\n"
        + "\n".join(lines)
    )
    if strict:
        raise BuildDefinitionError(text)
    reporter.message(f"warning: {text}")


def _check_requested(
    broken: dict[str, BuildDefinitionError], targets: list[str], reporter: ProgressReporter
) -> None:
    """Raise the error of a broken entrypoint that the targets (all, when none are
    named) need; warn about the others."""
    if not broken:
        return
    wanted = {t.strip("/").split("/", 1)[0] for t in targets}
    needed = [name for name in broken if not targets or name in wanted]
    if needed:
        others = [n for n in broken if n != needed[0]]
        more = f" (also broken: {', '.join(others)})" if others else ""
        raise BuildDefinitionError(f"{broken[needed[0]]}{more}") from broken[needed[0]]
    for name, error in broken.items():
        reporter.message(f"warning: skipped the broken entrypoint '{name}': {error}")


def _module_first(argv: list[str]) -> list[str]:
    """``argv`` with the build module (``FILE.py``, or ``-m NAME``) moved to the front
    when options come before it (``kiln list --all FILE.py``)."""
    if not argv or not argv[0].startswith("-") or argv[0] == "-m":
        return argv
    for i, word in enumerate(argv):
        if word == "-m" and i + 1 < len(argv):
            return [*argv[i : i + 2], *argv[:i], *argv[i + 2 :]]
        if word.endswith(".py") and not word.startswith("-"):
            return [word, *argv[:i], *argv[i + 1 :]]
    return argv


def _load_from_argv(
    command: str, argv: list[str], stack: contextlib.ExitStack
) -> tuple[ModuleType, list[str], str]:
    argv = _module_first(argv)
    if argv and argv[0].startswith("-") and argv[0] != "-m":  # options, no module
        if "-h" in argv or "--help" in argv:
            _help_without_module(command)
        argv = []
    if not argv:
        raise UsageError(
            f"kiln {command}: give the build module: kiln {command} MODULE.py "
            f"or kiln {command} -m package.module (kiln {command} --help lists the options)"
        )
    if argv[0] == "-m":
        if len(argv) < 2:
            raise UsageError(f"kiln {command}: -m needs a module name")
        module = stack.enter_context(loaded_for_command(argv[1], as_module=True))
        return module, argv[2:], f"kiln {command} -m {argv[1]}"
    return stack.enter_context(loaded_for_command(argv[0])), argv[1:], f"kiln {command} {argv[0]}"


def _help_without_module(command: str) -> None:
    """``kiln COMMAND --help`` before any module: kiln's own options of the command
    (a module's ``cl_arg`` options are listed with ``kiln COMMAND MODULE.py --help``)."""
    parser = command_parser(
        command,
        f"kiln {command} MODULE.py|-m MODULE",
        f"{COMMAND_HELP.get(command, '')}. The build module's own options (its "
        f"entrypoints' cl_args) are listed by 'kiln {command} MODULE.py --help'.",
    )
    parser.print_help()
    raise HelpShown(0)


def make_reporter(ns: object, err: IO[str]) -> ProgressReporter:
    console = getattr(ns, "console", "auto")
    verbose = getattr(ns, "verbose", 0)
    failures = getattr(ns, "failures", "full")
    if getattr(ns, "test_force_console", False):
        console = "live"
    if console == "auto":
        tty = hasattr(err, "isatty") and err.isatty()
        live = tty and not os.environ.get("NO_COLOR") and os.environ.get("TERM") != "dumb"
        console = "live" if live else "plain"
    if console == "live":
        from kiln.observe.live import RichReporter

        threshold = getattr(ns, "test_long_display_time_threshold", 5.0)
        return RichReporter(
            err,
            verbose=verbose,
            long_threshold_s=threshold,
            force_terminal=True,
            failures=failures,
        )
    heartbeat = getattr(ns, "heartbeat", 30.0)
    return PlainReporter(err, verbose=verbose, heartbeat_s=heartbeat, failures=failures)
