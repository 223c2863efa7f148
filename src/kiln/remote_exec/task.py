"""What runs on a Dask worker: one action in a private sandbox.

The task is plain data (``RemoteTask``). ``run_task`` makes a sandbox directory
under the worker's local directory, fetches every input from the remote CAS (by
way of a per-worker CAS beside it, verified against its digest), runs the action
with the sandbox as its working directory, in a fresh process so that nothing an
earlier action did to the worker is seen, uploads the outputs to the remote CAS
and returns their digests. The sandbox is removed afterwards.

An action that runs and fails is a result (``RemoteResult.error``), not an
exception: Dask retries only what went wrong around it (a lost worker, a CAS that
did not answer).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from kiln.cache.local import LocalCache, copy_verified
from kiln.state import hash_file

_TAIL_BYTES = 4000
_POLL_S = 0.1
# Runs a cloudpickled thunk read from stdin; an exception is its message on stderr.
_RUN_THUNK = (
    "import sys, cloudpickle\n"
    "thunk = cloudpickle.loads(sys.stdin.buffer.read())\n"
    "try:\n"
    "    thunk()\n"
    "except BaseException as e:\n"
    "    print(f'{type(e).__name__}: {e}', file=sys.stderr)\n"
    "    sys.exit(1)\n"
)


class _SandboxFailure(Exception):
    """The sandbox could not be prepared or the outputs not stored (Dask retries it)."""


@dataclass(frozen=True)
class RemoteTask:
    """One action as a worker receives it. Paths are relative to the sandbox;
    ``command`` is an argv template (``{out}``, ``{inputs[i]}``) formatted with
    sandbox paths on the worker, ``thunk`` a cloudpickled callable built against
    relative paths. Exactly one of them is set."""

    desc: str
    cas_url: str
    inputs: tuple[tuple[str, str], ...]  # (relative path, sha256)
    outputs: tuple[str, ...]
    command: tuple[str, ...] | None = None
    command_inputs: tuple[str, ...] = ()
    thunk: bytes | None = None
    timeout: float | None = None


@dataclass(frozen=True)
class RemoteResult:
    """What came back: who ran it, where, and the outputs' digests or the error."""

    worker: str
    sandbox: str
    outputs: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0


def inside(root: Path, rel: str) -> Path:
    """``rel`` under ``root``; a path that would leave it is refused."""
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        raise _SandboxFailure(f"refusing sandbox path {rel!r}")
    return root.joinpath(*p.parts)


def run_task(task: RemoteTask) -> RemoteResult:
    """Run ``task`` on this Dask worker (the function Dask calls)."""
    from distributed import get_worker

    from kiln.cache.remote import RemoteCache

    worker = get_worker()
    root = Path(worker.local_directory) / "kiln"
    root.mkdir(parents=True, exist_ok=True)
    warnings: list[str] = []
    remote = RemoteCache(task.cas_url, warn=warnings.append)
    sandbox = Path(tempfile.mkdtemp(prefix="sandbox-", dir=root))
    try:
        _fetch_inputs(task, sandbox, LocalCache(root / "cache"), remote)
        for rel in task.outputs:
            inside(sandbox, rel).parent.mkdir(parents=True, exist_ok=True)
        error = _run(task, sandbox, _cancel_check(worker))
        if error is not None:
            return RemoteResult(worker.address, str(sandbox), error=error)
        try:
            outputs = _store_outputs(task, sandbox, remote)
        except _Missing as e:
            return RemoteResult(worker.address, str(sandbox), error=str(e))
        if remote.disabled or not remote.uploads:
            raise _SandboxFailure(f"cannot store the outputs of '{task.desc}' in the remote "
                                  f"cache: {'; '.join(warnings) or 'uploads refused'}")  # fmt: skip
        return RemoteResult(worker.address, str(sandbox), outputs=outputs)
    finally:
        shutil.rmtree(sandbox, ignore_errors=True)


