#!/usr/bin/env python3
"""Profile kiln on the 10,000-action synthetic graph (in-process actions), from the
command line as a user runs it, and measure what importing kiln costs.

    benchmarks/profile_kiln.py [--top 15] [--work-dir DIR]

Runs ``python -m cProfile -o F -m kiln build gen_kiln_py.py -j 2 --output-dir out
--no-cache`` (as ``run.py`` measures it)
for a clean build and then a no-op build, and ``python -X importtime``; writes the
top entries by cumulative and by own time to
``benchmarks/results/<date>-profile.md``. cProfile sees the main thread only:
in a clean build the actions' own work runs on worker threads and shows up as
the scheduler waiting for them.
"""

from __future__ import annotations

import argparse
import datetime
import io
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from _env import ensure_venv
from _graph import make_graph
from _measure import checked, run_child
from _synthetic import KILN_PY

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _top(prof: Path, key: str, count: int, only_kiln: bool = False) -> str:
    """The ``count`` first entries by ``key``; with ``only_kiln``, kiln's own
    functions, named relative to ``src/`` (the CLI call chain left out)."""
    out = io.StringIO()
    stats = pstats.Stats(str(prof), stream=out)
    if only_kiln:
        stats.sort_stats(key).print_stats(r"src/kiln/(?!cli/main|__main__)", count)
    else:
        stats.strip_dirs().sort_stats(key).print_stats(count)
    text = out.getvalue().replace(str(ROOT / "src") + "/", "")
    start = text.find("   ncalls")
    return text[start:].rstrip() if start >= 0 else text.rstrip()


def _importtime(statement: str, count: int) -> str:
    proc = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", statement],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = []
    for line in proc.stderr.splitlines():
        m = re.match(r"import time:\s+(\d+) \|\s+(\d+) \|( *)(\S+)", line)
        if m:
            rows.append((int(m.group(1)), int(m.group(2)), len(m.group(3)), m.group(4)))
    total = max((r[1] for r in rows), default=0)
    kiln = sorted((r for r in rows if r[3].startswith("kiln")), key=lambda r: -r[1])[:count]
    by_self = sorted(rows, key=lambda r: -r[0])[:count]
    lines = [
        f"`python -X importtime -c '{statement}'`: {total / 1000:.0f} ms in all.",
        "",
        "| kiln module | cumulative ms | self ms |",
        "|---|--:|--:|",
        *(f"| {r[3]} | {r[1] / 1000:.1f} | {r[0] / 1000:.1f} |" for r in kiln),
        "",
        "| any module, by own time | self ms |",
        "|---|--:|",
        *(f"| {r[3]} | {r[0] / 1000:.1f} |" for r in by_self),
    ]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    ensure_venv(__file__)
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--work-dir", type=Path, default=None)
    args = p.parse_args(argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="kiln-profile-"))
    graph = make_graph(100, 100)
    root = work / graph.label / "kiln_py"
    KILN_PY.setup(graph, root)
    KILN_PY.clear(root)
    sections = [
        f"# kiln profile — {datetime.date.today().isoformat()}",
        "",
        f"Graph {graph.label} ({graph.actions:,} actions), in-process actions, "
        f"`-j 2`. cProfile sees the main thread only.",
        "",
    ]
    try:
        for scenario in ("clean", "no-op"):
            prof = root / f"{scenario}.prof"
            argv_ = [
                sys.executable,
                "-m",
                "cProfile",
                "-o",
                str(prof),
                "-m",
                "kiln",
                "build",
                "gen_kiln_py.py",
                "-j",
                "2",
                "--output-dir",
                "out",
                "--no-cache",
            ]
            sample = checked(
                run_child(argv_, cwd=root, log=root / f"{scenario}.log"), f"profiled {scenario}"
            )
            print(f"{scenario}: {sample.wall_s:.2f} s under cProfile", flush=True)
            sections += [f"## {scenario} build ({sample.wall_s:.2f} s wall under cProfile)", ""]
            for key in ("cumulative", "tottime"):
                sections += [
                    f"Top {args.top} by {key}:",
                    "",
                    "```",
                    _top(prof, key, args.top),
                    "```",
                    "",
                ]
            sections += [
                f"kiln's own functions, top {args.top} by cumulative:",
                "",
                "```",
                _top(prof, "cumulative", args.top, only_kiln=True),
                "```",
                "",
            ]
        sections += [
            "## Import time",
            "",
            _importtime("import kiln.cli.main", args.top),
            "",
            _importtime(
                "import kiln.cli.main, kiln.cli.session, kiln.cli.build_cmd, kiln.observe.manifest",
                args.top,
            ),
            "",
        ]
    finally:
        if args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    text = "\n".join(sections)
    out = HERE / "results" / f"{datetime.date.today().isoformat()}-profile.md"
    out.parent.mkdir(exist_ok=True)
    out.write_text(text)
    print(text)
    print(f"written to {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
