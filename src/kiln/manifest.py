"""``OUTPUT_DIR/manifest.json``: what each entrypoint produced, for serving tools.

Format (``"format": "kiln-manifest/2"``)::

    {
      "format": "kiln-manifest/2",
      "entrypoints": {
        "<entrypoint path>": {
          "outputs": [
            {"namespace": "bin", "path": "bin/mnist_cpu-host.vmfb" (relative to the
             output directory), "sha256": "...", "size": 1234,
             "action": "<description of the producing action>",
             "status": "built", "built": true, "cached": false,
             ... plus what the action attached with ``ManifestMeta``: for a
             compiled module "target", "flags", "compiler_version" and
             "verification": [{"passed" (true, false, or null when skipped),
             "status" ("built", "failed", "not run", "not built", "stale",
             "skipped"), "reason" (when skipped: "no cuda device here"),
             "target", "inputs", "references": {"shipped" | "onnxruntime":
             {"passed", "summary", "outputs"}}, "outputs", "error" (when
             failed)}] (one per verify) and "benchmark": [{"status"
             ("measured", "skipped", "failed", ...), "reason", "device",
             "median", "mean", "stddev", "min", "max", "time_unit" ("us"),
             "repetitions", "machine", "devices"}], and "parameters": [{"scope",
             "path", "status", "sha256", "size"}] (the archives it loads)}
          ]
        }
      }
    }

Every output has ``"status"``, decided from the build's result (never from what
happens to lie on disk):

- ``built``: this build produced it or found it up to date (a source file: it
  exists); only these have ``"built": true``, a ``sha256`` and a ``size``;
- ``failed``: its action failed in this build;
- ``not run``: something it needs failed, or the build stopped first;
- ``stale``: not requested this time, and the copy an earlier build left no
  longer matches that build's record (its inputs, parameters or content changed,
  or may have: decided from the stat cache, reading no file);
- ``not built``: not requested this time, and no copy is known to be stale (none
  was built, or it was removed, or it still matches its record).

A check or benchmark reports what its result file says only when this build
built it (or found it up to date); otherwise its status is the action's.
Format 1 called an output ``built`` (with its digest) whenever a file was there,
even when a build that did not request it left it stale. A built output also
has ``"cached"``: true when the file was served from the shared cache rather than
made by running its action (in this build, or in the build that last made it,
while its digest is unchanged). The file is replaced atomically after each build.
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import TYPE_CHECKING, Any

from kiln.actionkey import KeyMaker
from kiln.errors import BuildDefinitionError, NotRegularFile, StateError
from kiln.graph import BuildAction, BuildFile, BuildMeta
from kiln.incremental import UpToDateChecker
from kiln.outputs import TemporarySweeper, atomic_write, clear_for_own_file, read_regular

if TYPE_CHECKING:
    from kiln.executor import Executor
    from kiln.result import BuildResult
    from kiln.state import StateStore

FORMAT = "kiln-manifest/2"
# Stands for the digest of an output whose copy is stale, so its consumers are too.
_STALE = "<stale>"


class ManifestMeta(BuildMeta):
    """Extra fields an action attaches to one of its output files for the manifest."""

    KEY = "kiln.manifest"

    def __init__(self) -> None:
        super().__init__()
        self.fields: dict[str, Any] = {}
        # (verify action, its JSON result file) for each check of this file.
        self.verifications: list[tuple[BuildAction, BuildFile]] = []
        # (benchmark action, its JSON result file) for each benchmark of this file.
        self.benchmarks: list[tuple[BuildAction, BuildFile]] = []
        # (scope, parameter archive) for each archive a compiled module loads.
        self.archives: list[tuple[str, BuildFile]] = []


class _StatCacheOnly:
    """The state store as the up-to-date check reads it, but answering a digest
    only from the stat cache: a changed file counts as changed, unread."""

    def __init__(self, store: StateStore):
        self._store = store

    def digest(self, path: str, output: bool = False) -> str | None:
        return self._store.cached_digest(path, output)

    def records(self) -> dict[str, Any]:
        return self._store.records()


class Statuses:
    """Each action's status for the manifest: from ``result`` for the actions of
    this build, from the state's records for the others."""

    def __init__(self, executor: Executor, result: BuildResult, unrequested: bool = True):
        self.result = result
        self.of: dict[BuildAction, str] = {}
        for status, actions in (
            ("built", result.built),
            ("built", result.skipped),
            ("built", result.cached),
            ("failed", result.failed),
            ("not run", result.not_run),
        ):
            self.of.update((a, status) for a in actions)
        self.digests = dict(result.digests)
        if unrequested:
            self._judge_unrequested(executor)

    def _judge_unrequested(self, executor: Executor) -> None:
        judged = self.of
        if all(
            d in judged
            for node in executor.all.values()
            if isinstance(node, BuildFile)
            for d in node.deps
            if isinstance(d, BuildAction)
        ):
            return  # the build covered every action (the usual no-op): no second plan
        plan = executor.plan(executor.entrypoints)
        keys = KeyMaker(executor.run_context.environment)
        for action in plan.actions:
            if action not in self.of:
                try:
                    keys.params_of[action] = keys.params(action)
                except BuildDefinitionError:  # cannot be keyed: never judged up to date
                    keys.params_of[action] = None
        checker = UpToDateChecker(
            plan,
            _StatCacheOnly(executor.store()),  # type: ignore[arg-type]
            keys,
        )
        checker.digests.update(self.digests)
        for action in plan.actions:
            if action in self.of:
                continue
            outputs = plan.outputs[action]
            decision = checker.decide(action)
            exists = all(os.path.lexists(f.fs_str) for f in outputs)
            if decision.up_to_date or decision.reason == "never built" or not exists:
                self.of[action] = "not built"
            else:
                self.of[action] = "stale"
            if not decision.up_to_date:
                checker.digests.update((f, _STALE) for f in outputs)

    def action(self, action: BuildAction) -> str:
        return self.of.get(action, "not built")

    def file(self, f: BuildFile) -> str:
        producers = [d for d in f.deps if isinstance(d, BuildAction)]
        if producers:
            return self.action(producers[0])
        return "built" if f.source is not None else "not built"


