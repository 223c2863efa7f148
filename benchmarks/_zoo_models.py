"""Which model-zoo models the zoo benchmark builds, shared by both build modules.

``run.py`` writes the chosen models to a JSON file named by ``KILN_BENCH_ZOO``, so
neither build module pays for listing the zoo (or for importing kiln, in the case
of the upstream module). Without it, the first 20 models of kiln's zoo are used.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any

ENV = "KILN_BENCH_ZOO"
EXAMPLES_ZOO = Path(__file__).resolve().parents[1] / "examples" / "zoo_models.py"
DEFAULT_COUNT = 20


def zoo_models() -> list[tuple[str, str]]:
    """``(entrypoint name, model.onnx path)`` of each model to build."""
    listing = os.environ.get(ENV)
    if listing:
        with open(listing, encoding="utf-8") as f:
            return [(name, path) for name, path in json.load(f)]
    return [(m.name, m.model) for m in model_zoo()[:DEFAULT_COUNT]]


def model_zoo() -> list[Any]:
    """The model zoo of ``examples/zoo_models.py`` (the examples are not a package)."""
    module = sys.modules.get("zoo_models")
    if module is None:
        spec = importlib.util.spec_from_file_location("zoo_models", EXAMPLES_ZOO)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules["zoo_models"] = module  # dataclasses look their module up there
        spec.loader.exec_module(module)
    return list(module.model_zoo())
