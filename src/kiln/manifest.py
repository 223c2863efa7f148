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
             ... plus what the action attached with ``ManifestMeta``: for a
             compiled module "target", "flags", "compiler_version" and
             "verification" (the result of a verify of it, when one ran)}
          ]
        }
      }
    }

Outputs that do not exist (their action failed or never ran) are listed with
``"built": false`` and no digest. The file is replaced atomically after each build.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import TYPE_CHECKING, Any

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


def describe_output(executor: Executor, f: BuildFile) -> dict[str, Any]:
    path = f.get_fs_path()
    entry: dict[str, Any] = {
        "namespace": f.namespace.value,
        "path": os.path.relpath(path, executor.output_dir),
    }
    producers = [d for d in f.deps if isinstance(d, BuildAction)]
    if producers:
        entry["action"] = str(producers[0])
    digest = executor.store().digest(path)
    if digest is None or f.failure is not None:
        entry["built"] = False
    else:
        entry.update(built=True, sha256=digest, size=path.stat().st_size)
    entry.update(ManifestMeta.get(f).fields)
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
    target = executor.output_dir / "manifest.json"
    fd, tmp = tempfile.mkstemp(prefix=".manifest.", suffix=".json", dir=executor.output_dir)
    try:
        with os.fdopen(fd, "w") as out:
            json.dump(data, out, indent=2, sort_keys=True)
            out.write("\n")
        os.replace(tmp, target)
    except BaseException:
        os.unlink(tmp)
        raise
