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
             "target", "device_id" (the device it ran on: ``kiln.devices.identity``),
             "inputs", "actual" (a fingerprint of each output the module
             computed), "references": {"shipped" | "onnxruntime":
             {"passed", "summary", "outputs"}}, "outputs", "error" (when
             failed)}] (one per verify) and "benchmark": [{"status"
             ("measured", "skipped", "failed", ...), "reason", "device", "device_id",
             "median", "mean", "stddev", "min", "max", "time_unit" ("us"),
             "repetitions", "machine", "devices", "samples" (per repetition),
             "inputs" (as verify's)}], and
             "parameters": [{"scope", "path", "status", "sha256", "size"}] (the
             archives it loads); an output whose action has a record in the build
             state also has "key": {"digest", "params", "inputs"} (its action's key
             and what it was made of: ``kiln compare`` says from them why an
             artifact changed between two builds; a user's action's parameters by
             their values' digests only, ``_digested``) and "duration_s" (how long
             that action last ran)}
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
  was built, or it was removed, or it still matches its record);
- ``skipped``: the result file of a check or benchmark that did not run its
  module (no such device here): built, with its digest, but no verdict.

The result file of a check or benchmark carries that check's entry as well
(``"verification"`` or ``"benchmark"``: one object, as in its module's list).

A check or benchmark reports what its result file says only when this build
built it (or found it up to date); otherwise its status is the action's.
A file that happens to lie at an output's path is never ``built`` on that
account: an earlier build's copy that this one did not request is ``stale`` or
``not built``. A built output also
has ``"cached"``: true when the file was served from the shared cache rather than
made by running its action (in this build, or in the build that last made it,
while its digest is unchanged). The file is replaced atomically after each build.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kiln.base.errors import NotRegularFile, StateError
from kiln.engine.incremental import action_id
from kiln.graph import BuildAction, BuildFile
from kiln.graph.manifest_meta import ManifestMeta
from kiln.observe.manifest_history import keep_previous, read_manifest_bytes
from kiln.output_dir.ownership import clear_for_own_file, read_regular
from kiln.output_dir.writing import TemporarySweeper, atomic_write
from kiln.planning.action_key import is_kiln_class

if TYPE_CHECKING:
    from kiln.engine.result import BuildResult
    from kiln.graph import BuildContext, BuildEntrypoint
    from kiln.state import StateStore

FORMAT = "kiln-manifest/2"


@dataclass(frozen=True)
class ManifestInputs:
    """What the manifest is written from, besides the build's result: values the
    build hands over, never the facade that ran it."""

    output_dir: str
    manifest_path: Path
    entrypoints: tuple[BuildEntrypoint, ...]
    # Every node of the graph (the skipped checks are looked up among them).
    nodes: tuple[BuildContext | BuildFile, ...]
    # The build state: each output's digest, each action's record and duration.
    store: StateStore
    # Where a warning goes (the previous manifest that cannot be kept).
    warn: Callable[[str], None]


class Statuses:
    """Each action's status for the manifest, from ``result``: the build's own
    actions by what happened to them, the others as the build judged them
    (``BuildResult.unrequested``, ``kiln.engine.unrequested``). ``results`` holds each
    check's result as read once (a module's entry and the check's own both show
    it; the summary reads it again)."""

    def __init__(self, result: BuildResult):
        self.result = result
        self.of: dict[BuildAction, str] = dict(result.unrequested)
        for status, actions in (
            ("built", result.built),
            ("built", result.skipped),
            ("built", result.cached),
            ("failed", result.failed),
            ("not run", result.not_run),
            ("skipped", list(result.absent)),
        ):
            self.of.update((a, status) for a in actions)
        self.digests = dict(result.digests)
        self.results: dict[BuildFile, dict[str, Any]] = {}
        # Each producing action's id in the build state (``kiln.engine.incremental.action_id``).
        self.action_ids: dict[BuildAction, str] = {}
        # The previous manifest's "key" of each output, by path: reused for an
        # output whose action's key is the same (a no-op build re-reads no record).
        self.old_keys: dict[str, dict[str, Any]] = {}

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
    if any: a verification that ran and mismatched), or its status. Read once per
    ``statuses``; callers never change it."""
    found = statuses.results.get(result)
    if found is None:
        found = statuses.results[result] = _result_of(statuses, action, result)
    return found


def _result_of(statuses: Statuses, action: BuildAction, result: BuildFile) -> dict[str, Any]:
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
        skipped = {"passed": None, "status": "skipped", "reason": data.get("reason")}
        device = data.get("device_id")
        return {**skipped, "device_id": device} if device is not None else skipped
    entry: dict[str, Any] = {"passed": status == "passed", "status": status}
    if status == "passed":
        entry["status"] = "built"
    refs = data.get("references")
    if isinstance(refs, dict):
        keep = ("passed", "summary", "outputs")
        entry["references"] = {ref: {k: r.get(k) for k in keep} for ref, r in refs.items()}
    for key in ("outputs", "error", "target", "inputs", "device_id", "actual"):
        if data.get(key) is not None:
            entry[key] = data[key]
    return entry


_BENCH_FIELDS = (
    "status",
    "reason",
    "error",
    "target",
    "device",
    "device_id",
    "median",
    "mean",
    "stddev",
    "min",
    "max",
    "time_unit",
    "repetitions",
    "repetitions_run",
    "over_budget",
    "machine",
    "devices",
    "samples",
    "inputs",  # what it ran on: kiln compare --measure runs the module on them again
)


def _benchmark(statuses: Statuses, action: BuildAction, result: BuildFile) -> dict[str, Any]:
    data = _read_result(statuses, action, result)
    return {k: data[k] for k in _BENCH_FIELDS if k in data}


def skipped_checks(
    inputs: ManifestInputs, result: BuildResult, statuses: Statuses | None = None
) -> tuple[list[str], list[str]]:
    """For the build's summary, one line per check or benchmark of an entrypoint's
    output that was skipped (its device is not on this machine), and one per
    benchmark of this build whose single call took longer than its time budget.
    ``statuses``: those the manifest was written from (its results already read)."""
    statuses = statuses if statuses is not None else Statuses(result)
    skipped = []
    for ep in inputs.entrypoints:
        for f in ep.outputs:
            meta = ManifestMeta.get(f)
            for action, res in [*meta.verifications, *meta.benchmarks]:
                data = _read_result(statuses, action, res)
                if data.get("status") == "skipped":
                    skipped.append(f"{action.desc}: skipped: {data.get('reason')}")
    over: list[str] = []
    ran = set(result.built)
    if not ran:  # only a benchmark that ran has a budget to be over: a no-op looks at none
        return skipped, over
    for node in inputs.nodes:
        if not isinstance(node, BuildFile):
            continue
        found = node._metadata.get(ManifestMeta.KEY)
        of = found.result_of if isinstance(found, ManifestMeta) else None
        if of is None or of[0] != "benchmark" or of[1] not in ran:
            continue
        data = _read_result(statuses, of[1], node)
        if data.get("over_budget") is True:
            took = data.get("single_call_s")  # a file's value: shown only as a number
            took_s = f"{took:.3g}s" if isinstance(took, int | float) else "?"
            over.append(
                f"{of[1].desc}: one call took {took_s}, "
                f"over its time budget of {data.get('time_budget_s')}s: measured once"
            )
    return skipped, over


def describe_output(
    inputs: ManifestInputs,
    statuses: Statuses,
    f: BuildFile,
    cached: set[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """The manifest entry of ``f``; ``cached`` holds the (path, sha256) of outputs
    served from the cache."""
    path = f.fs_str
    entry: dict[str, Any] = {"namespace": f.namespace.value, "path": _manifest_path(inputs, f)}
    producers = [d for d in f.deps if isinstance(d, BuildAction)]
    if producers:
        entry["action"] = str(producers[0])
    status = statuses.file(f)
    digest = None
    if status == "built":
        digest = statuses.digests.get(f)
        if digest is None:  # a source file outside the build's plan
            digest = inputs.store.digest(f.fs_str)
            status = "built" if digest is not None else "not built"
    entry.update(status=status, built=digest is not None)
    run = statuses.result.runs.get(producers[0]) if producers else None
    worker = run.worker if run is not None else None
    if worker is not None and status == "built":  # it ran on a cluster in this build
        entry["worker"] = worker
    if status == "skipped" and producers[0] in statuses.result.absent:
        entry["reason"] = statuses.result.absent[producers[0]]
    if digest is not None:
        entry.update(sha256=digest, size=os.lstat(path).st_size)
        entry["cached"] = (entry["path"], digest) in (cached or set())
        if producers:
            entry.update(_key_parts(inputs, statuses, producers[0], entry["path"]))
    meta = ManifestMeta.get(f)
    entry.update(meta.fields)
    if meta.verifications:
        entry["verification"] = [_verification(statuses, a, r) for a, r in meta.verifications]
    if meta.benchmarks:
        entry["benchmark"] = [_benchmark(statuses, a, r) for a, r in meta.benchmarks]
    if meta.archives:
        entry["parameters"] = [_archive(inputs, statuses, s, a) for s, a in meta.archives]
    if meta.result_of is not None:  # a check's own result: its verdict, as the module's
        kind, action = meta.result_of
        judge = _verification if kind == "verification" else _benchmark
        entry[kind] = verdict = judge(statuses, action, f)
        verdict.pop("actual", None)  # the module's entry has it: not every output twice
        if verdict.get("status") == "skipped":
            entry["status"] = "skipped"
    return entry


def _key_parts(
    inputs: ManifestInputs, statuses: Statuses, action: BuildAction, path: str
) -> dict[str, Any]:
    """What ``action``'s record in the build state says it was made of (its key, its
    keyed parameters, its inputs' digests) and how long it last ran; nothing when it
    has no record (it never succeeded here). The previous manifest's parts of the
    output at ``path`` serve again while the record's key is theirs."""
    aid = statuses.action_ids.get(action)
    store = inputs.store
    record = store.records().get(aid) if aid is not None else None
    if record is None:
        return {}
    if record.damaged or not record.looks_intact():
        return {}
    known = key_parts(statuses.old_keys.get(path))
    if known is not None and known["digest"] == record.key and _as_kiln_shows(known, action):
        found: dict[str, Any] = {"key": known}
    else:
        params = record.params
        if params is not None and not is_kiln_class(type(action)):
            params = _digested(params)
        found = {"key": {"digest": record.key, "params": params, "inputs": record.inputs}}
    took = store.durations().get(aid) if aid is not None else None
    if isinstance(took, int | float):
        found["duration_s"] = float(took)
    return found


def key_parts(value: Any) -> dict[str, Any] | None:
    """A manifest's record of what an action's key was made of (``"key"``), if shaped
    as kiln writes it: its digest, parameters and inputs' digests, nothing else."""
    if not isinstance(value, dict):
        return None
    digest, params, inputs = value.get("digest"), value.get("params"), value.get("inputs")
    if not isinstance(digest, str) or not (params is None or isinstance(params, dict)):
        return None
    if not isinstance(inputs, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in inputs.items()
    ):
        return None
    return {"digest": digest, "params": params, "inputs": inputs}


def _as_kiln_shows(key: dict[str, Any], action: BuildAction) -> bool:
    """Whether a previous manifest's key parts show a user's action's parameters as
    ``_digested`` does (a hand-edited manifest's plain value is not carried on)."""
    params = key["params"]
    if params is None or is_kiln_class(type(action)):
        return True
    return all(isinstance(v, str) and _SHOWN_DIGEST.fullmatch(v) for v in params.values())


def _digested(params: dict[str, Any]) -> dict[str, Any]:
    """A user's action's parameters as the manifest shows them: each value by the
    digest of its canonical form, never the value itself (``manifest.json`` is
    often published with the artifacts; a parameter may be a token). kiln's own
    actions' parameters are shown as they are: they hold flags, targets and
    shapes, and a fetch's URL only redacted."""
    return {
        name: "sha256:"
        + hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:_SHOWN]
        for name, value in params.items()
    }


