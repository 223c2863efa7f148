#!/usr/bin/env python3
"""Critical-path scheduling against first-come order, on synthetic graphs with
skewed durations: one command.

    benchmarks/critical_path.py            # 3 runs per order, medians
    benchmarks/critical_path.py --runs 5

Two graphs of sleeping thread actions (sleep releases the GIL, as a compiler
subprocess does), each built clean with ``-j 4`` in three orders:

- first-come: ready actions start in the order they became ready (kiln before
  critical-path scheduling; ``SchedulerOptions(critical_path=False)``);
- critical path, no history: longest remaining chain of actions first (every
  action counts 1);
- critical path, history: longest remaining path by the durations recorded in
  the previous build of the same output directory.

``chain+wide``: a chain of 5 actions of 0.2 s, declared after 60 independent
actions of 0.05 s. ``big+chains``: one action of 1.2 s, declared after 24
chains of two 0.05 s actions, where counting actions misleads and history
does not. Prints a markdown table; ``--write`` also saves it to
``benchmarks/results/<date>-critical-path.md``.
"""

from __future__ import annotations

import argparse
import datetime
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from _env import ensure_venv

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from kiln.engine.scheduler import SchedulerOptions  # noqa: E402
from kiln.executor import BuildAction, BuildContext, BuildFile, Executor  # noqa: E402

JOBS = 4


class Sleep(BuildAction):
    """Sleeps ``seconds``, then writes its output."""

    def __init__(self, *, seconds: float, out: BuildFile, **kwargs: object):
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.seconds = seconds
        self._out = out
        out.deps.add(self)

    def _invoke(self) -> None:
        time.sleep(self.seconds)
        self._out.get_fs_path().write_text(f"{self.seconds}\n")


@dataclass(frozen=True)
class Shape:
    """Chains of actions: ``chains[i]`` lists the durations of chain i, in order."""

    name: str
    chains: tuple[tuple[float, ...], ...]

    def declare(self, executor: Executor) -> list[BuildFile]:
        tails = []
        with executor.get_context(""):
            ctx = BuildContext.current()
            for i, chain in enumerate(self.chains):
                previous: list[BuildFile] = []
                for j, seconds in enumerate(chain):
                    out = ctx.allocate_file(f"c{i}/a{j}")
                    Sleep(
                        seconds=seconds,
                        out=out,
                        desc=f"c{i}/a{j}",
                        executor=executor,
                        deps=previous,
                    )
                    previous = [out]
                tails.extend(previous)
        return tails

    @property
    def bound(self) -> float:
        """No order beats the longest chain or the total work spread over ``JOBS``."""
        total = sum(sum(c) for c in self.chains)
        return max(max(sum(c) for c in self.chains), total / JOBS)


SHAPES = [
    Shape("chain+wide", tuple([(0.05,)] * 60 + [(0.2,) * 5])),
    Shape("big+chains", tuple([(0.05, 0.05)] * 24 + [(1.2,)])),
]
ORDERS = ("first-come", "critical path, no history", "critical path, history")


def build_once(shape: Shape, out: Path, critical_path: bool) -> float:
    executor = Executor(out)
    try:
        targets = shape.declare(executor)
        result = executor.run(targets, SchedulerOptions(jobs=JOBS, critical_path=critical_path))
    finally:
        executor.close()
    if not result.ok:
        raise RuntimeError(f"{shape.name}: the build failed")
    return result.wall_s


def measure(shape: Shape, order: str, work: Path) -> float:
    out = Path(tempfile.mkdtemp(dir=work))
    if order == "critical path, history":
        build_once(shape, out, critical_path=True)  # records the durations
        for f in (out / "genfiles").rglob("*"):
            if f.is_file():
                f.unlink()  # so that every action runs again
    return build_once(shape, out, critical_path=order != "first-come")


def main(argv: list[str]) -> int:
    ensure_venv(__file__)
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--runs", type=int, default=3, help="clean builds per order (median)")
    p.add_argument("--write", action="store_true", help="save the table under results/")
    args = p.parse_args(argv)
    lines = [
        f"Clean builds, -j {JOBS}, medians of {args.runs} runs (wall s; ratio to first-come).",
        "",
        "| graph | lower bound | " + " | ".join(ORDERS) + " |",
        "|---|---:|" + "---:|" * len(ORDERS),
    ]
    with tempfile.TemporaryDirectory(prefix="kiln-cp-") as tmp:
        for shape in SHAPES:
            medians = {}
            for order in ORDERS:
                walls = [measure(shape, order, Path(tmp)) for _ in range(args.runs)]
                medians[order] = statistics.median(walls)
                print(f"{shape.name:11} {order:26} {medians[order]:.3f} s", flush=True)
            base = medians["first-come"]
            cells = " | ".join(f"{medians[o]:.2f} ({medians[o] / base:.2f}x)" for o in ORDERS)
            lines.append(f"| {shape.name} | {shape.bound:.2f} | {cells} |")
    text = "\n".join(lines) + "\n"
    print("\n" + text)
    if args.write:
        path = HERE / "results" / f"{datetime.date.today().isoformat()}-critical-path.md"
        path.write_text("# Critical-path scheduling\n\n" + text)
        print(f"written to {path.relative_to(HERE.parent)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
