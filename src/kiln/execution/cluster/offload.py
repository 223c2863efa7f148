"""The scheduler's hook into remote execution: which actions go to the cluster,
and how what came back becomes outputs in the output directory."""

from __future__ import annotations

import contextlib
import io
import os
import threading
from collections.abc import Callable
from pathlib import Path

from kiln.base.errors import ClusterFailure
from kiln.base.reached import Reached
from kiln.cache import BuildCache
from kiln.cache.remote import RemoteCache
from kiln.execution.cluster.dask_client import DaskClient
from kiln.execution.cluster.task import RemoteResult
from kiln.graph import ActionConcurrency, BuildAction, BuildFile
from kiln.planning.sandbox import remotable, sandbox_paths
from kiln.state import Produced


class ClusterOffload:
    """Runs remotable actions through ``client`` and materializes their outputs through
    ``cache``; ``cas`` is the CAS the workers share (the remote cache, or for
    ``dask-local`` without one kiln's local cache served to them,
    ``kiln.cache.cas_server``). Invariant: each action type that stays local is
    reported once."""

    def __init__(
        self,
        client: DaskClient,
        cache: BuildCache,
        cas: RemoteCache,
        warn: Callable[[str], None],
    ):
        self.client = client
        self.cache = cache
        self.cas = cas
        self._warn = warn
        self._noted: set[str] = set()
        self._lock = threading.Lock()

    def takes(self, action: BuildAction) -> bool:
        """Whether ``action`` runs on the cluster: a remotable command or thunk; a
        process action that cannot be remapped, or that reads a directory (the
        remote cache holds files), stays here (``stays``)."""
        return remotable(action) and not _reads_a_directory(action)

    def stays(self, action: BuildAction) -> None:
        """``action``, which the cluster does not take, runs on this machine: a
        process action's type is noted once (an in-process action never goes)."""
        kind = type(action).__qualname__
        if action.concurrency is ActionConcurrency.PROCESS:
            self._note(
                kind,
                f"kiln: {kind} actions run on this machine, not on the cluster: "
                "they define no sandbox_thunk(path) to say where their files are "
                "in a remote sandbox",
            )

    def _note(self, topic: str, text: str) -> None:
        with self._lock:
            first = topic not in self._noted
            self._noted.add(topic)
        if first:
            self._warn(text)

    def run(
        self, action: BuildAction, inputs: dict[BuildFile, str], outputs: list[BuildFile]
    ) -> tuple[Produced, str, Reached]:
        """Run ``action`` remotely; its outputs, materialized, the worker, and what
        it reached while it ran (``kiln.base.reached``)."""
        result = self.client.run(action, inputs, outputs, self._upload)
        paths = sandbox_paths(action, list(inputs), outputs)
        digests = {f: result.outputs[paths[f]] for f in outputs}
        self._keep_inline(result, digests, paths)
        produced = self.cache.materialize(digests)
        if produced is None:
            raise ClusterFailure(
                f"'{action.desc}' ran on Dask worker {result.worker}, but its "
                "outputs cannot be fetched from the remote cache"
            )
        return produced, result.worker, Reached.from_data(result.reached)

    def _keep_inline(
        self, result: RemoteResult, digests: dict[BuildFile, str], paths: dict[BuildFile, str]
    ) -> None:
        """Put the small outputs that came back with ``result`` into the local CAS,
        so that ``materialize`` need not fetch them; bytes that do not have their
        digest are not kept (the CAS copy is fetched instead)."""
        local = self.cache.local
        for f, digest in digests.items():
            data = result.inline.get(paths[f])
            if data is None or self.cache.broken:
                continue
            with contextlib.suppress(OSError):
                if not local.has_blob(digest):
                    local.put_stream(digest, io.BytesIO(data).read)

    def _upload(self, digest: str, path: Path) -> bool:
        """Make sure blob ``digest`` (the file ``path``) is in the workers' CAS."""
        remote = self.cas
        remote.put_blob(digest, path)
        return remote.known(digest) and not remote.disabled

    def cancel_all(self) -> None:
        self.client.cancel_all()


def _reads_a_directory(action: BuildAction) -> bool:
    """Whether one of ``action``'s inputs is a directory outside the output directory."""
    return any(
        isinstance(d, BuildFile) and d.source is not None and os.path.isdir(d.fs_str)
        for d in action.deps
    )
