"""Actions that run a program: ``run_command``, and ``source_file`` for inputs."""

from __future__ import annotations

import posixpath
import subprocess
from collections.abc import Collection
from pathlib import Path

from kiln.actions._files import atomic_output
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

_OUTPUT_TAIL_LINES = 20


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
    existing = context.executor.all.get(graph_path)
    if isinstance(existing, BuildFile) and existing.source == fs_path:
        return existing
    return BuildFile(executor=context.executor, path=graph_path, source=fs_path)


class CommandAction(BuildAction):
    """Runs ``argv`` (no shell) with ``{out}`` and ``{inputs[i]}`` substituted; the
    output is renamed into place only when the command exits 0, and a failure shows
    the tail of what the command printed."""

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

    def _invoke(self) -> None:
        input_paths = [str(f.get_fs_path()) for f in self.inputs]
        with atomic_output(self.output.get_fs_path(), create=False) as tmp:
            try:
                argv = [a.format(out=str(tmp), inputs=input_paths) for a in self.argv]
            except (IndexError, KeyError, ValueError) as e:
                raise ActionFailed(
                    f"'{self.desc}': cannot format the command {self.argv}: {e!r}; "
                    "use {out} and {inputs[i]}, and {{ and }} for literal braces"
                ) from None
            self._run(argv)

    def _run(self, argv: list[str]) -> None:
        try:
            # One pipe for both streams: the tail shows a failure's last words in
            # order, and without a timeout ``communicate`` then simply reads it.
            proc = subprocess.Popen(
                argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
            )
        except OSError as e:
            raise ActionFailed(f"'{self.desc}': cannot run {argv[0]!r}: {e.strerror}") from e
        self.executor.track(proc, running=True)
        try:
            output, _ = proc.communicate(timeout=self.timeout)
        except subprocess.TimeoutExpired:
            kill_group(proc.pid)
            proc.communicate()
            raise ActionTimeout(
                f"'{self.desc}' ran past its timeout of {self.timeout:g} s and was killed"
            ) from None
        finally:
            self.executor.track(proc, running=False)
        if proc.returncode != 0:
            tail = "\n".join(output.decode(errors="replace").splitlines()[-_OUTPUT_TAIL_LINES:])
            raise ActionFailed(
                f"'{self.desc}': command exited with status {proc.returncode}: "
                f"{subprocess.list2cmdline(argv)}\n{tail}".rstrip()
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
