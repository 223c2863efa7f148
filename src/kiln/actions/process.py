"""Actions that run a program: ``run_command``, and ``source_file`` for inputs."""

from __future__ import annotations

import errno
import functools
import os
import posixpath
import re
import subprocess
import sys
import threading
from collections.abc import Callable, Collection, Mapping
from contextlib import AbstractContextManager
from pathlib import Path

from kiln.actions._logs import read_tail
from kiln.base.action_env import check_variables
from kiln.base.errors import (
    ActionFailed,
    ActionTimeout,
    BuildDefinitionError,
    ToolError,
    UsageError,
)
from kiln.base.redact import redact_urls
from kiln.execution.process.commands import Ended
from kiln.graph import (
    ActionConcurrency,
    BuildAction,
    BuildContext,
    BuildFile,
    DefinitionSite,
    FileNamespace,
    Finish,
    Finished,
    SpawnsCommand,
    join_namespace,
)
from kiln.output_dir.writing import atomic_output, disk_full, temporary_for


def source_file(path: str | Path, *, name: str | None = None) -> BuildFile:
    """A file or directory of the source tree (relative to the calling build module's
    directory), tracked by content (a directory by its tree: names, executable bits,
    contents). ``name`` is its graph name (default: ``path``; for an absolute
    ``path``, its base name: the machine's directories are no name in the graph)."""
    context = BuildContext.current()
    site = DefinitionSite.capture()
    joined = Path(site.filename).parent / path
    fs_path = _source_path(joined)
    if not (fs_path.is_file() or fs_path.is_dir()):
        where = context.path or "<root>"
        link = f"{joined} is a link to {fs_path}, which" if joined.is_symlink() else ""
        raise BuildDefinitionError(
            f"source file {link or fs_path} does not exist (source_file({str(path)!r}) in "
            f"entrypoint '{where}', at {site})"
        )
    if name is None:
        name = Path(path).name if Path(path).is_absolute() else Path(path).as_posix()
    return _source(context, fs_path, name)


def _source_path(joined: Path) -> Path:
    """The absolute path of a source file: ``joined`` resolved, except a final
    symbolic link to a regular file, which is kept by its own name (its directory
    resolved). Its content is read through it (the target's), but the graph, the
    key and the actions see the name the build gave: an ONNX model's external-data
    file, linked to a store elsewhere, is still found beside the model, where its
    location names it, as onnx itself looks for it. A link is only ever read
    through, never written (``BuildFile.source``); one to a directory is resolved
    (a directory input is keyed by its tree, whose links are not followed)."""
    if joined.name not in ("", ".", "..") and joined.is_symlink() and joined.is_file():
        return joined.parent.resolve() / joined.name
    return joined.resolve()


def _source(context: BuildContext, fs_path: Path, name: str) -> BuildFile:
    """The source file ``fs_path`` named ``name`` in ``context`` (made once)."""
    # Normalised as ``BuildContext.file`` normalises names, so the file can be named.
    graph_path = posixpath.normpath(join_namespace(context.path, name))
    existing = context.registry.all.get(graph_path)
    if isinstance(existing, BuildFile) and existing.source == fs_path:
        return existing
    return BuildFile(executor=context.executor, path=graph_path, source=fs_path)


