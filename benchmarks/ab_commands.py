#!/usr/bin/env python3
"""kiln at one git revision against the working tree, on N trivial commands.

    benchmarks/ab_commands.py --base REV [--actions 3000] [--jobs 1 2] [--runs 3]
                              [--work-dir DIR]

Each run is a clean build (``--no-cache``, the output directory removed first) of
``actions`` independent ``run_command(["sh", "-c", ": > {out}"])`` actions, the two
versions alternating; prints the median wall time and kiln's own CPU (user + sys
of its process alone, children excluded, read from /proc before reaping) of each.
For a change's effect on the subprocess path: the two versions run on the same
machine in the same minutes, so its noise hits both.
"""

from __future__ import annotations

import argparse
import io
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from _measure import checked, run_child

ROOT = Path(__file__).resolve().parent.parent
MODULE = """from kiln import entrypoint, run_command


@entrypoint
def touch():
    return [run_command(name=f"t{{i}}", command=["sh", "-c", ": > {{out}}"]) for i in range({n})]
"""


def _export(rev: str, into: Path) -> Path:
    """``src/`` of ``rev``, unpacked under ``into``."""
    data = subprocess.run(
        ["git", "archive", rev, "src"], cwd=ROOT, check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def _argv(src: Path, jobs: int) -> list[str]:
    start = (
        f"import sys; sys.path.insert(0, {str(src)!r}); sys.argv[0] = 'kiln'; "
        "from kiln.cli.main import main; sys.exit(main())"
    )
    return [
        sys.executable,
        "-c",
        start,
        "build",
        "touch.py",
        "-j",
        str(jobs),
        "--output-dir",
        "kiln-out",
        "--no-cache",
    ]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--base", required=True, help="the git revision to compare against")
    p.add_argument("--actions", type=int, default=3000)
    p.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--work-dir", type=Path, default=None)
    ns = p.parse_args()
    work = ns.work_dir or Path(tempfile.mkdtemp(prefix="kiln-ab-"))
    work.mkdir(parents=True, exist_ok=True)
    (work / "touch.py").write_text(MODULE.format(n=ns.actions))
    versions = {ns.base: _export(ns.base, work / "base"), "working tree": ROOT / "src"}
    for jobs in ns.jobs:
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in versions}
        for _ in range(ns.runs):
            for name, src in versions.items():
                shutil.rmtree(work / "kiln-out", ignore_errors=True)
                s = checked(run_child(_argv(src, jobs), cwd=work), f"kiln ({name})")
                samples[name].append((s.wall_s, s.own_cpu_s or 0.0))
        for name, got in samples.items():
            wall = statistics.median(w for w, _ in got)
            own = statistics.median(o for _, o in got)
            print(
                f"-j {jobs} {name}: wall {wall:.2f} s, own CPU {own:.2f} s "
                f"({1000 * own / ns.actions:.3f} ms/action); walls "
                f"{[round(w, 2) for w, _ in got]}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
