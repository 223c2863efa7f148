"""Actions that run a program: ``run_command``, and ``source_file`` for inputs."""

from __future__ import annotations

import os
import posixpath
import subprocess
import uuid
from collections.abc import Callable, Collection
from pathlib import Path

from kiln._reaper import kill_leftovers
from kiln._redact import redact_urls
from kiln.actions._files import atomic_output
from kiln.actions._logs import open_log, read_tail
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
from kiln.runners import kill_group

# The environment variable that marks every process of one command.
_COMMAND_TAG = "KILN_COMMAND_ID"


def source_file(path: str | Path, *, name: str | None = None) -> BuildFile:
    """A file of the source tree (relative to the calling build module's directory),
    tracked by content. ``name`` is its graph name (default: ``path``)."""
    context = BuildContext.current()
    site = DefinitionSite.capture()
    fs_path = (Path(site.filename).parent / path).resolve()
    if not fs_path.is_file():
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


class CommandAction(BuildAction):
    """Runs ``argv`` (no shell) with ``{out}`` and ``{inputs[i]}`` substituted; the
    output is renamed into place only when the command exits 0 having written it.
    What the command prints goes to its log file, never into kiln's memory; a
    failure shows a tail of the log bounded in bytes. Its ``timeout`` kills the
    command and everything it started."""

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

    @property
    def log_path(self) -> str:
        return self.run_context.log_path(self.output)

    def _invoke(self) -> None:
        input_paths = [str(f.get_fs_path()) for f in self.inputs]
        final = self.output.get_fs_path()
        with atomic_output(final, create=False) as tmp:
            self._run(self._format(str(tmp), input_paths))
            if not os.path.lexists(tmp):
                raise ActionFailed(f"'{self.desc}' finished without writing its output {final}")

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

    def _run(self, argv: list[str]) -> None:
        shown = redact_urls(subprocess.list2cmdline(argv))
        log = self.log_path
        fd = open_log(log, header=f"$ {shown}\n")
        # Every process the command starts carries this in its environment, even
        # one that daemonizes, so that what it leaves running can be found.
        run_id = uuid.uuid4().hex
        try:
            # Both streams straight into the log, in order: kiln holds none of it.
            proc = subprocess.Popen(
                argv, stdout=fd, stderr=fd, start_new_session=True,
                env={**os.environ, _COMMAND_TAG: run_id},
            )  # fmt: skip
        except OSError as e:
            raise ActionFailed(f"'{self.desc}': cannot run {argv[0]!r}: {e.strerror}") from e
        finally:
            os.close(fd)
        self.run_context.track(proc, running=True)
        try:
            proc.wait(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            proc.wait()
            kill_leftovers(f"{_COMMAND_TAG}={run_id}")
            raise ActionTimeout(
                f"'{self.desc}' ran past its timeout of {self.timeout:g} s and was killed"
            ) from None
        finally:
            self.run_context.track(proc, running=False)
        # The command is over: so is everything it started.
        left = kill_leftovers(f"{_COMMAND_TAG}={run_id}")
        if proc.returncode != 0:
            raise ActionFailed(
                f"'{self.desc}': command exited with status {proc.returncode}: {shown}\n"
                f"{read_tail(log)}".rstrip()
            )
        if left:
            self.run_context.write_status(
                f"warning: '{self.desc}' left {len(left)} process(es) running after its "
                f"command ended; killed: {', '.join(left)}"
            )


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