def _read_result(statuses: Statuses, action: BuildAction, result: BuildFile) -> dict[str, Any]:
    """The JSON result of a check or benchmark that this build ran (or found up to
    date), or why there is none: the action's failure (with the result it carried,
    if any: a verification that ran and mismatched), or its status."""
    status = statuses.action(action)
    if status in ("failed", "not run"):
        error = statuses.result.errors.get(action)
        carried = getattr(error, "result", None)
        data = dict(carried) if isinstance(carried, dict) else {}
        return {**data, "status": status, "error": str(error)}
    if status != "built":
        return {"status": status}
    try:
        if result.layout.tree.dir_problem(os.path.dirname(result.fs_str)) is not None:
            raise NotRegularFile(result.fs_str)
        loaded: dict[str, Any] = json.loads(read_regular(result.fs_str))
    except (OSError, ValueError, NotRegularFile):
        return {"status": "not built"}
    return loaded


def _verification(statuses: Statuses, action: BuildAction, result: BuildFile) -> dict[str, Any]:
    data = _read_result(statuses, action, result)
    status = data.get("status")
    if status == "skipped":
        return {"passed": None, "status": "skipped", "reason": data.get("reason")}
    entry: dict[str, Any] = {"passed": status == "passed", "status": status}
    if status == "passed":
        entry["status"] = "built"
    refs = data.get("references")
    if isinstance(refs, dict):
        keep = ("passed", "summary", "outputs")
        entry["references"] = {ref: {k: r.get(k) for k in keep} for ref, r in refs.items()}
    for key in ("outputs", "error", "target", "inputs"):
        if key in data:
            entry[key] = data[key]
    return entry


_BENCH_FIELDS = (
    "status",
    "reason",
    "error",
    "target",
    "device",
    "median",
    "mean",
    "stddev",
    "min",
    "max",
    "time_unit",
    "repetitions",
    "machine",
    "devices",
)


def _benchmark(statuses: Statuses, action: BuildAction, result: BuildFile) -> dict[str, Any]:
    data = _read_result(statuses, action, result)
    return {k: data[k] for k in _BENCH_FIELDS if k in data}


def skipped_checks(executor: Executor, result: BuildResult) -> list[str]:
    """One line per check or benchmark of an entrypoint's output that was skipped
    (its device is not on this machine), for the build's summary."""
    statuses = Statuses(executor, result, unrequested=False)
    lines = []
    for ep in executor.entrypoints:
        for f in ep.outputs:
            meta = ManifestMeta.get(f)
            for action, res in [*meta.verifications, *meta.benchmarks]:
                data = _read_result(statuses, action, res)
                if data.get("status") == "skipped":
                    lines.append(f"{action.desc}: skipped: {data.get('reason')}")
    return lines


