"""The ``onnx`` package's ``light`` models with real weights, for weight tests.

Those models carry their weights as ``ConstantOfShape(shape, 0.02)`` nodes, so every
weight is the same constant and no weight check can fail (``shared/toolfacts.md``).
``materialize`` turns each such constant, and each float initializer, into a float
initializer of the same shape holding seeded random values: two seeds give the same
architecture with other weights. The values keep activations finite: a weight of
rank 2 or more is normal with variance 1/fan-in, a batch norm's scale and variance
are in [0.5, 1.5) (a negative variance would make every output NaN), anything else
is uniform in [-scale, scale).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

LIGHT_NAMES = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
)


def light_dir() -> Path:
    """Where the onnx package keeps its light models."""
    import onnx

    return Path(os.path.dirname(onnx.__file__)) / "backend" / "test" / "data" / "light"


def materialize(name: str, seed: int, scale: float = 0.05) -> Any:
    """``light_<name>.onnx`` with its constant weights replaced by seeded random
    float32 initializers (uniform in [-scale, scale)), at IR version 7 (initializers
    need not be graph inputs)."""
    import numpy as np
    import onnx
    from onnx import numpy_helper

    model = onnx.load(str(light_dir() / f"light_{name}.onnx"))
    graph = model.graph
    rng = np.random.default_rng(seed)
    inits = {i.name: i for i in graph.initializer}
    weights: dict[str, Any] = {}
    dropped: set[str] = set()
    kept_nodes = []
    positive = {n.input[i] for n in graph.node if n.op_type == "BatchNormalization" for i in (1, 4)}

    def values(name: str, shape: list[int]) -> Any:
        if name in positive:
            return rng.uniform(0.5, 1.5, shape).astype(np.float32)
        if len(shape) >= 2:
            fan_in = int(np.prod(shape[1:])) or 1
            return rng.normal(0.0, 1.0 / np.sqrt(fan_in), shape).astype(np.float32)
        return rng.uniform(-scale, scale, shape).astype(np.float32)

    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input[0] in inits:
            shape = numpy_helper.to_array(inits[node.input[0]]).astype(int).tolist()
            weights[node.output[0]] = values(node.output[0], shape)
            dropped.add(node.input[0])
        else:
            kept_nodes.append(node)
    for init in graph.initializer:
        if init.name not in dropped and init.data_type == onnx.TensorProto.FLOAT:
            weights[init.name] = values(init.name, list(init.dims))
    others = [i for i in graph.initializer if i.name not in dropped and i.name not in weights]
    del graph.node[:]
    graph.node.extend(kept_nodes)
    del graph.initializer[:]
    graph.initializer.extend(others)
    graph.initializer.extend(numpy_helper.from_array(v, k) for k, v in weights.items())
    names = {i.name for i in graph.initializer} | dropped
    inputs = [i for i in graph.input if i.name not in names]
    del graph.input[:]
    graph.input.extend(inputs)
    model.ir_version = max(model.ir_version, 7)
    onnx.checker.check_model(model)
    return model


def write_light(name: str, seed: int, path: Path) -> Path:
    """Write ``materialize(name, seed)`` to ``path``; return it."""
    import onnx

    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(materialize(name, seed), str(path))
    return path
