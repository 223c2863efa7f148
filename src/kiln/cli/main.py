"""``kiln COMMAND MODULE [TARGET ...] [OPTIONS]``: parse, load, dispatch, exit.

Exit status: 0 built, 1 an action failed, 2 a usage or build-definition error,
128 + N when stopped by signal N (SIGHUP 129, Ctrl-C 130, SIGPIPE 141, SIGTERM
143). A reader of kiln's output that goes away (``kiln graph m.py | head``)
ends kiln quietly with 141, as SIGPIPE ends other command-line tools.
"""

from __future__ import annotations

import atexit
import contextlib
import difflib
import gc
import importlib
import io
import os
import select
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from types import MappingProxyType, ModuleType
from typing import IO, cast

from kiln._version import __version__
from kiln.base.errors import BuildInterrupted, HelpShown, KilnError, UsageError, signal_name
from kiln.base.iree_shim import activated as iree_build_shim
from kiln.base.terminal import PrintableOutput, TerminalStream, printable
from kiln.cli.loader import user_line
from kiln.cli.options import COMMAND_HELP, parser_streams
from kiln.graph.args import argument_namespace_context

USAGE_LINES = """usage: kiln COMMAND MODULE.py|-m MODULE [TARGET ...] [OPTIONS]
       kiln MODULE.py|-m MODULE [TARGET ...] [--build|--list|--list-all] [OPTIONS]
       kiln --version"""


def usage() -> str:
    """``kiln --help``: the two forms of the command line and the commands."""
    commands = "\n".join(f"  {name:<9} {text}" for name, text in COMMAND_HELP.items())
    return (
        f"{USAGE_LINES}\n\ncommands:\n{commands}\n\n"
        "Run 'kiln COMMAND --help' for a command's options, and 'kiln COMMAND MODULE.py "
        "--help' for those of a build module too."
    )


def main(argv: list[str] | None = None) -> int:
    """The ``kiln`` console script."""
    # Like other command-line tools, end quietly when a pipe's reader goes away
    # (``kiln graph m.py | head``).
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    # kiln's own stream: what the build's code does to sys.stderr leaves it alone.
    stderr = sys.stderr
    with _stdout_of_kiln_alone() as stdout:
        code = run_cli(sys.argv[1:] if argv is None else argv, stdout=stdout, stderr=stderr)
    _leave_threads_behind(code, stderr)
    # The command is over and its status decided: a write to a closed connection
    # while the interpreter exits (a library's atexit handler, a daemon thread) fails
    # with EPIPE rather than killing kiln by SIGPIPE with another status.
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    # The process ends next. The command's graph is garbage by now, in reference
    # cycles that the collection at interpreter exit would walk and free object by
    # object (a tenth of a second for 10,000 actions); frozen, the exit leaves it to
    # the OS. kiln has closed its own files and pools already; atexit handlers still run.
    gc.freeze()
    return code


def _leave_threads_behind(code: int, stderr: IO[str]) -> None:
    """Exit now, with ``code``, if threads that are not daemons are still running
    (a build module started them): Python would wait for them at exit, and kiln
    would print its outputs and never end. Says which on ``stderr``, then runs the
    exit handlers itself and leaves without joining them."""
    left = [t for t in threading.enumerate() if _holds_exit(t)]
    if not left:
        return
    names = ", ".join(printable(t.name, one_line=True) for t in left[:5])
    more = f" and {len(left) - 5} more" if len(left) > 5 else ""
    with contextlib.suppress(OSError, ValueError):
        print(
            f"kiln: warning: {len(left)} thread(s) that the build started still run "
            f"({names}{more}); kiln exits without waiting for them",
            file=stderr,
            flush=True,
        )
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr, stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    os._exit(code)


@contextlib.contextmanager
def _stdout_of_kiln_alone() -> Iterator[IO[str] | None]:
    """The process's stdout for kiln alone while the command runs: descriptor 1 is
    stderr's meanwhile, so that a program the build's code starts (or a native
    library's printf) never mixes its output into the paths kiln prints for scripts
    to read. None, and nothing changed, when stdout is not a descriptor."""
    try:
        sys.stdout.flush()
        saved = os.dup(1)
    except (OSError, ValueError, AttributeError):
        yield None
        return
    try:
        os.dup2(2, 1)
    except OSError:
        os.close(saved)
        yield None
        return
    encoding = getattr(sys.stdout, "encoding", None) or "utf-8"
    raw = io.FileIO(saved, "w", closefd=False)
    stream = io.TextIOWrapper(raw, encoding=encoding, errors="backslashreplace")
    try:
        yield stream
    finally:
        with contextlib.suppress(OSError, ValueError):  # a reader gone: said already
            stream.close()
        with contextlib.suppress(OSError):
            os.dup2(saved, 1)
        os.close(saved)