# Hex digits of a parameter's digest kept: enough to tell a change (this is no key;
# the key's own digest is whole), a quarter of the bytes a manifest line would take.
_SHOWN = 16
_SHOWN_DIGEST = re.compile(rf"sha256:[0-9a-f]{{{_SHOWN}}}")


def _action_ids(inputs: ManifestInputs) -> dict[BuildAction, str]:
    """Each producing action's id in the build state, from its outputs (one pass)."""
    outputs: dict[BuildAction, list[BuildFile]] = {}
    for node in inputs.nodes:
        if isinstance(node, BuildFile):
            for dep in node.deps:
                if isinstance(dep, BuildAction):
                    outputs.setdefault(dep, []).append(node)
    return {a: action_id(a, sorted(files, key=lambda f: f.key)) for a, files in outputs.items()}


def _archive(
    inputs: ManifestInputs, statuses: Statuses, scope: str, f: BuildFile
) -> dict[str, Any]:
    """A module's parameter archive: its scope, path, status and, when built, digest."""
    status = statuses.file(f)
    entry: dict[str, Any] = {"scope": scope, "path": _manifest_path(inputs, f), "status": status}
    digest = statuses.digests.get(f) if status == "built" else None
    if digest is not None:
        entry.update(sha256=digest, size=os.lstat(f.fs_str).st_size)
    return entry


