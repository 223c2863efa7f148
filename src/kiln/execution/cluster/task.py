"""What runs on a Dask worker: one action in a private sandbox.

The task is plain data (``RemoteTask``). ``run_task`` makes a sandbox directory
under the worker's local directory, fetches every input from the remote CAS (by
way of a per-worker CAS beside it, verified against its digest), runs the action
with the sandbox as its working directory, in a process of its own so that
nothing an earlier action did to the worker is seen, uploads the outputs to the
remote CAS and returns their digests (a small output's bytes too, so that kiln
need not fetch it back). The sandbox is removed afterwards.

A command runs as a child process. A thunk runs in a worker forked from kiln's
clean, pre-imported template (``kiln.execution.process.pool.ProcessPool``), as it would on
kiln's machine, instead of a fresh interpreter importing kiln's tools each time.
What a Dask worker process keeps between tasks (``_WorkerState``): its CAS
client with its kept-alive connections, one per build.

An action that runs and fails is a result (``RemoteResult.error``), not an
exception: Dask retries only what went wrong around it (a lost worker, a CAS that
did not answer).
"""

from __future__ import annotations

import contextlib
import dataclasses
import multiprocessing
import os
import select
import shutil
import stat
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.base.action_env import ActionEnvironment
from kiln.base.errors import SandboxFailure
from kiln.base.iree_shim import activated as iree_build_shim
from kiln.cache.local import LocalCache
from kiln.cache.remote import SMALL_BLOB, RemoteCache
from kiln.execution.cluster.versions import Versions, differences, installed
from kiln.execution.process.groups import kill_group, pidfd
from kiln.output_dir.digests import hash_file
from kiln.output_dir.names import path_below

if TYPE_CHECKING:  # imported when a thunk first runs
    from kiln.execution.process.pool import ProcessPool

_TAIL_BYTES = 4000
_POLL_S = 0.1


@dataclass(frozen=True)
class RemoteTask:
    """One action as a worker receives it. Paths are relative to the sandbox, which
    is laid out as kiln's output directory (``kiln.planning.sandbox``); ``command`` is the
    argv as kiln runs it there, ``thunk`` a cloudpickled callable built against
    those paths. Exactly one of them is set. Both run in the sandbox with kiln's
    controlled environment and ``env``."""

    desc: str
    cas_url: str
    build: str  # one id per build: what a worker knows of the remote lasts one build
    inputs: tuple[tuple[str, str], ...]  # (relative path, sha256)
    outputs: tuple[str, ...]
    command: tuple[str, ...] | None = None
    thunk: bytes | None = None
    timeout: float | None = None
    env: tuple[tuple[str, str], ...] = ()  # the declared variables (``kiln.base.action_env``)
    executable: tuple[str, ...] = ()  # the inputs that are programs: made executable
    # Whether the thunk's ``iree.build`` imports resolve to kiln (``kiln.base.iree_shim``),
    # as in the kiln that sent it.
    iree_build_shim: bool = False
    # The versions of kiln and of the tools that the action's key holds: a worker
    # with others does not run it (``kiln.execution.cluster.versions``).
    versions: Versions = ()


@dataclass(frozen=True)
class RemoteResult:
    """What came back: who ran it, where, and the outputs' digests or the error;
    ``inline`` holds the bytes of the small outputs (also in the remote CAS);
    ``versions`` the worker's versions of what the task's key holds (None from a
    kiln that does not say: kiln refuses its result); ``reached`` what a thunk
    reached while it ran (``kiln.base.reached.Reached.as_data``: paths of the worker's
    machine, which kiln checks on its own)."""

    worker: str
    sandbox: str
    outputs: dict[str, str] = field(default_factory=dict)
    inline: dict[str, bytes] = field(default_factory=dict)
    error: str | None = None
    seconds: float = 0.0
    versions: Versions | None = None
    reached: Any = None


def inside(root: Path, rel: str) -> Path:
    """``rel`` under ``root``; a path that would leave it is refused."""
    found = path_below(root, rel)
    if found is None:
        raise SandboxFailure(f"refusing sandbox path {rel!r}")
    return found


