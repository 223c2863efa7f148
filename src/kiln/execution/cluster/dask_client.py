"""kiln's side of remote execution: a Dask client that runs remotable actions.

The scheduler hands an action to ``DaskClient.run`` on one of its ``-j`` worker
threads, so ``-j`` bounds the actions in flight on the cluster. ``run`` makes sure
the action's inputs are in the remote CAS, queues a ``RemoteTask`` (submitted in
batches, ``kiln.execution.cluster.batching``), waits for its ``RemoteResult`` and
returns the outputs' digests and the worker that ran it; the scheduler then
materializes them from the CAS, as for a cache hit.

Mismatched workers: a worker running another kiln, or other versions of the
tools an action's key holds, is refused (``kiln.execution.cluster.versions``): when kiln
connects (every worker's kiln) and for every result (kiln's and the keyed tools'
versions where it was built), so that no worker that joins later slips through.

Devices: every worker publishes its devices as resources when kiln connects or it
joins (``kiln.execution.cluster.worker_devices``); the build's checks run on the devices
the workers had then (``device_set``), each only on a worker with its device
(``_placement``). A check whose device no live worker has any more fails within
seconds rather than waiting (``_orphaned``).

Faults: a worker that dies mid-task is Dask's to handle (the task is rescheduled,
a check only on a worker with its device, up to
``distributed.scheduler.allowed-failures`` times, then ``KilledWorker``);
failures around the action (a CAS that did not answer) are retried ``RETRIES``
times. Losing the scheduler fails the actions in flight, and every later one at
once, naming the address.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import cloudpickle

from kiln.base.errors import ClusterFailure, SandboxFailure, UsageError
from kiln.base.iree_shim import active as iree_build_shim_active
from kiln.devices.identity import RESOURCE_PREFIX, DeviceSet
from kiln.execution.cluster.batching import Batcher, Slot
from kiln.execution.cluster.probe import probe
from kiln.execution.cluster.spec import ExecutorSpec
from kiln.execution.cluster.task import RemoteResult, RemoteTask, warm_template
from kiln.execution.cluster.versions import differences, expected, kiln_version
from kiln.graph import BuildAction, BuildFile
from kiln.planning.sandbox import sandbox_command, sandbox_paths, sandbox_thunk

RETRIES = 2
_CONNECT_TIMEOUT_S = 10.0
_LIVE_DEVICES_S = 1.0  # how old an answer to "which devices do live workers have" may be
# The LocalCluster kiln starts for ``dask-local``: Dask's per-process monitors
# (a statistical profiler sampling every 10 ms, an event-loop tick every 20 ms, a
# memory poll every 100 ms) cost each worker process about 3% of a core while
# idle; kiln's short tasks do not need them that often (docs/cluster.md). And the
# nanny's environment for its workers (MALLOC_TRIM_THRESHOLD_=65536, OMP_NUM_THREADS=1,
# ...) is not given to the workers: the actions run with kiln's controlled
# environment on every worker (``kiln.base.action_env``; a malloc trimming at 64 KiB
# slows iree-compile down).
LOCAL_CLUSTER_CONFIG: dict[str, Any] = {
    "distributed.nanny.pre-spawn-environ": {},
    "distributed.worker.profile.enabled": False,
    "distributed.admin.tick.interval": "1s",
    "distributed.worker.memory.monitor-interval": "1s",
    "distributed.admin.system-monitor.interval": "2s",
}


class DaskClient:
    """One build's connection to a Dask scheduler (and the LocalCluster behind it,
    for ``dask-local:N``).

    Invariants: every submitted future is in ``_futures`` until its result is
    taken; once ``lost`` is set no task is submitted; after ``close`` the cluster
    kiln started is gone.
    """

    def __init__(
        self, spec: ExecutorSpec, cas_url: str, *, connect_timeout_s: float = _CONNECT_TIMEOUT_S
    ):
        try:
            from distributed import Client, LocalCluster
        except ImportError:
            raise UsageError("--executor dask needs Dask: pip install 'kiln[dask]'") from None
        self.spec = spec
        self.cas_url = cas_url
        # Dask's own logs (reconnect tracebacks, worker chatter) are not kiln's
        # output: kiln reports what they mean for the build.
        self._log_levels = _quiet_loggers()
        self.lost: str | None = None
        self.build = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._futures: set[Any] = set()
        self._live_lock = threading.Lock()
        self._live: tuple[float, set[str]] | None = None  # when asked, what
        self._cluster: Any = None
        if spec.kind == "dask-local":
            import dask

            with dask.config.set(LOCAL_CLUSTER_CONFIG), _terminal_signals_held():
                self._cluster = LocalCluster(
                    n_workers=spec.workers,
                    threads_per_worker=1,
                    processes=True,
                    host="127.0.0.1",
                    dashboard_address=None,
                    silence_logs=logging.CRITICAL,
                    # Each worker process ignores the terminal's Ctrl-C (kept by the
                    # nanny for the workers it restarts): kiln shuts the cluster down.
                    preload=["kiln.execution.cluster.local_worker"],
                )
            address = self._cluster.scheduler_address
        else:
            address = spec.address
        self.address = address
        try:
            if self._cluster is None:  # someone else's address: is it a scheduler at all?
                probe(address, connect_timeout_s)
            self.client = _connect(Client, address, connect_timeout_s)
        except BaseException:
            self._close_cluster()
            raise
        try:
            self._check_workers(connect_timeout_s)
        except BaseException:
            with contextlib.suppress(Exception):
                self.client.close(timeout=5)
            self._close_cluster()
            raise
        self._publish_devices(connect_timeout_s)
        self.resources = self._advertised_resources()
        self.device_ids = {r[len(RESOURCE_PREFIX) :] for r in self.resources if is_device(r)}
        with contextlib.suppress(Exception):  # only a head start
            self.client.run(warm_template, wait=False)
        self._batcher = Batcher(self.client, RETRIES, self._submitted)

    def _check_workers(self, timeout_s: float) -> None:
        """ClusterFailure naming the first worker of the cluster that runs another
        kiln than this one, or cannot say which within ``timeout_s`` (one that joins
        later is refused by its first result)."""
        try:
            answers = _within(
                lambda: self.client.run(kiln_version, on_error="return"), timeout_s + 5.0
            )
        except Exception as e:  # noqa: BLE001 - the cluster's failure, said
            raise ClusterFailure(
                f"--executor: cannot ask the Dask workers at {self.address} which kiln "
                f"they run: {_short(e)}"
            ) from None
        for worker, answer in sorted(answers.items()):
            if answer == kiln_version():
                continue
            raise ClusterFailure(
                f"--executor: Dask worker {worker} runs {_which_kiln(answer)}; this is kiln "
                f"{kiln_version()}. "
                "What a worker builds enters this build and the caches under this kiln's "
                "keys: run the same kiln on every worker"
            )

    def _publish_devices(self, timeout_s: float) -> None:
        """Have every worker, and every one that joins later, publish its devices
        as resources (``kiln.execution.cluster.worker_devices``)."""
        from kiln.execution.cluster.worker_devices import DevicePublisher

        try:
            _within(lambda: self.client.register_plugin(DevicePublisher()), timeout_s + 30.0)
        except Exception as e:  # noqa: BLE001 - the cluster's failure, said
            raise ClusterFailure(
                f"--executor: the Dask workers at {self.address} cannot say which devices "
                f"they have: {_short(e)}"
            ) from None

    def device_set(self, require: bool = False) -> DeviceSet:
        """The devices of the cluster's workers, as they published them when kiln
        connected: where the build's checks run (``kiln.devices.identity``)."""
        return DeviceSet.of_ids(f"on the cluster at {self.address}", self.device_ids, require)

    def _placement(self, action: BuildAction) -> tuple[tuple[str, int], ...]:
        """The resources ``action`` takes on a worker: its pool's, where workers
        advertise it, and the device it runs on (``needs``), which only a worker
        that has that device advertises."""
        out = [(p, 1) for p in [action.pool] if p is not None and p in self.resources]
        if action.needs is not None:
            device = action.run_context.devices.resolve(action.needs)
            if device is not None:
                out.append((RESOURCE_PREFIX + device, 1))
        return tuple(out)

    def _orphaned(self, slot: Slot) -> str | None:
        """Why ``slot`` can never start: no live worker has the device it needs."""
        wanted = [r for r, _ in slot.resources if is_device(r)]
        if not wanted:
            return None
        if wanted[0] in self._live_devices():
            return None
        return f"no Dask worker with device {wanted[0][len(RESOURCE_PREFIX) :]} remains"

    def _live_devices(self) -> set[str]:
        """The device resources the live workers advertise, asked of the scheduler
        at most once every ``_LIVE_DEVICES_S`` for all the threads that wait (each
        answer is a round trip carrying every worker's state)."""
        with self._live_lock:
            now = time.monotonic()
            if self._live is None or now - self._live[0] >= _LIVE_DEVICES_S:
                workers = self.client.scheduler_info().get("workers", {}).values()
                found = {r for w in workers for r in w.get("resources", {}) if is_device(r)}
                self._live = (now, found)
            return self._live[1]

    def _submitted(self, future: Any) -> None:
        with self._lock:
            self._futures.add(future)

    def _advertised_resources(self) -> set[str]:
        info = self.client.scheduler_info()
        return {r for w in info.get("workers", {}).values() for r in w.get("resources", {})}

    def describe(self) -> str:
        workers = len(self.client.scheduler_info().get("workers", {}))
        return f"executing on Dask at {self.address} ({workers} workers)"

    def run(
        self,
        action: BuildAction,
        inputs: dict[BuildFile, str],
        outputs: list[BuildFile],
        upload: Callable[[str, Path], bool],
    ) -> RemoteResult:
        """Run ``action`` on the cluster; ``inputs`` are its files' digests, ``upload``
        puts a blob into the remote CAS. The result names the worker; its ``outputs``
        map each output (by sandbox path) to its digest. Raises ClusterFailure."""
        if self.lost is not None:
            raise ClusterFailure(f"'{action.desc}' not run: {self.lost}")
        paths = sandbox_paths(action, list(inputs), outputs)
        for f, digest in inputs.items():
            if not upload(digest, Path(f.fs_str)):
                raise ClusterFailure(
                    f"'{action.desc}': cannot put its input {f.path} into the "
                    "remote cache (see --remote-cache)"
                )
        task = self._task(action, inputs, outputs, paths)
        slot = Slot(task, f"kiln-{uuid.uuid4().hex}", self._placement(action))
        self._batcher.submit(slot)
        try:
            self._batcher.wait(slot, self._orphaned)
            return self._result(action, slot)
        finally:
            with self._lock:
                self._futures.discard(slot.future)

    def _task(
        self,
        action: BuildAction,
        inputs: dict[BuildFile, str],
        outputs: list[BuildFile],
        paths: dict[BuildFile, str],
    ) -> RemoteTask:
        common = dict(
            desc=action.desc,
            cas_url=self.cas_url,
            build=self.build,
            inputs=tuple((paths[f], d) for f, d in inputs.items()),
            outputs=tuple(paths[f] for f in outputs),
            timeout=getattr(action, "timeout", None),
            env=tuple(_declared_env(action).items()),
            executable=tuple(paths[f] for f in inputs if os.access(f.fs_str, os.X_OK)),
            iree_build_shim=iree_build_shim_active(),
            versions=expected(action),
        )
        command = sandbox_command(action)
        if command is not None:
            return RemoteTask(command=tuple(command[0]), **common)  # type: ignore[arg-type]
        thunk = sandbox_thunk(action, paths.__getitem__)
        if thunk is None:
            raise ClusterFailure(f"'{action.desc}' is not remotable: it makes no sandbox thunk")
        return RemoteTask(thunk=cloudpickle.dumps(thunk), **common)  # type: ignore[arg-type]

    def _result(self, action: BuildAction, slot: Slot) -> RemoteResult:
        from distributed.scheduler import KilledWorker

        try:
            if slot.value is not None:
                result = slot.value
            elif slot.error is not None or slot.future is None:
                raise slot.error or ConnectionError("not submitted")
            else:
                result = slot.future.result()
        except KilledWorker as e:
            raise ClusterFailure(
                f"'{action.desc}': every Dask worker that ran it died ({e.allowed_failures + 1} "
                f"tries); the last was {e.last_worker.address}"
            ) from None
        except SandboxFailure as e:
            raise ClusterFailure(f"'{action.desc}': {e} (after {RETRIES + 1} tries)") from None
        except Exception as e:  # noqa: BLE001 - the connection, not the action, failed
            if _connection_lost(e) or self.client.status not in ("running", "connecting"):
                self.lost = f"lost the Dask scheduler at {self.address} ({_short(e)})"
                raise ClusterFailure(f"'{action.desc}': {self.lost}") from None
            raise ClusterFailure(f"'{action.desc}' failed on the cluster: {_short(e)}") from None
        assert isinstance(result, RemoteResult)
        why = differences(slot.task.versions, getattr(result, "versions", None))
        if why is not None:
            raise ClusterFailure(
                f"'{action.desc}': refused Dask worker {result.worker}: {why}. What it "
                "builds would enter this build and the caches under keys that hold this "
                "machine's versions: run the same kiln and tools on every worker"
            )
        if result.error is not None:
            raise ClusterFailure(
                f"'{action.desc}' (on Dask worker {result.worker}): {result.error}"
            )
        return result

    def cancel_all(self) -> None:
        """Cancel every task in flight (Ctrl-C)."""
        with self._lock:
            futures = list(self._futures)
        if futures and self.lost is None:
            with contextlib.suppress(Exception):
                self.client.cancel(futures, force=True)

    def close(self) -> None:
        self.cancel_all()
        self._batcher.close()
        with contextlib.suppress(Exception):
            self.client.close(timeout=5)
        self._close_cluster()

    def _close_cluster(self) -> None:
        if self._cluster is not None:
            with contextlib.suppress(Exception):
                self._cluster.close(timeout=10)
            self._cluster = None
        for name, level in self._log_levels.items():
            logging.getLogger(name).setLevel(level)