def write_manifest(inputs: ManifestInputs, result: BuildResult) -> Statuses:
    """Rewrite the manifest for every entrypoint of the graph, from ``result``; the
    statuses it was written from."""
    statuses = Statuses(result)
    statuses.action_ids = _action_ids(inputs)
    # The manifest it replaces, read once: its keys and cache marks serve again, and
    # it is kept for ``kiln compare @-1`` when the new one differs.
    old_bytes = read_manifest_bytes(inputs.manifest_path)
    old = _parsed(old_bytes)
    statuses.old_keys, was_cached = _previous(old)
    cached = _cached_outputs(inputs, result, was_cached)
    outputs = {
        ep.path: [describe_output(inputs, statuses, f, cached) for f in ep.outputs]
        for ep in inputs.entrypoints
    }
    path = inputs.manifest_path
    text = _manifest_text(outputs).encode()
    # What a writer killed mid-write left beside it (this build holds the lock).
    TemporarySweeper().sweep(path)
    if text == old_bytes:
        return statuses  # a no-op build: the manifest there is this one, byte for byte
    clear_for_own_file(path)
    try:
        with atomic_write(path, "wb") as f:
            f.write(text)
    except OSError as e:  # a full disk: the old manifest stays, whole
        raise StateError(f"cannot write the manifest {path}: {e.strerror}") from e
    if old_bytes is not None:
        keep_previous(Path(inputs.output_dir), old_bytes, inputs.warn)
    return statuses