def _holds_exit(thread: threading.Thread) -> bool:
    """Whether the interpreter would wait for ``thread`` at exit: a thread that is not
    a daemon, but for the workers of ``concurrent.futures`` pools, which the
    interpreter stops itself."""
    if thread.daemon or thread is threading.main_thread() or not thread.is_alive():
        return False
    target = getattr(thread, "_target", None)
    return not str(getattr(target, "__module__", "")).startswith("concurrent.futures")


def kiln_main(
    module: str | ModuleType = "__main__",
    args: list[str] | None = None,
    stdout: IO[str] | None = None,
    stderr: IO[str] | None = None,
) -> None:
    """Run kiln's command line on the build module ``module`` (call it from the
    module's ``if __name__ == "__main__":`` block). Exits on failure."""
    mod = importlib.import_module(module) if isinstance(module, str) else module
    with contextlib.ExitStack() as stack:
        if stdout is None:
            stdout = stack.enter_context(_stdout_of_kiln_alone())
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
    # Every line kiln prints goes through these, escaped (``kiln.base.terminal``): names of
    # files, descriptions and help texts come from build modules and the file system.
    out = cast(IO[str], PrintableOutput(stdout if stdout is not None else sys.stdout))
    err = cast(IO[str], TerminalStream(stderr if stderr is not None else sys.stderr))
    verbose = any(a in ("-v", "-vv", "--verbose") for a in argv)
    # While kiln runs, the build module's (and its libraries') ``import iree.build``
    # gives kiln's compatible API (``kiln.base.iree_shim``), unless turned off.
    shim = False if "--no-iree-build-shim" in argv else None
    try:
        with (
            _signals_interrupt(out, err),
            parser_streams(out, err),
            iree_build_shim(shim),
        ):
            code = _dispatch(argv, module, out, err)
            out.flush()  # here, where a closed pipe is recognised, not at exit
            return code
    except BrokenPipeError:
        _discard_broken(out, err)
        return 128 + signal.SIGPIPE
    except BuildInterrupted as e:
        _say(err, f"kiln: interrupted by {signal_name(e.signum)}")
        return e.exit_code
    except KeyboardInterrupt:
        _say(err, "kiln: interrupted")
        return 128 + signal.SIGINT
    except HelpShown as e:
        return e.exit_code
    except SystemExit as e:
        # Only user code exits (a cl_arg's type function, say): never borrow its status.
        _say(
            err,
            f"kiln: error: {user_line(e, '<build module>')}: the build module's code "
            f"called sys.exit({e.code!r}); a build module must not exit",
        )
        return 2
    except KilnError as e:
        _say(err, f"kiln: error: {e}", e if verbose else None)
        return e.exit_code


def _say(err: IO[str], text: str, error: BaseException | None = None) -> None:
    """Print ``text`` (after ``error``'s traceback) on ``err``, unless ``err`` is gone."""
    try:
        if error is not None:
            traceback.print_exception(error, file=err)
        print(text, file=err)
        err.flush()
    except (OSError, ValueError):
        _discard_broken(err)


def _discard_broken(*streams: IO[str]) -> None:
    """Point each stream whose reader went away at /dev/null, so that Python's
    final flush neither fails nor prints a traceback."""
    for stream in streams:
        if _is_broken_pipe(stream):
            null = os.open(os.devnull, os.O_WRONLY)
            os.dup2(null, stream.fileno())
            os.close(null)


def _is_broken_pipe(stream: IO[str]) -> bool:
    """True when ``stream`` is a pipe or socket whose reader has gone."""
    try:
        fd = stream.fileno()
        poller = select.poll()
        poller.register(fd, select.POLLOUT)
        return any(event & (select.POLLERR | select.POLLHUP) for _, event in poller.poll(0))
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return False


