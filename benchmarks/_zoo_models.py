"""Which model-zoo models the zoo benchmark builds, shared by both build modules.

``run.py`` writes the chosen models to a JSON file named by ``KILN_BENCH_ZOO``, so
neither build module pays for listing the zoo (or for importing kiln, in the case
of the upstream module). Without it, the first 20 models of kiln's zoo are used.
"""

from __future__ import annotations

import json
import os

ENV = "KILN_BENCH_ZOO"
DEFAULT_COUNT = 20


def zoo_models() -> list[tuple[str, str]]:
    """``(entrypoint name, model.onnx path)`` of each model to build."""
    listing = os.environ.get(ENV)
    if listing:
        with open(listing, encoding="utf-8") as f:
            return [(name, path) for name, path in json.load(f)]
    from kiln.actions._ireetools import model_zoo

    return [(m.name, m.model) for m in model_zoo()[:DEFAULT_COUNT]]