def _manifest_path(inputs: ManifestInputs, f: BuildFile) -> str:
    """``f``'s path relative to the output directory (a source file's may climb out)."""
    if f.source is None:  # below the output directory: no need to compute it
        return f.layout.relative_path(f)
    return os.path.relpath(f.fs_path, inputs.output_dir)


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


_BROKEN = (OSError, NotRegularFile, ValueError, TypeError, AttributeError, KeyError)


def _parsed(data: bytes | None) -> Any:
    """The manifest this one replaces, parsed (None: none, or not JSON)."""
    with contextlib.suppress(*_BROKEN):
        return json.loads(data) if data is not None else None
    return None


def _previous(old: Any) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """From the manifest ``old``, in one pass: each output's "key" by path, and the
    (path, sha256) of those it marks as served from the cache (what is not shaped as
    kiln writes it is left out)."""
    keys: dict[str, dict[str, Any]] = {}
    cached: dict[str, str] = {}
    with contextlib.suppress(*_BROKEN):
        for ep in old["entrypoints"].values():
            for o in ep["outputs"]:
                key = o.get("key")
                if isinstance(key, dict) and isinstance(o["path"], str):
                    keys[o["path"]] = key
                if o.get("cached"):
                    cached[o["path"]] = o["sha256"]
    return keys, cached


def _cached_outputs(
    inputs: ManifestInputs, result: BuildResult, found: dict[str, str]
) -> set[tuple[str, str]]:
    """(path, sha256) of the outputs that came from the cache: served in this build, or
    so marked in the previous manifest (``found``: an up-to-date output keeps its origin)."""
    served, built = set(result.cached), set(result.built)
    for ep in inputs.entrypoints:
        for f in ep.outputs:
            if served.isdisjoint(f.deps) and built.isdisjoint(f.deps):
                continue  # up to date (or not built): keeps what the old manifest says
            path = _manifest_path(inputs, f)
            found.pop(path, None)
            if served.isdisjoint(f.deps):
                continue  # built here: not from the cache
            digest = inputs.store.digest(f.fs_str)
            if digest is not None:
                found[path] = digest
    return set(found.items())