def _dispatch(argv: list[str], module: ModuleType | None, out: IO[str], err: IO[str]) -> int:
    command, rest = _split_command(argv, module is not None)
    if command is None:
        if argv and argv[0] in ("-h", "--help"):
            print(usage(), file=out)
            return 0
        if argv and argv[0] == "--version":
            print(f"kiln {__version__}", file=out)
            return 0
        if argv and not argv[0].startswith("-"):
            close = difflib.get_close_matches(argv[0], COMMAND_HELP, n=1, cutoff=0.6)
            hint = f"did you mean '{close[0]}'? " if close else ""
            print(
                f"kiln: unknown command '{argv[0]}' ({hint}a build module is FILE.py, "
                f"or -m {argv[0]} for one on the Python path)",
                file=err,
            )
        print(usage(), file=err)
        return 2
    commands = importlib.import_module(f"kiln.cli.{command}_cmd")
    if command in ("clean", "report", "cache", "completion", "devices", "compare"):  # no module
        code: int = commands.run(rest, out, err)
        return code
    from kiln.cli.session import open_session

    with open_session(command, rest, module, out, err) as inv, argument_namespace_context(inv.args):
        status: int = commands.run(inv)
        return status


def _split_command(argv: list[str], in_module: bool) -> tuple[str | None, list[str]]:
    """The command word and the rest. Without one, as in iree.build, a build module
    (``FILE.py``, ``-m pkg.mod``, or the module calling ``kiln_main``) comes with an
    optional ``--build``, ``--list`` or ``--list-all``."""
    from kiln.cli.options import COMMANDS

    if argv and argv[0] in COMMANDS:
        return argv[0], argv[1:]
    if not in_module and not (argv and (argv[0] == "-m" or argv[0].endswith(".py"))):
        return None, argv
    words = [a for a in argv if a in _IREE_COMMAND_FLAGS]
    if len(set(words)) > 1:
        raise UsageError(f"{' and '.join(dict.fromkeys(words))} exclude each other; give one")
    rest = [a for a in argv if a not in _IREE_COMMAND_FLAGS]
    command, extra = _IREE_COMMAND_FLAGS[words[0]] if words else ("build", ())
    return command, [*rest, *extra]


# iree.build's command flags: kiln's command and the options that print as it does.
_IREE_COMMAND_FLAGS = MappingProxyType(
    {
        "--build": ("build", ()),
        "--list": ("list", ("--bare",)),
        "--list-all": ("list", ("--all", "--bare")),
    }
)


# The signals that end a build: clean-up, then exit 128 + N. Every signal whose
# default action would end kiln on the spot (signal(7): "Term" and "Core"), leaving
# commands and temporaries; but SIGKILL and SIGSTOP (which cannot be caught), the
# faults a bad instruction or access raises in the process itself (SIGSEGV, SIGBUS,
# SIGFPE, SIGILL, SIGABRT: a handler that returns meets them again; Python's
# faulthandler reports those), and SIGXFSZ (ignored: the write fails with EFBIG).
_STOP_NAMES = (
    "SIGHUP SIGINT SIGPIPE SIGTERM SIGQUIT SIGUSR1 SIGUSR2 SIGALRM SIGXCPU SIGVTALRM "
    "SIGPROF SIGTRAP SIGSYS SIGIO SIGPWR SIGSTKFLT"
)
STOP_SIGNALS = tuple(getattr(signal, n) for n in _STOP_NAMES.split() if hasattr(signal, n)) + tuple(
    range(getattr(signal, "SIGRTMIN", 0), getattr(signal, "SIGRTMAX", -1) + 1)
)


@contextlib.contextmanager
def _signals_interrupt(out: IO[str], err: IO[str]) -> Iterator[None]:
    """Turn the stopping signals (SIGHUP, SIGINT, SIGTERM, SIGQUIT, SIGUSR1, ...) into
    BuildInterrupted in the main thread.

    SIGPIPE stops the build only when kiln's stderr is a closed pipe: nobody
    follows the build any more. Any other SIGPIPE comes with a write that fails
    with EPIPE, whose code handles it (a connection to a Dask worker or to the
    remote cache that the other side closed, a closed stdout, whose
    BrokenPipeError ends kiln quietly), or from ``kill``: none stops the build,
    as none stops a Python program. The signal does not say which write raised it.
    """

    def handler(signum: int, frame: object) -> None:
        if signum == signal.SIGPIPE and not _is_broken_pipe(err):
            return
        raise BuildInterrupted(signum)

    try:
        old = {s: signal.signal(s, handler) for s in STOP_SIGNALS}
        # A write past the file-size limit fails with EFBIG, which kiln reports,
        # rather than killing kiln mid-write.
        old[signal.SIGXFSZ] = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        for s, h in old.items():
            signal.signal(s, h)
