"""Actions that run a program: ``run_command``, and ``source_file`` for inputs."""

from __future__ import annotations

import functools
import os
import posixpath
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Collection
from contextlib import AbstractContextManager
from pathlib import Path

from kiln._redact import redact_urls
from kiln._spawn import Ended, Finish, Finished, SpawnsCommand
from kiln.actions._files import atomic_output
from kiln.actions._logs import read_tail
from kiln.errors import ActionFailed, ActionTimeout, BuildDefinitionError
from kiln.graph import (
    ActionConcurrency,
    BuildAction,
    BuildContext,
    BuildFile,
    DefinitionSite,
    FileNamespace,
    join_namespace,
)


def source_file(path: str | Path, *, name: str | None = None) -> BuildFile:
    """A file or directory of the source tree (relative to the calling build module's
    directory), tracked by content (a directory by its tree: names, executable bits,
    contents). ``name`` is its graph name (default: ``path``)."""
    context = BuildContext.current()
    site = DefinitionSite.capture()
    fs_path = (Path(site.filename).parent / path).resolve()
    if not (fs_path.is_file() or fs_path.is_dir()):
        where = context.path or "<root>"
        raise BuildDefinitionError(
            f"source file {fs_path} does not exist (source_file({str(path)!r}) in "
            f"entrypoint '{where}', at {site})"
        )
    # Normalised as ``BuildContext.file`` normalises names, so the file can be named.
    graph_path = posixpath.normpath(
        join_namespace(context.path, name or Path(path).as_posix().lstrip("/"))
    )
    existing = context.registry.all.get(graph_path)
    if isinstance(existing, BuildFile) and existing.source == fs_path:
        return existing
    return BuildFile(executor=context.executor, path=graph_path, source=fs_path)


class CommandAction(BuildAction, SpawnsCommand):
    """Runs ``argv`` (no shell) with ``{out}`` and ``{inputs[i]}`` substituted; the
    output is renamed into place only when the command exits 0 having written it.
    What the command prints goes to its log file, never into kiln's memory; a
    failure shows a tail of the log bounded in bytes. Its ``timeout`` kills the
    command and everything it started.

    The command is started by the build's ``CommandRunner`` (``kiln._spawn``):
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
        **kwargs: object,
    ):
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.argv = list(argv)
        self.inputs = inputs
        self.output = output
        self.timeout = timeout
        self._log: str | None = None  # the log of its last run

    @property
    def log_path(self) -> str | None:
        """The log its last run wrote (``.kiln/logs/<output path>.log``); None when
        the command printed nothing (or has not run)."""
        return self._log

    def _invoke(self) -> None:
        """Run the command and wait for it (the scheduler does not wait: ``_spawn``)."""
        ended = threading.Event()
        rest: list[Finish] = []

        def finished(finish: Finish, size: int) -> None:
            rest.append(finish)
            ended.set()

        self._spawn(finished)
        ended.wait()
        rest[0]()

    def _spawn(self, finished: Finished) -> None:
        input_paths = [str(f.get_fs_path()) for f in self.inputs]
        final = self.output.get_fs_path()
        commit = atomic_output(final, create=False)
        tmp = commit.__enter__()
        try:
            argv = self._format(str(tmp), input_paths)
            # How the command is shown (log header, failure): only made when needed.
            shown = functools.cache(lambda: redact_urls(subprocess.list2cmdline(argv)))
            self._log = None
            spool = self.run_context.spools.take()
            # Every process the command starts carries a tag in its environment, even
            # one that daemonizes, so that what it leaves running can be found.
            try:
                self.run_context.commands.spawn(
                    argv,
                    log_fd=spool,
                    tag=uuid.uuid4().hex,
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
                raise ActionFailed(
                    f"'{self.desc}': command exited with status {ended.returncode}: {shown()}\n"
                    f"{read_tail(log) if log else '(it printed nothing)'}".rstrip()
                )
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

    def _sandbox_command(self, path: Callable[[BuildFile], str]) -> tuple[list[str], list[str]]:
        """The argv template and its inputs' places, for a run in a remote sandbox
        (``kiln.remote_exec``): the worker formats it with sandbox paths."""
        inputs = [path(f) for f in self.inputs]
        self._format(path(self.output), inputs)  # a bad template fails here, not remotely
        return list(self.argv), inputs

    def _format(self, out: str, inputs: list[str]) -> list[str]:
        try:
            return [a.format(out=out, inputs=inputs) for a in self.argv]
        except (IndexError, KeyError, ValueError) as e:
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
) -> BuildFile:
    """Declare a subprocess action producing the file ``name``; returns that file."""
    context = BuildContext.current()
    if isinstance(command, str) or not command:
        raise BuildDefinitionError(
            f"run_command(name={name!r}): command must be a non-empty list of arguments"
        )
    input_files = context.files(list(inputs))
    output = context.allocate_file(name, namespace)
    action = CommandAction(
        argv=command,
        inputs=input_files,
        output=output,
        timeout=timeout,
        desc=f"Running {output.path}",
        executor=context.executor,
        concurrency=ActionConcurrency.THREAD,
        deps=input_files,
    )
    output.deps.add(action)
    return output