class CommandAction(BuildAction, SpawnsCommand):
    """Runs ``argv`` (no shell) with ``{out}``, ``{inputs[i]}`` and ``{tools[i]}``
    substituted, in the output directory, with kiln's controlled environment
    (``kiln.base.action_env``) and its own ``env``; every path it is given is relative
    to the output directory (``BuildFile.action_path``), and ``{out}`` is always
    the same temporary, so what it writes does not depend on where it ran. The
    output is renamed into place only when the command exits 0 having written it.
    ``tools`` are the files of the project that the command runs (its program, a
    script it is given): inputs like any other, keyed by their content.
    What the command prints goes to its log file, never into kiln's memory; a
    failure shows a tail of the log bounded in bytes. Its ``timeout`` kills the
    command and everything it started.

    The command is started by the build's ``CommandRunner`` (``kiln.execution.process.commands``):
    no thread waits for it; the runner's reaper thread calls back when it ended.
    """

    enforces_own_timeout = True

    def __init__(
        self,
        *,
        argv: list[str],
        inputs: list[BuildFile],
        output: BuildFile,
        timeout: float | None = None,
        env: dict[str, str] | None = None,
        tools: list[BuildFile] | None = None,
        **kwargs: object,
    ):
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.argv = list(argv)
        self.inputs = inputs
        self.tools = list(tools or ())
        self.env = dict(env or {})
        self.output = output
        self.timeout = timeout
        self._log: str | None = None  # the log of its last run

    @property
    def log_path(self) -> str | None:
        """The log its last run wrote (``.kiln/logs/<output path>.log``); None when
        the command printed nothing (or has not run)."""
        return self._log

    def _invoke(self) -> None:
        """Run the command and wait for it (the scheduler does not wait: ``spawn``)."""
        ended = threading.Event()
        rest: list[Finish] = []

        def finished(finish: Finish, size: int) -> None:
            rest.append(finish)
            ended.set()

        self.spawn(finished)
        ended.wait()
        rest[0]()

    def spawn(self, finished: Finished) -> None:
        final = self.output.get_fs_path()
        commit = atomic_output(final, create=False, unique=False)
        tmp = commit.__enter__()
        try:
            argv = self.command_line()
            env, path = self.run_context.command_env(self.env)
            # How the command is shown (log header, failure): only made when needed.
            shown = functools.cache(lambda: redact_urls(subprocess.list2cmdline(argv)))
            self._log = None
            spool = self.run_context.spools.take()
            # Every process the command starts carries a tag in its environment, even
            # one that daemonizes, so that what it leaves running can be found.
            try:
                self.run_context.commands.spawn(
                    argv,
                    env=env,
                    path=path,
                    cwd=self.run_context.work_dir,
                    log_fd=spool,
                    tag=os.urandom(16).hex(),
                    timeout=self.timeout,
                    on_exit=lambda e: finished(
                        functools.partial(self._after, e, commit, tmp, shown, spool),
                        _size(tmp, e),
                    ),
                )
            except BaseException as e:
                self.run_context.spools.give(spool)  # never written: the command did not start
                if isinstance(e, OSError):
                    raise ActionFailed(
                        f"'{self.desc}': cannot run {argv[0]!r}: {e.strerror}"
                    ) from e
                raise
        except BaseException:
            commit.__exit__(*sys.exc_info())  # removes the temporary
            raise

    def _log_file(self) -> str:
        return self.run_context.log_path(self.output)

    def _old_log(self) -> str | None:
        return self.run_context.old_log(self.output)

    def _after(
        self,
        ended: Ended,
        commit: AbstractContextManager[Path],
        tmp: Path,
        shown: Callable[[], str],
        spool: int,
    ) -> None:
        """The command ended: keep what it printed, then fail, or commit its output."""
        try:
            log = self._log = self.run_context.spools.settle(
                spool, self._log_file, lambda: f"$ {shown()}\n", self._old_log
            )
            if ended.timed_out:
                raise ActionTimeout(
                    f"'{self.desc}' ran past its timeout of {self.timeout:g} s and was killed"
                )
            if ended.returncode != 0:
                # Judged now, its partial output still there: a command that filled the
                # disk may have said so only in its log, which that disk could not take.
                full = disk_full(tmp.parent)
                error = ToolError(
                    f"'{self.desc}': command exited with status {ended.returncode}: {shown()}\n"
                    f"{read_tail(log) if log else '(it printed nothing)'}".rstrip()
                    + (f"\n({full})" if full else ""),
                    ended.returncode,
                )
                if full:
                    raise error from OSError(errno.ENOSPC, full)
                raise error
            if ended.left:
                self.run_context.write_status(
                    f"warning: '{self.desc}' left {len(ended.left)} process(es) running after "
                    f"its command ended; killed: {', '.join(ended.left)}"
                )
            if not os.path.lexists(tmp):
                raise ActionFailed(
                    f"'{self.desc}' finished without writing its output {self.output.get_fs_path()}"
                )
        except BaseException:
            commit.__exit__(*sys.exc_info())  # removes the temporary
            raise
        commit.__exit__(None, None, None)  # commits it

    def out_path(self) -> str:
        """What ``{out}`` stands for: the output's temporary (always the same name),
        relative to the output directory."""
        path = self.output.action_path
        return posixpath.join(posixpath.dirname(path), temporary_for(Path(path), False).name)

    def command_line(self) -> list[str]:
        """The argv the command runs with, every path relative to the directory it
        runs in (here the output directory; on a Dask worker its sandbox)."""
        return self._format(
            self.out_path(),
            [f.action_path for f in self.inputs],
            [f.action_path for f in self.tools],
        )

    def sandbox_command(self) -> tuple[list[str], dict[BuildFile, str]]:
        """The command line as a Dask worker runs it, in a sandbox laid out as the
        output directory (``kiln.execution.cluster``), and where it writes its output."""
        return self.command_line(), {self.output: self.out_path()}

    def _format(self, out: str, inputs: list[str], tools: list[str]) -> list[str]:
        try:
            return [a.format(out=out, inputs=inputs, tools=tools) for a in self.argv]
        except (IndexError, KeyError, ValueError, AttributeError) as e:
            raise ActionFailed(
                f"'{self.desc}': cannot format the command {self.argv}: {e!r}; "
                "use {out} and {inputs[i]}, and {{ and }} for literal braces"
            ) from None


def _size(path: Path, ended: Ended) -> int:
    """The bytes a command that succeeded wrote at ``path`` (0 when it failed)."""
    if ended.returncode != 0 or ended.timed_out:
        return 0
    try:
        return os.lstat(path).st_size
    except OSError:
        return 0