class _WorkerState:
    """What one Dask worker process keeps between kiln's tasks: the CAS client of
    the current build (its kept-alive connections, the blobs it knows are there),
    the warnings it gave, and the pool whose template its thunks are forked from.
    Invariant: ``remote`` serves ``key`` only, and is replaced when it stopped being
    usable (a later task tries the remote again)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.key: tuple[str, str] | None = None
        self.remote: RemoteCache | None = None
        self.warnings: list[str] = []
        self._pools: dict[tuple[tuple[str, str], ...], ProcessPool] = {}

    def pool(self, root: Path, env: tuple[tuple[str, str], ...] = ()) -> ProcessPool:
        """This worker process's pool of fresh processes for the declared variables
        ``env``, forked from one template that lives as long as the Dask worker
        (each thunk still gets a new process, in its own sandbox directory)."""
        from kiln.execution.process.pool import ProcessPool

        with self.lock:
            pool = self._pools.get(env)
            if pool is None:
                _allow_children()
                scratch = root / "tmp"
                scratch.mkdir(parents=True, exist_ok=True)
                variables = ActionEnvironment(dict(env)).variables(str(scratch))
                pool = self._pools[env] = ProcessPool(variables, str(root))
            return pool

    def remote_for(self, task: RemoteTask) -> RemoteCache:
        with self.lock:
            remote = self.remote
            if (
                remote is None
                or self.key != (task.cas_url, task.build)
                or (remote.disabled or not remote.uploads)
            ):
                if remote is not None:
                    remote.close()
                self.warnings = []
                remote = RemoteCache(task.cas_url, warn=self.warnings.append)
                self.key, self.remote = (task.cas_url, task.build), remote
            return remote


def _state(worker: Any) -> _WorkerState:
    """The worker's ``_WorkerState`` (made on its first kiln task)."""
    state = vars(worker).setdefault("_kiln_state", _WorkerState())
    assert isinstance(state, _WorkerState)
    return state


def run_task(task: RemoteTask) -> RemoteResult:
    """Run ``task`` on this Dask worker (the function Dask calls)."""
    from distributed import get_worker

    worker = get_worker()
    mine = installed(name for name, _ in task.versions)
    if mine != task.versions:  # built here, it would enter the build under a wrong key
        why = differences(task.versions, mine)
        return RemoteResult(worker.address, "", error=f"not run: {why}", versions=mine)
    result = _run_checked(task, worker)
    return dataclasses.replace(result, versions=mine)


def _run_checked(task: RemoteTask, worker: Any) -> RemoteResult:
    """``run_task`` on a worker that has the versions the task's key holds."""
    root = Path(worker.local_directory) / "kiln"
    root.mkdir(parents=True, exist_ok=True)
    state = _state(worker)
    remote = state.remote_for(task)
    sandbox = Path(tempfile.mkdtemp(prefix="sandbox-", dir=root))
    try:
        _fetch_inputs(task, sandbox, LocalCache(root / "cache"), remote)
        for rel in task.outputs:
            inside(sandbox, rel).parent.mkdir(parents=True, exist_ok=True)
        reached: list[Any] = []
        error = _run(task, sandbox, _cancel_check(worker), reached)
        if error is not None:
            return RemoteResult(worker.address, str(sandbox), error=error)
        try:
            outputs, inline = _store_outputs(task, sandbox, remote)
        except _Missing as e:
            return RemoteResult(worker.address, str(sandbox), error=str(e))
        if remote.disabled or not remote.uploads:
            why = "; ".join(state.warnings) or "uploads refused"
            raise SandboxFailure(
                f"cannot store the outputs of '{task.desc}' in the remote cache: {why}"
            )
        return RemoteResult(
            worker.address,
            str(sandbox),
            outputs=outputs,
            inline=inline,
            reached=reached[0] if reached else None,
        )
    finally:
        shutil.rmtree(sandbox, ignore_errors=True)


def _fetch_inputs(task: RemoteTask, sandbox: Path, cas: LocalCache, remote: RemoteCache) -> None:
    for rel, digest in task.inputs:
        dest = inside(sandbox, rel)
        if not cas.has_blob(digest) and not remote.fetch_blob(digest, cas):
            raise SandboxFailure(
                f"input {rel} of '{task.desc}' (sha256 {digest}) is not in "
                f"the remote cache {remote.shown}"
            )
        dest.parent.mkdir(parents=True, exist_ok=True)
        mode = 0o755 if rel in task.executable else 0o644
        if cas.copy_blob(digest, dest, mode) != digest:
            cas.remove_blob(digest)
            raise SandboxFailure(
                f"input {rel} of '{task.desc}': the worker's cached copy was damaged; removed it"
            )


def _run(
    task: RemoteTask, sandbox: Path, cancelled: Callable[[], bool], reached: list[Any]
) -> str | None:
    """Run the command or thunk in ``sandbox``; the failure's text, or None. What a
    thunk reached while it ran goes to ``reached``."""
    if task.command is None:
        return _run_thunk(task, sandbox, cancelled, reached)
    log = sandbox / ".kiln-action.log"
    argv = list(task.command)
    scratch = sandbox / ".kiln" / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    env = ActionEnvironment(dict(task.env)).variables(str(scratch))
    with open(log, "wb") as fd:
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=fd,
                stderr=fd,
                cwd=sandbox,
                env=env,
                start_new_session=True,
            )
        except OSError as e:
            return f"cannot run {argv[0]!r}: {e.strerror}"
    stopped = _wait(proc, task.timeout, cancelled)
    if stopped is not None:
        return stopped
    if proc.returncode == 0:
        return None
    tail = log.read_bytes()[-_TAIL_BYTES:].decode(errors="replace").rstrip()
    return f"command exited with status {proc.returncode}\n{tail}".rstrip()


