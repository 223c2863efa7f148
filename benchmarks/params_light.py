#!/usr/bin/env python3
"""Weights-only rebuilds of the onnx package's light models: one command.

    benchmarks/params_light.py                      # 5 models, --write saves the table
    benchmarks/params_light.py --models all         # all 9 light models

Each model gets real (seeded random) weights (``tests/light_models.py``) and a build
of ``onnx_import(params=...)`` -> ``compile`` (host CPU) -> ``verify`` against
onnxruntime -> ``benchmark`` (1 repetition). Timed, wall seconds, ``-j 2``, no cache:

1. clean build, weights of seed 1;
2. weights-only rebuild: the same models with the weights of seed 2;
3. no-op rebuild.

Both with ``params=True`` (weights in parameter archives: the program does not
change, the compile is skipped) and with ``params=None`` (weights in the program:
every compile reruns), so the table shows what the archives save. Each rebuild's
events say which actions ran.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
from light_models import LIGHT_NAMES, write_light  # noqa: E402

DEFAULT = ("squeezenet", "shufflenet", "inception_v1", "resnet50", "densenet121")

BUILD = """
from kiln import *

MODELS = {models!r}


def one(name):
    mlir = onnx_import(name=f"{{name}}.mlir", source=source_file(f"models/{{name}}.onnx"),
                       params={params})
    (vmfb,) = compile(name=name, source=mlir)
    return [vmfb, verify(name=f"{{name}}.verify.json", module=vmfb, reference="onnxruntime"),
            benchmark(name=f"{{name}}.bench.json", module=vmfb, repetitions=1, min_time_s=0.01)]


@entrypoint
def light():
    return [f for name in MODELS for f in one(name)]
"""


def _build(work: Path) -> tuple[float, dict[str, int]]:
    """One build of ``work/build.py``: wall seconds and what happened to each kind
    of action (``Compiling: finished``...)."""
    events = work / "events.jsonl"
    cmd = [sys.executable, "-m", "kiln", "build", "build.py", "--target", "cpu"]
    cmd += ["-j", "2", "--no-cache", "--console", "plain", "--events", str(events)]
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=work, capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"build failed in {work}:\n{proc.stderr[-3000:]}")
    counts: dict[str, int] = {}
    for line in events.read_text().splitlines():
        e = json.loads(line)
        if e["event"] in ("finished", "up_to_date", "cached", "failed"):
            kind = e["desc"].split(" ", 1)[0]
            key = f"{kind} {e['event']}"
            counts[key] = counts.get(key, 0) + 1
    return wall, counts


def run(models: list[str], params: bool, root: Path) -> list[tuple[str, float, dict[str, int]]]:
    work = root / ("params" if params else "inline")
    (work / "models").mkdir(parents=True)
    (work / "build.py").write_text(BUILD.format(models=models, params=params or None))
    rows = []
    for label, seed in (("clean build (weights 1)", 1), ("weights-only rebuild (weights 2)", 2)):
        for name in models:
            write_light(name, seed, work / "models" / f"{name}.onnx")
        wall, counts = _build(work)
        rows.append((label, wall, counts))
    wall, counts = _build(work)
    rows.append(("no-op rebuild", wall, counts))
    return rows


def _ran(counts: dict[str, int]) -> str:
    parts = [f"{k.split()[0]} {n}" for k, n in sorted(counts.items()) if k.endswith("finished")]
    return ", ".join(parts) or "nothing"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", default=",".join(DEFAULT), help="comma-separated, or all")
    parser.add_argument("--write", action="store_true", help="save to benchmarks/results/")
    args = parser.parse_args()
    models = list(LIGHT_NAMES) if args.models == "all" else args.models.split(",")
    with tempfile.TemporaryDirectory(prefix="kiln-params-") as tmp:
        results = {p: run(models, p, Path(tmp)) for p in (True, False)}
    lines = [
        f"Light models ({', '.join(models)}), host CPU, `-j 2`, no cache, wall seconds "
        f"({datetime.date.today()}):",
        "",
        "| build | params=True | actions run | params=None | actions run |",
        "|---|--:|---|--:|---|",
    ]
    for (label, wall_p, counts_p), (_, wall_i, counts_i) in zip(
        results[True], results[False], strict=True
    ):
        lines.append(
            f"| {label} | {wall_p:.1f} | {_ran(counts_p)} | {wall_i:.1f} | {_ran(counts_i)} |"
        )
    text = "\n".join(lines) + "\n"
    print(text)
    if args.write:
        out = HERE / "results" / f"{datetime.date.today()}-params-light.md"
        out.write_text(text)
        print(f"written to {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
