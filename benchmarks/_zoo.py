"""The model-zoo benchmark: import + compile (host CPU) of zoo models, by kiln and by
upstream iree.build, clean / no-op / into a fresh output directory."""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from _measure import Series, run_child, say
from _zoo_models import ENV

HERE = Path(__file__).resolve().parent
SCENARIOS = ("clean", "no-op", "fresh output dir")
SYSTEMS = ("kiln", "iree.build")


@dataclass
class ZooResult:
    models: list[str]
    series: dict[str, dict[str, Series]] = field(default_factory=dict)


def _argv(system: str, models: list[str], out: Path) -> list[str]:
    if system == "kiln":
        kiln = Path(sys.executable).parent / "kiln"
        head = [str(kiln)] if kiln.exists() else [sys.executable, "-m", "kiln"]
        return [
            *head,
            "build",
            str(HERE / "zoo_kiln.py"),
            *models,
            "--output-dir",
            str(out),
            "-j",
            "2",
        ]
    return [
        sys.executable,
        "-m",
        "iree.build",
        str(HERE / "zoo_iree.py"),
        *models,
        "--output-dir",
        str(out),
        "--iree-hal-target-device=llvm-cpu",
        "--iree-llvmcpu-target-cpu=host",
    ]


def _artifacts(out: Path) -> int:
    return sum(1 for _ in (out / "bin").rglob("*.vmfb")) if (out / "bin").is_dir() else 0


def bench_zoo(
    count: int,
    *,
    work: Path,
    runs: int,
    slow_iteration_s: float = 90.0,
    log: Callable[[str], None] = say,
) -> ZooResult:
    """Both systems, alternating, ``runs`` rounds of clean -> no-op -> fresh dir.

    An action failing (exit status 1) is recorded, not fatal: the table shows how
    many of the ``count`` modules each system produced.
    """
    from _zoo_models import model_zoo

    chosen = model_zoo()[:count]
    root = work / f"zoo{count}"
    root.mkdir(parents=True, exist_ok=True)
    listing = root / "models.json"
    listing.write_text(json.dumps([[m.name, m.model] for m in chosen]))
    env = {**os.environ, ENV: str(listing)}
    names = [m.name for m in chosen]
    result = ZooResult(names, {s: {n: Series(n) for n in SYSTEMS} for s in SCENARIOS})
    planned = dict.fromkeys(SYSTEMS, runs)
    for round_ in range(runs):
        for system in SYSTEMS:
            if round_ >= planned[system]:
                continue
            started = time.perf_counter()
            _round(system, names, root, env, result, round_, log)
            took = time.perf_counter() - started
            if round_ == 0 and took > slow_iteration_s and runs > 3:
                planned[system] = 3
                for scenario in SCENARIOS:
                    result.series[scenario][
                        system
                    ].note = f"{runs} runs planned; 3 run (first round took {took:.0f} s)"
    return result


def _round(
    system: str,
    names: list[str],
    root: Path,
    env: dict[str, str],
    result: ZooResult,
    round_: int,
    log: Callable[[str], None],
) -> None:
    key = system.replace(".", "_")
    first, fresh = root / f"{key}-out", root / f"{key}-fresh"
    for path in (first, fresh):
        shutil.rmtree(path, ignore_errors=True)
    for scenario, out in zip(SCENARIOS, (first, first, fresh), strict=True):
        path = root / f"{key}-{scenario.replace(' ', '_')}-{round_}.log"
        # kiln's cache would serve every round after the first: these rows measure
        # building; _zoo_cache.py measures the cache.
        argv = _argv(system, names, out) + (["--no-cache"] if system == "kiln" else [])
        sample = run_child(argv, cwd=root, log=path, env=env)
        if sample.returncode not in (0, 1) or sample.timed_out:
            tail = "\n".join(path.read_text(errors="replace").splitlines()[-15:])
            raise RuntimeError(f"zoo {system} {scenario} exited {sample.returncode}: {tail}")
        series = result.series[scenario][system]
        series.samples.append(sample)
        series.actions_run = _artifacts(out)
        if sample.returncode:
            missing = [n for n in names if not any((out / "bin" / n).glob("*.vmfb"))]
            series.note = f"exit status {sample.returncode}; no module for {', '.join(missing)}"
        log(
            f"  zoo {len(names)} {system} {scenario}: {sample.wall_s:.2f} s wall, "
            f"{sample.cpu_s:.2f} s CPU, {sample.rss_mib:.0f} MiB"
        )