def _wait(
    proc: subprocess.Popen[bytes], timeout: float | None, cancelled: Callable[[], bool]
) -> str | None:
    """Wait for ``proc``; kill its process group if it runs past ``timeout`` or the
    task is cancelled (the build was interrupted), and say which. The wait sleeps
    on a pidfd, so that the end of the command is seen at once."""
    deadline = None if timeout is None else time.monotonic() + timeout
    fd = pidfd(proc.pid)
    try:
        while True:
            left = _POLL_S if deadline is None else min(_POLL_S, deadline - time.monotonic())
            if fd is not None:
                select.select([fd], [], [], max(0.0, left))
                ended = proc.poll() is not None
            else:
                try:
                    proc.wait(timeout=max(0.0, left))
                    ended = True
                except subprocess.TimeoutExpired:
                    ended = False
            if ended:
                return None
            late = deadline is not None and time.monotonic() > deadline
            if late or cancelled():
                kill_group(proc.pid)
                proc.wait()
                if late:
                    return f"ran past its timeout of {timeout:g} s and was killed"
                return "cancelled: the build stopped"
    finally:
        if fd is not None:
            os.close(fd)


def _run_thunk(
    task: RemoteTask, sandbox: Path, cancelled: Callable[[], bool], reached: list[Any]
) -> str | None:
    """Run the thunk in a worker process forked from this Dask worker's template,
    with the sandbox as its working directory; kill it when the task is cancelled."""
    from distributed import get_worker

    with iree_build_shim(task.iree_build_shim):
        pool = _state(get_worker()).pool(sandbox.parent, task.env)
        return _run_thunk_here(task, sandbox, cancelled, pool, reached)


def _run_thunk_here(
    task: RemoteTask,
    sandbox: Path,
    cancelled: Callable[[], bool],
    pool: ProcessPool,
    reached: list[Any],
) -> str | None:
    import cloudpickle

    thunk = cloudpickle.loads(task.thunk or b"")
    failure: list[BaseException] = []
    kill: list[Callable[[], None]] = []

    def body() -> None:
        try:
            found = pool.run(
                thunk,
                task.desc,
                task.timeout,
                cwd=str(sandbox),
                started=kill.append,
            )
            reached.append(found.as_data())
        except BaseException as e:  # noqa: BLE001 - the action's failure, reported
            failure.append(e)

    runner = threading.Thread(target=body, name="kiln-thunk", daemon=True)
    runner.start()
    while runner.is_alive():
        runner.join(_POLL_S)
        if runner.is_alive() and cancelled():
            for stop in kill:
                stop()
            runner.join()
            return "cancelled: the build stopped"
    if not failure:
        return None
    return f"{type(failure[0]).__name__}: {failure[0]}"


def warm_template(dask_worker: Any) -> None:
    """Start this worker's template of kiln's worker processes now, on a thread of
    its own, so that the first thunk does not wait for it (``client.run`` calls this
    on every worker when kiln connects; it returns at once)."""
    root = Path(dask_worker.local_directory) / "kiln"

    def warm() -> None:
        root.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(Exception):  # the first thunk meets what is wrong
            _state(dask_worker).pool(root).run(os.getpid, "starting kiln's worker template", None)

    threading.Thread(target=warm, name="kiln-warm-template", daemon=True).start()


def _allow_children() -> None:
    """Let this worker process fork kiln's template workers: Dask starts its worker
    processes as daemons, which ``multiprocessing`` lets have no children. The
    children need no daemon's reaping: each watches the worker through a pipe and
    is killed with its process group when its action ends."""
    me = multiprocessing.current_process()
    if me.daemon:
        me.daemon = False


def _cancel_check(worker: Any) -> Callable[[], bool]:
    """Whether the client cancelled this task (Dask cannot interrupt a running task:
    the task looks at its own state on the worker instead)."""
    key = worker.get_current_task()

    def cancelled() -> bool:
        ts = worker.state.tasks.get(key)
        return ts is None or ts.state in ("cancelled", "released", "forgotten")

    return cancelled


def _store_outputs(
    task: RemoteTask, sandbox: Path, remote: RemoteCache
) -> tuple[dict[str, str], dict[str, bytes]]:
    """Put the outputs into the remote CAS: their digests, and the small ones' bytes."""
    outputs, inline = {}, {}
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
        if st.st_size <= SMALL_BLOB:
            inline[rel] = path.read_bytes()
    return outputs, inline


class _Missing(SandboxFailure):
    """The action ran but its output is not there."""
