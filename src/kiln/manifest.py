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
             "verification": [{"passed", "status", "outputs" or "error"}]
             (one per verify of it)}
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

from kiln.actions._files import atomic_output
from kiln.graph import BuildAction, BuildFile, BuildMeta

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


def _status(f: BuildFile, exists: bool) -> str:
    if f.failure is None:
        return "built" if exists else "not built"
    return "not run" if f.is_dependence_failure else "failed"


def _verification(action: BuildAction, result: BuildFile) -> dict[str, Any]:
    if action.failure is not None:
        status = "not run" if action.is_dependence_failure else "failed"
        return {"passed": False, "status": status, "error": str(action.failure)}
    try:
        data: dict[str, Any] = json.loads(result.fs_path.read_text())
    except (OSError, ValueError):
        return {"passed": False, "status": "not built"}
    return {"passed": bool(data.get("passed")), "status": "built", "outputs": data.get("outputs")}


def describe_output(executor: Executor, f: BuildFile) -> dict[str, Any]:
    path = f.fs_path
    entry: dict[str, Any] = {
        "namespace": f.namespace.value,
        "path": os.path.relpath(path, executor.output_dir),
    }
    producers = [d for d in f.deps if isinstance(d, BuildAction)]
    if producers:
        entry["action"] = str(producers[0])
    digest = executor.store().digest(f.fs_str) if f.failure is None else None
    entry["status"] = _status(f, digest is not None)
    entry["built"] = digest is not None
    if digest is not None:
        entry.update(sha256=digest, size=path.stat().st_size)
    meta = ManifestMeta.get(f)
    entry.update(meta.fields)
    if meta.verifications:
        entry["verification"] = [_verification(a, r) for a, r in meta.verifications]
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
    with atomic_output(executor.output_dir / "manifest.json") as tmp:
        tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
