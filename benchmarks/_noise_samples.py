"""Real latency samples for ``compare_noise.py``: a handful of the zoo's models,
compiled for llvm-cpu and vmvx with ``iree-compile``, each timed by
``iree-benchmark-module`` in several separate runs of many repetitions, with
kiln's benchmark settings (``--benchmark_min_time=0.1s`` a repetition). The
runs of all modules are interleaved (module 1 run 1, module 2 run 1, ..., module
1 run 2, ...), so that the runs of one module are minutes apart, as two builds'
benchmarks would be. The per-repetition latencies (microseconds) are written to
``benchmarks/data/compare_samples.json`` with the machine's load around each run.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "compare_samples.json"
MODELS = (
    "pytorch-converted/test_Conv2d",
    "pytorch-converted/test_Conv3d",
    "pytorch-converted/test_Conv2d_depthwise_strided",
    "pytorch-converted/test_Linear",
    "pytorch-operator/test_operator_conv",
)
TARGETS = {
    "llvm-cpu": [
        "--iree-hal-target-device=local",
        "--iree-hal-local-target-device-backends=llvm-cpu",
        "--iree-llvmcpu-target-cpu=host",
    ],
    "vmvx": ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=vmvx"],
}
# A call of this one on vmvx takes seconds: 40 repetitions would take minutes.
SKIP = {"pytorch-operator__test_operator_conv@vmvx"}
_TO_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}


def _tool(name: str) -> str:
    found = shutil.which(name) or str(Path(sys.executable).parent / name)
    return found


def _onnx_data() -> Path:
    import onnx

    return Path(onnx.__file__).parent / "backend" / "test" / "data"


def _inputs(model_dir: Path, work: Path) -> list[str]:
    import numpy as np
    import onnx
    from onnx import numpy_helper

    paths = []
    for i, pb in enumerate(sorted((model_dir / "test_data_set_0").glob("input_*.pb"))):
        tensor = onnx.TensorProto()
        tensor.ParseFromString(pb.read_bytes())
        path = work / f"input_{i}.npy"
        np.save(path, numpy_helper.to_array(tensor))
        paths.append(str(path))
    return paths


def _compile(model: str, work: Path) -> dict[str, Any]:
    """Import `model` and compile it for each target; its modules and inputs."""
    model_dir = _onnx_data() / model
    name = model.replace("/", "__")
    out = work / name
    out.mkdir()
    mlir = out / "model.mlir"
    subprocess.run(
        [_tool("iree-import-onnx"), str(model_dir / "model.onnx"), "-o", str(mlir)], check=True
    )
    modules = {}
    for target, flags in TARGETS.items():
        vmfb = out / f"{target}.vmfb"
        subprocess.run([_tool("iree-compile"), str(mlir), *flags, "-o", str(vmfb)], check=True)
        modules[target] = str(vmfb)
    found = re.search(r'func\.func @"?([^"(]+)"?\(', mlir.read_text(encoding="utf-8"))
    assert found, f"no function in {mlir}"
    return {
        "name": name,
        "modules": modules,
        "inputs": _inputs(model_dir, out),
        "function": found.group(1),
    }


def _run(module: str, function: str, inputs: list[str], repetitions: int) -> list[float]:
    """One iree-benchmark-module process: each repetition's mean latency (us)."""
    cmd = [
        _tool("iree-benchmark-module"),
        f"--module={module}",
        "--device=local-task",
        f"--function={function}",
        *(f"--input=@{p}" for p in inputs),
        f"--benchmark_repetitions={repetitions}",
        "--benchmark_min_time=0.1s",
        "--benchmark_format=json",
    ]
    done = subprocess.run(cmd, check=True, capture_output=True, text=True)
    runs = json.loads(done.stdout)["benchmarks"]
    return [
        float(r["real_time"]) * _TO_US[r.get("time_unit", "ns")]
        for r in runs
        if r.get("run_type") == "iteration"
    ]


def collect(repetitions: int = 40, runs: int = 4, models: tuple[str, ...] = MODELS) -> Path:
    """Compile, measure, write ``DATA``; returns its path."""
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="kiln-noise-") as tmp:
        compiled = [_compile(m, Path(tmp)) for m in models]
        print(f"compiled {len(compiled)} models in {time.monotonic() - started:.0f} s", flush=True)
        series: dict[str, dict[str, Any]] = {}
        for r in range(runs):
            for c in compiled:
                for target, module in c["modules"].items():
                    key = f"{c['name']}@{target}"
                    if key in SKIP:
                        continue
                    entry = series.setdefault(key, {"runs": [], "load": []})
                    load = os.getloadavg()[0]
                    entry["runs"].append(_run(module, c["function"], c["inputs"], repetitions))
                    entry["load"].append(round((load + os.getloadavg()[0]) / 2, 2))
                    print(f"run {r + 1}/{runs} {key}: load {entry['load'][-1]}", flush=True)
    doc = {
        "what": "per-repetition latencies (us) of iree-benchmark-module, one list per run",
        "date": datetime.date.today().isoformat(),
        "machine": {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count()},
        "iree_runtime": _version("iree-base-runtime"),
        "settings": {"repetitions": repetitions, "min_time": "0.1s", "device": "local-task"},
        "load_note": "1-minute load average around each run; the machine's 2 cores are shared",
        "seconds": round(time.monotonic() - started),
        "modules": {k: series[k] for k in sorted(series)},
    }
    DATA.parent.mkdir(exist_ok=True)
    DATA.write_text(_dumps(doc) + "\n", encoding="utf-8")
    return DATA


def _dumps(doc: dict[str, Any]) -> str:
    """``doc`` as indented JSON with each run's samples on one line: small and diffable."""
    lists: list[str] = []
    for entry in doc["modules"].values():
        for i, run in enumerate(entry["runs"]):
            lists.append(json.dumps([round(x, 3) for x in run]))
            entry["runs"][i] = f"@@{len(lists) - 1}@@"
    text = json.dumps(doc, indent=1)
    for i, line in enumerate(lists):
        text = text.replace(f'"@@{i}@@"', line)
    return text


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


if __name__ == "__main__":
    print(collect())