def _fetch_inputs(task: RemoteTask, sandbox: Path, cas: LocalCache, remote: object) -> None:
    from kiln.cache.remote import RemoteCache

    assert isinstance(remote, RemoteCache)
    for rel, digest in task.inputs:
        dest = inside(sandbox, rel)
        if not cas.has_blob(digest) and not remote.fetch_blob(digest, cas):
            raise _SandboxFailure(f"input {rel} of '{task.desc}' (sha256 {digest}) is not in "
                                  f"the remote cache {remote.shown}")  # fmt: skip
        dest.parent.mkdir(parents=True, exist_ok=True)
        if copy_verified(cas.blob_path(digest), dest) != digest:
            cas.remove_blob(digest)
            raise _SandboxFailure(f"input {rel} of '{task.desc}': the worker's cached copy "
                                  "was damaged; removed it")  # fmt: skip
        os.chmod(dest, 0o644)


def _run(task: RemoteTask, sandbox: Path, cancelled: Callable[[], bool]) -> str | None:
    """Run the command or thunk in ``sandbox``; the failure's text, or None."""
    log = sandbox / ".kiln-action.log"
    if task.command is not None:
        out = str(inside(sandbox, task.outputs[0]))
        ins = [str(inside(sandbox, rel)) for rel in task.command_inputs]
        argv = [a.format(out=out, inputs=ins) for a in task.command]
        stdin = None
    else:
        argv = [sys.executable, "-c", _RUN_THUNK]
        stdin = task.thunk
    with open(log, "wb") as fd:
        try:
            proc = subprocess.Popen(argv, stdin=subprocess.PIPE if stdin else None, stdout=fd,
                                    stderr=fd, cwd=sandbox, start_new_session=True)  # fmt: skip
        except OSError as e:
            return f"cannot run {argv[0]!r}: {e.strerror}"
    stopped = _wait(proc, stdin, task.timeout, cancelled)
    if stopped is not None:
        return stopped
    if proc.returncode == 0:
        return None
    tail = log.read_bytes()[-_TAIL_BYTES:].decode(errors="replace").rstrip()
    what = "command" if task.command is not None else "action"
    return f"{what} exited with status {proc.returncode}\n{tail}".rstrip()


def _wait(proc: subprocess.Popen[bytes], stdin: bytes | None, timeout: float | None,
          cancelled: Callable[[], bool]) -> str | None:  # fmt: skip
    """Wait for ``proc``; kill its process group if it runs past ``timeout`` or the
    task is cancelled (the build was interrupted), and say which."""
    if proc.stdin is not None:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(stdin or b"")
        proc.stdin.close()
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        try:
            proc.wait(timeout=_POLL_S)
            return None
        except subprocess.TimeoutExpired:
            pass
        late = deadline is not None and time.monotonic() > deadline
        if late or cancelled():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            if late:
                return f"ran past its timeout of {timeout:g} s and was killed"
            return "cancelled: the build stopped"


def _cancel_check(worker: Any) -> Callable[[], bool]:
    """Whether the client cancelled this task (Dask cannot interrupt a running task:
    the task looks at its own state on the worker instead)."""
    key = worker.get_current_task()

    def cancelled() -> bool:
        ts = worker.state.tasks.get(key)
        return ts is None or ts.state in ("cancelled", "released", "forgotten")

    return cancelled


def _store_outputs(task: RemoteTask, sandbox: Path, remote: object) -> dict[str, str]:
    from kiln.cache.remote import RemoteCache

    assert isinstance(remote, RemoteCache)
    outputs = {}
    for rel in task.outputs:
        path = inside(sandbox, rel)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            raise _Missing(f"'{task.desc}' finished without writing its output {rel}") from None
        if not stat.S_ISREG(st.st_mode):
            raise _Missing(f"'{task.desc}' left something other than a regular file at {rel}")
        digest = hash_file(path, follow=False)
        remote.put_blob(digest, path)
        outputs[rel] = digest
    return outputs


class _Missing(_SandboxFailure):
    """The action ran but its output is not there."""