def run_command(
    *,
    name: str,
    command: list[str],
    inputs: Collection[BuildFile | str] = (),
    namespace: FileNamespace = FileNamespace.GEN,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
    tools: Collection[str | Path] = (),
    needs: str | None = None,
) -> BuildFile:
    """Declare a subprocess action producing the file ``name``; returns that file.

    ``needs`` names a device the command runs on (``cuda:sm_90``, ``hip``:
    ``kiln.devices.identity``): its key holds that device's identity, a cluster runs it on
    a worker with the device, and where there is none it is skipped (it fails with
    ``--require-devices``).

    The command runs in the output directory, with kiln's controlled environment
    (``kiln.base.action_env``) and ``env``; ``{out}``, ``{inputs[i]}`` and ``{tools[i]}``
    stand for paths relative to it. The files of the project that the command
    runs are inputs of the action, keyed by their content: its program when that
    is a path (``./gen.sh``), the script an interpreter is given (``python3
    gen.py``, ``sh gen.sh``), and ``tools`` (each also ``{tools[i]}``). Their
    relative paths are the build module directory's.
    """
    context = BuildContext.current()
    if isinstance(command, str) or not command:
        raise BuildDefinitionError(
            f"run_command(name={name!r}): command must be a non-empty list of arguments"
        )
    site = DefinitionSite.capture()
    if not all(isinstance(arg, str) for arg in command):
        raise BuildDefinitionError(
            f"run_command(name={name!r}) at {site}: every argument of the command must be "
            f"a string, got {command!r}"
        )
    try:
        variables = check_variables(env or {}, f"run_command(name={name!r}, env=...)")
    except UsageError as e:
        raise BuildDefinitionError(f"{e} (at {site})") from None
    base = Path(site.filename).parent
    files = list(dict.fromkeys(_tool(context, base, t, f"{name!r} at {site}") for t in tools))
    argv = _programs(list(command), context, base, files)
    input_files = context.files(list(inputs))
    output = context.allocate_file(name, namespace)
    action = CommandAction(
        argv=argv,
        inputs=input_files,
        output=output,
        timeout=timeout,
        env=variables,
        tools=files,
        desc=f"Running {output.path}",
        executor=context.executor,
        concurrency=ActionConcurrency.THREAD,
        deps=[*input_files, *files],
        needs=needs,
    )
    output.deps.add(action)
    return output


# Programs that run a script file given as their first argument that is no option.
_INTERPRETER = re.compile(
    r"(python|pypy)[0-9.]*|(ba|da|z|k|c|tc)?sh|node|perl|ruby|Rscript|lua|tclsh|php"
)
# Options after which an interpreter runs code given on the command line, not a file.
_INLINE_CODE = frozenset({"-c", "-e", "-m", "-E", "--eval", "--command", "-r"})


def _programs(
    argv: list[str], context: BuildContext, base: Path, tools: list[BuildFile]
) -> list[str]:
    """``argv`` with the files of the project it runs (its program given as a path,
    an interpreter's script) replaced by ``{tools[i]}``; those files are added to
    ``tools``."""
    positions = [0] if "/" in argv[0] else []
    if _INTERPRETER.fullmatch(os.path.basename(argv[0])) or argv[0] == sys.executable:
        for i, arg in enumerate(argv[1:], start=1):
            if arg in _INLINE_CODE:
                break
            if not arg.startswith("-"):
                positions.append(i)
                break
    root = Path(context.registry.source_root).resolve()
    out = list(argv)
    for i in positions:
        path = _project_file(argv[i], base, root)
        if path is not None:
            tool = _source_of(context, path, root)
            if tool not in tools:
                tools.append(tool)
            out[i] = f"{{tools[{tools.index(tool)}]}}"
    return out


def _project_file(arg: str, base: Path, root: Path) -> Path | None:
    """The file of the project that ``arg`` names, if it names one: a relative path
    (from ``base``) or an absolute one inside ``root``; no placeholder."""
    if not arg or "{" in arg or "}" in arg or "\0" in arg:
        return None
    candidate = Path(arg) if os.path.isabs(arg) else base / arg
    try:
        if not candidate.is_file():
            return None
        resolved = candidate.resolve()
    except (OSError, ValueError):
        return None
    if os.path.isabs(arg) and not resolved.is_relative_to(root):
        return None  # an absolute path outside the project: a program of the system
    return resolved


def _source_of(context: BuildContext, path: Path, root: Path) -> BuildFile:
    name = path.relative_to(root).as_posix() if path.is_relative_to(root) else path.name
    return _source(context, path, name)


def _tool(context: BuildContext, base: Path, tool: str | Path, where: str) -> BuildFile:
    """A file declared in ``run_command(tools=...)``: it must exist."""
    path = Path(tool) if os.path.isabs(tool) else base / tool
    if not path.is_file():
        raise BuildDefinitionError(
            f"run_command(name={where}): tool {str(tool)!r} is not a file "
            f"({path.resolve()} does not exist or is no regular file)"
        )
    root = Path(context.registry.source_root).resolve()
    return _source_of(context, path.resolve(), root)