def describe_output(
    executor: Executor,
    statuses: Statuses,
    f: BuildFile,
    cached: set[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """The manifest entry of ``f``; ``cached`` holds the (path, sha256) of outputs
    served from the cache."""
    path = f.fs_str
    entry: dict[str, Any] = {"namespace": f.namespace.value, "path": _manifest_path(executor, f)}
    producers = [d for d in f.deps if isinstance(d, BuildAction)]
    if producers:
        entry["action"] = str(producers[0])
    status = statuses.file(f)
    digest = None
    if status == "built":
        digest = statuses.digests.get(f)
        if digest is None:  # a source file outside the build's plan
            digest = executor.store().digest(f.fs_str)
            status = "built" if digest is not None else "not built"
    entry.update(status=status, built=digest is not None)
    worker = getattr(producers[0], "remote_worker", None) if producers else None
    if worker is not None and status == "built":  # it ran on a cluster in this build
        entry["worker"] = worker
    if digest is not None:
        entry.update(sha256=digest, size=os.lstat(path).st_size)
        entry["cached"] = (entry["path"], digest) in (cached or set())
    meta = ManifestMeta.get(f)
    entry.update(meta.fields)
    if meta.verifications:
        entry["verification"] = [_verification(statuses, a, r) for a, r in meta.verifications]
    if meta.benchmarks:
        entry["benchmark"] = [_benchmark(statuses, a, r) for a, r in meta.benchmarks]
    if meta.archives:
        entry["parameters"] = [_archive(executor, statuses, s, a) for s, a in meta.archives]
    return entry


def _archive(executor: Executor, statuses: Statuses, scope: str, f: BuildFile) -> dict[str, Any]:
    """A module's parameter archive: its scope, path, status and, when built, digest."""
    status = statuses.file(f)
    entry: dict[str, Any] = {"scope": scope, "path": _manifest_path(executor, f), "status": status}
    digest = statuses.digests.get(f) if status == "built" else None
    if digest is not None:
        entry.update(sha256=digest, size=os.lstat(f.fs_str).st_size)
    return entry


def write_manifest(executor: Executor, result: BuildResult) -> None:
    """Rewrite the manifest for every entrypoint of the graph, from ``result``."""
    statuses = Statuses(executor, result)
    cached = _cached_outputs(executor, result)
    outputs = {
        ep.path: [describe_output(executor, statuses, f, cached) for f in ep.outputs]
        for ep in executor.entrypoints
    }
    path = executor.layout.manifest_path
    clear_for_own_file(path)
    # What a writer killed mid-write left beside it (this build holds the lock).
    TemporarySweeper().sweep(path)
    try:
        with atomic_write(path, "w") as f:
            f.write(_manifest_text(outputs))
    except OSError as e:  # a full disk: the old manifest stays, whole
        raise StateError(f"cannot write the manifest {path}: {e.strerror}") from e


def _manifest_path(executor: Executor, f: BuildFile) -> str:
    """``f``'s path relative to the output directory (a source file's may climb out)."""
    if f.source is None:  # below the output directory: no need to compute it
        return f.layout.relative_path(f)
    return os.path.relpath(f.fs_path, executor.output_dir)


def _manifest_text(outputs: dict[str, list[dict[str, Any]]]) -> str:
    """The manifest (``format``, and each entrypoint's ``outputs``) as JSON, keys
    sorted, one line per output: as easy to read and to diff as fully indented
    JSON, and made by the C encoder rather than Python's (a build of 10,000
    outputs writes it in a fraction of the time)."""
    line = json.JSONEncoder(sort_keys=True).encode
    entrypoints = []
    for name, entries in sorted(outputs.items()):
        rows = ",\n".join(f"        {line(o)}" for o in entries)
        listed = f"[\n{rows}\n      ]" if rows else "[]"
        entrypoints.append(f'    {line(name)}: {{\n      "outputs": {listed}\n    }}')
    body = ",\n".join(entrypoints)
    return f'{{\n  "entrypoints": {{\n{body}\n  }},\n  "format": {line(FORMAT)}\n}}\n'


def _cached_outputs(executor: Executor, result: BuildResult | None) -> set[tuple[str, str]]:
    """(path, sha256) of the outputs that came from the cache: served in this build, or
    so marked in the previous manifest (an up-to-date output keeps its origin)."""
    found: dict[str, str] = {}
    broken = (OSError, NotRegularFile, ValueError, TypeError, AttributeError, KeyError)
    with contextlib.suppress(*broken):
        old = json.loads(read_regular(executor.layout.manifest_path))
        for ep in old["entrypoints"].values():
            found.update((o["path"], o["sha256"]) for o in ep["outputs"] if o.get("cached"))
    served = set(result.cached) if result is not None else set()
    built = set(result.built) if result is not None else set()
    for ep in executor.entrypoints:
        for f in ep.outputs:
            if served.isdisjoint(f.deps) and built.isdisjoint(f.deps):
                continue  # up to date (or not built): keeps what the old manifest says
            path = _manifest_path(executor, f)
            found.pop(path, None)
            if served.isdisjoint(f.deps):
                continue  # built here: not from the cache
            digest = executor.store().digest(f.fs_str)
            if digest is not None:
                found[path] = digest
    return set(found.items())