def is_device(resource: str) -> bool:
    return resource.startswith(RESOURCE_PREFIX)


def _declared_env(action: BuildAction) -> dict[str, str]:
    """The variables declared for ``action`` (``--action-env``, a command's ``env``):
    the worker adds them to the same base environment as here."""
    env = dict(action.run_context.environment.declared)
    own = getattr(action, "env", None)
    if isinstance(own, dict):
        env.update(own)
    return env


# What a terminal sends its whole foreground process group: Ctrl-C, Ctrl-\.
_TERMINAL_SIGNALS = {signal.SIGINT, signal.SIGQUIT}


@contextlib.contextmanager
def _terminal_signals_held() -> Iterator[None]:
    """Hold Ctrl-C and Ctrl-\\ back while the LocalCluster starts. Its worker
    processes (in kiln's process group, so a terminal's Ctrl-C reaches each) and the
    threads that start them later inherit the blocked mask: the signal reaches kiln
    alone, which shuts the cluster down, rather than every worker, each printing a
    KeyboardInterrupt traceback (``local_worker`` then makes them ignore it). A
    signal that comes meanwhile reaches kiln when the block ends: none is lost.
    multiprocessing's resource tracker is started first, since starting it unblocks
    these signals in the thread that does."""
    from multiprocessing import resource_tracker

    resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, _TERMINAL_SIGNALS)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _connect(client: Callable[..., Any], address: str, timeout_s: float) -> Any:
    """A Dask client of ``address``, connected within ``timeout_s`` (Dask's own timeout
    does not bound every step of the handshake); else UsageError."""
    made: dict[str, Any] = {}

    def connect() -> None:
        try:
            made["client"] = client(address, timeout=timeout_s, set_as_default=False)
        except BaseException as e:  # noqa: BLE001 - reported by the waiting thread
            made["error"] = e

    thread = threading.Thread(target=connect, name="kiln-dask-connect", daemon=True)
    thread.start()
    thread.join(timeout_s + 5.0)
    error = made.get("error")
    if "client" in made:
        return made["client"]
    why = "no answer" if error is None else _short(error)
    raise UsageError(
        f"--executor: cannot connect to the Dask scheduler at {address} within "
        f"{timeout_s:g} s: {why}"
    )


