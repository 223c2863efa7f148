"""``OUTPUT_DIR/manifest.json``: what each entrypoint produced, for serving tools.

Format (``"format": "kiln-manifest/1"``)::

    {
      "format": "kiln-manifest/1",
      "entrypoints": {
        "<entrypoint path>": {
          "outputs": [
            {"namespace": "bin", "path": "bin/mnist_cpu.vmfb" (relative to the
             output directory), "sha256": "...", "size": 1234,
             "action": "<description of the producing action>",
             "status": "built", "built": true,
             ... plus what the action attached with ``ManifestMeta``: for a
             compiled module "target", "flags", "compiler_version" and
             "verification": [{"passed" (true, false, or null when skipped),
             "status" ("built", "failed", "not run", "not built", "skipped"),
             "reason" (when skipped: "no cuda device here"), "target", "inputs",
             "references": {"shipped" | "onnxruntime": {"passed", "summary",
             "outputs"}}, "outputs", "error" (when failed)}] (one per verify)
             and "benchmark": [{"status" ("measured", "skipped", "failed",
             ...), "reason", "device", "median", "mean", "stddev", "min", "max",
             "time_unit" ("us"), "repetitions", "machine", "devices"}]}
          ]
        }
      }
    }

Every output has ``"status"``: ``built``, ``failed`` (its action failed), ``not
run`` (something it needs failed) or ``not built`` (not requested this time),
and ``"built"`` (a boolean); only built outputs have a digest and size. The
file is replaced atomically after each build.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from kiln.errors import NotRegularFile, StateError
from kiln.graph import BuildAction, BuildFile, BuildMeta
from kiln.outputs import atomic_write, clear_for_own_file, read_regular

if TYPE_CHECKING:
    from kiln.executor import Executor
    from kiln.scheduler import BuildResult

FORMAT = "kiln-manifest/1"


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


def _status(f: BuildFile, exists: bool) -> str:
    if f.failure is None:
        return "built" if exists else "not built"
    return "not run" if f.is_dependence_failure else "failed"


def _read_result(action: BuildAction, result: BuildFile) -> dict[str, Any]:
    """The JSON result of a check or benchmark, or why there is none: the action's
    failure (with the result it carried, if any: a verification that ran and
    mismatched), or "not built"."""
    if action.failure is not None:
        status = "not run" if action.is_dependence_failure else "failed"
        carried = getattr(action.failure, "result", None)
        data = dict(carried) if isinstance(carried, dict) else {}
        return {**data, "status": status, "error": str(action.failure)}
    try:
        if result.executor.outputs.dir_problem(os.path.dirname(result.fs_str)) is not None:
            raise NotRegularFile(result.fs_str)
        loaded: dict[str, Any] = json.loads(read_regular(result.fs_str))
    except (OSError, ValueError, NotRegularFile):
        return {"status": "not built"}
    return loaded


def _verification(action: BuildAction, result: BuildFile) -> dict[str, Any]:
    data = _read_result(action, result)
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
    "status", "reason", "error", "target", "device", "median", "mean", "stddev", "min",
    "max", "time_unit", "repetitions", "machine", "devices",
)


def _benchmark(action: BuildAction, result: BuildFile) -> dict[str, Any]:
    data = _read_result(action, result)
    return {k: data[k] for k in _BENCH_FIELDS if k in data}


def skipped_checks(executor: Executor) -> list[str]:
    """One line per check or benchmark of an entrypoint's output that was skipped
    (its device is not on this machine), for the build's summary."""
    lines = []
    for ep in executor.entrypoints:
        for f in ep.outputs:
            meta = ManifestMeta.get(f)
            for action, result in [*meta.verifications, *meta.benchmarks]:
                data = _read_result(action, result)
                if data.get("status") == "skipped":
                    lines.append(f"{action.desc}: skipped: {data.get('reason')}")
    return lines


def describe_output(executor: Executor, f: BuildFile) -> dict[str, Any]:
    path = f.fs_path
    entry: dict[str, Any] = {
        "namespace": f.namespace.value,
        "path": os.path.relpath(path, executor.output_dir),
    }
    producers = [d for d in f.deps if isinstance(d, BuildAction)]
    if producers:
        entry["action"] = str(producers[0])
    digest = executor.output_digest(f) if f.failure is None else None
    entry["status"] = _status(f, digest is not None)
    entry["built"] = digest is not None
    if digest is not None:
        entry.update(sha256=digest, size=os.lstat(path).st_size)
    meta = ManifestMeta.get(f)
    entry.update(meta.fields)
    if meta.verifications:
        entry["verification"] = [_verification(a, r) for a, r in meta.verifications]
    if meta.benchmarks:
        entry["benchmark"] = [_benchmark(a, r) for a, r in meta.benchmarks]
    return entry


def write_manifest(executor: Executor, result: BuildResult | None = None) -> None:
    """Rewrite the manifest for every entrypoint of the graph."""
    data = {
        "format": FORMAT,
        "entrypoints": {
            ep.path: {"outputs": [describe_output(executor, f) for f in ep.outputs]}
            for ep in executor.entrypoints
        },
    }
    path = executor.output_dir / "manifest.json"
    clear_for_own_file(path)
    try:
        with atomic_write(path, "w") as f:
            f.write(json.dumps(data, indent=2, sort_keys=True) + "\n")
    except OSError as e:  # a full disk: the old manifest stays, whole
        raise StateError(f"cannot write the manifest {path}: {e.strerror}") from e
