"""The model zoo: the ONNX backend test models that ship inside the onnx package,
each with its first test data set, as ``examples/model_zoo.py`` and the zoo
benchmarks build them. Offline by design; no network is needed."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from kiln.base.errors import ToolError, UsageError

ZOO_CATEGORIES = ("pytorch-converted", "pytorch-operator", "simple")
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9_-]+")


@dataclass(frozen=True)
class ZooModel:
    """One ONNX backend test model shipped inside the onnx package, with its data."""

    name: str
    category: str
    model: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]


def _numbered(folder: Path, prefix: str) -> tuple[str, ...]:
    """Paths of ``<prefix>_<n>.pb`` files in `folder`, sorted by n (10 after 9)."""
    found = [(p.stem[len(prefix) + 1 :], p) for p in folder.glob(f"{prefix}_*.pb")]
    return tuple(str(p) for n, p in sorted((int(n), p) for n, p in found if n.isdigit()))


def model_zoo(categories: Sequence[str] = ZOO_CATEGORIES) -> list[ZooModel]:
    """List the onnx package's backend test models with their first test data set.

    Offline by design: the data ships in onnx/backend/test/data/<category>/<test>/.
    Models without a test_data_set_0 are skipped, since they cannot be verified.
    """
    spec = importlib.util.find_spec("onnx")
    if spec is None or spec.origin is None:
        raise ToolError("the onnx package is not installed (pip install 'kiln[iree]')")
    data = Path(spec.origin).parent / "backend" / "test" / "data"
    models = []
    for category in categories:
        if not (data / category).is_dir() or category != Path(category).name:
            known = sorted(p.name for p in data.iterdir() if p.is_dir())
            raise UsageError(f"unknown model zoo category {category!r}; known: {known}")
        for test in sorted((data / category).iterdir()):
            data_set = test / "test_data_set_0"
            if not (test / "model.onnx").is_file() or not data_set.is_dir():
                continue
            name = _UNSAFE_NAME_CHARS.sub("_", f"{category}__{test.name}")
            inputs, outputs = _numbered(data_set, "input"), _numbered(data_set, "output")
            models.append(ZooModel(name, category, str(test / "model.onnx"), inputs, outputs))
    return models
