"""``kiln compare A B``: what changed between two builds, and whether each module got
faster, slower or less accurate (``kiln.compare``); needs no build module.

A and B are output directories, manifest files, or ``@-N`` (builds of
``--output-dir``'s history). Exit status: 0, or 1 when a ``--fail-if`` condition is
met (the rows that meet it are named on stderr), 2 when a build cannot be read.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import IO

from kiln.base.terminal import printable
from kiln.cache.config import default_cache_dir
from kiln.cli import project_config
from kiln.cli.compare_measure import Measurer
from kiln.cli.destinations import check_destinations, write_page
from kiln.cli.plain_parsers import compare_parser
from kiln.compare.builds import Build, load_build
from kiln.compare.diff import Pools, compare_builds
from kiln.compare.gate import failing, parse_conditions
from kiln.compare.measure import Measured, measure, plan_jobs
from kiln.compare.page import render_page
from kiln.compare.table import render_table, to_json


def run(argv: list[str], out: IO[str], err: IO[str]) -> int:
    ns = project_config.parse(compare_parser(), argv, os.getcwd())
    conditions = parse_conditions(ns.fail_if)
    a = load_build(ns.a, ns.output_dir)
    b = load_build(ns.b, ns.output_dir)
    if ns.html is not None:  # refused before anything runs: never one of kiln's files
        _check_page(ns.html, ns.output_dir, [ns.project_file, a.manifest, b.manifest], err)
    pools = Pools([a, b])
    notes: list[str] = []
    if ns.measure:
        notes += _measure(a, b, pools, ns.budget)
    rows = compare_builds(a, b, pools)
    if ns.html is not None:
        write_page("--html", ns.html, render_page(a, b, rows, notes))
    if ns.json:
        print(json.dumps(to_json(a, b, rows, notes), indent=2), file=out)
    else:
        width = shutil.get_terminal_size((120, 24)).columns
        print(render_table(a, b, rows, width, notes), file=out)
    met = failing(conditions, rows)
    for condition, row in met:
        print(printable(f"kiln: --fail-if {condition.text}: {row.path}", one_line=True), file=err)
    return 1 if met else 0


def _measure(a: Build, b: Build, pools: Pools, budget: float) -> list[str]:
    from kiln.devices.identity import cpu_device

    measured = Measured(cpu_device().id)
    jobs = plan_jobs(a, b, measured)
    runner = Measurer()
    for job in jobs:
        runner.add(job, a, b)
    try:
        measure(jobs, pools, measured, runner, budget)
    finally:
        runner.close()
    notes = [
        f"--measure: {runner.runs} benchmark run(s) on {measured.device}, "
        + (", ".join(f"{p}: {n}" for p, n in measured.runs.items()) or "no module to measure")
    ]
    notes += [f"--measure: {p} not measured: {why}" for p, why in measured.skipped.items()]
    notes += [
        f"--measure: {p} ran on zeros: the inputs its benchmark recorded could not be made again"
        for p in runner.fell_back
    ]
    if measured.out_of_budget:
        notes.append("--measure: the budget ran out before every module was classed")
    return notes


def _check_page(
    target: Path, output_dir: Path, read: list[str | Path | None], err: IO[str]
) -> None:
    """``--html``'s page goes through the check every file-writing option takes
    (``kiln.cli.destinations``: never a file of any output directory kiln marked);
    what the command reads (the two manifests, the project file) is never written."""
    check_destinations(
        [("--html", target)],
        output_dir,
        cache_dir=default_cache_dir(),
        inputs=lambda: [p for p in read if p],
        warn=lambda message: print(printable(message), file=err),
    )