def _within(call: Callable[[], Any], timeout_s: float) -> Any:
    """``call()``, on a thread of its own; TimeoutError when it takes longer than
    ``timeout_s`` (left to finish by itself)."""
    made: dict[str, Any] = {}

    def run() -> None:
        try:
            made["value"] = call()
        except BaseException as e:  # noqa: BLE001 - raised by the waiting thread
            made["error"] = e

    thread = threading.Thread(target=run, name="kiln-dask-call", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if "error" in made:
        raise made["error"]
    if "value" not in made:
        raise TimeoutError(f"no answer within {timeout_s:g} s")
    return made["value"]


def _which_kiln(answer: object) -> str:
    """What a worker's answer to ``kiln_version`` says it runs."""
    if isinstance(answer, str):
        return f"kiln {answer[:80]}"
    if isinstance(answer, BaseException):  # an older kiln: no such function
        return f"a kiln that cannot say its version ({_short(answer)})"
    return "a kiln that cannot say its version"


def _connection_lost(error: BaseException) -> bool:
    """Whether ``error`` says the client lost its scheduler (kiln cancels futures
    only when the build stops, and then no longer waits for them)."""
    from concurrent.futures import CancelledError  # what distributed.utils raises

    return isinstance(error, CancelledError | OSError | TimeoutError)


def _short(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


def _quiet_loggers() -> dict[str, int]:
    """Silence Dask's loggers (they are configured one by one); their old levels."""
    names = [
        "distributed",
        *(n for n in logging.root.manager.loggerDict if n.startswith("distributed.")),
    ]
    levels = {}
    for name in names:
        logger = logging.getLogger(name)
        levels[name] = logger.level
        logger.setLevel(logging.CRITICAL)
    return levels
