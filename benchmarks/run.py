#!/usr/bin/env python3
"""kiln's benchmarks against Ninja, doit and upstream iree.build: one command.

    benchmarks/run.py            # full: every target of issue 16; medians of 5 runs
    benchmarks/run.py --quick    # the same stages, smaller; 3 runs; about 3 minutes
    benchmarks/run.py --dask     # also issue 13's Dask stages (benchmarks/dask_exec.py)
    benchmarks/run.py --devices  # also issue 39's device placement and zoo (_devices_row.py)
    benchmarks/run.py --only-devices --quick --record   # only those, kept
    benchmarks/run.py --readme   # also rewrite docs/performance.md's tables
    benchmarks/run.py --readme-from benchmarks/results/latest-readme.md   # only that

Stages (full / quick): the layered-diamonds graph, 1,000 actions with every peer
and 10,000 actions with every peer (quick: kiln (py) and doit no-op only);
throughput of 10,000 (quick: 1,000) trivial commands, kiln vs Ninja, at -j 1, 2,
4, ... up to the cores; kiln's no-op (10,000 actions) and in-process clean build
(quick: 1,000) at -j 1, 2, 8, 16, 64; graph analysis of 10,000 and 100,000
(quick: 10,000) actions; iree.build's depth probe (full only); 200 hermetic
PROCESS actions; the model zoo, 20 (quick: 5) models, and its shared cache.

Every measurement is a whole process started from the command line, Python
start-up included: wall time, CPU time (user + sys of the process and its
children), the process's own CPU and peak RSS (``_launch.py``). kiln runs with
bytecode writing on and is warmed once first (``_warm.py``). Results are printed
and written as markdown to ``<date>-<quick|full>.md`` and ``latest.md``, with the
targets table, and docs/performance.md's section to ``latest-readme.md``, in
``benchmarks/results/local/`` (not part of the repository); ``--record`` (and
``--readme``) writes them to ``benchmarks/results/`` instead, the results the
repository keeps.
"""

from __future__ import annotations

import argparse
import datetime
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import _readme
import _report
from _defaults import bench_defaults
from _document import markdown
from _env import ensure_bench_extra, ensure_venv
from _graph import make_graph
from _jobs_sweep import bench_jobs
from _results import Results
from _synthetic import DOIT, KILN_PY, KILN_SH, NINJA, bench_analysis, bench_graph, iree_build
from _targets import targets
from _throughput_row import bench_throughput, default_jobs
from _warm import allow_bytecode, warm
from _zoo import bench_zoo
from _zoo_cache import bench_zoo_cache
from process_actions import bench_process

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results"


def results_dir(args: argparse.Namespace) -> Path:
    """Where this run's results go: the kept ``results/`` only when recording them,
    so that measuring leaves the repository's files as they were."""
    return RESULTS if args.record or args.readme else RESULTS / "local"


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the short run (about 3 minutes)")
    p.add_argument("--runs", type=int, default=None, help="runs per scenario (5; --quick: 3)")
    p.add_argument(
        "--work-dir",
        type=Path,
        default=None,
        help="where graphs and outputs go (default: a temporary directory)",
    )
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--no-zoo", action="store_true", help="skip the model-zoo benchmarks")
    p.add_argument(
        "--only-defaults",
        action="store_true",
        help="only the rows of kiln's defaults, the local cache on (issue 29), with their "
        "peers (written to <date>-defaults-<mode>.md)",
    )
    p.add_argument(
        "--only-cache",
        action="store_true",
        help="only the zoo cache benchmark (written to <date>-cache-<mode>.md)",
    )
    p.add_argument(
        "--throughput-jobs",
        type=lambda s: [int(x) for x in s.split(",")],
        default=None,
        help="-j values of the throughput row (default: 1, 2, 4, ... up to the cores), e.g. 1,2,4",
    )
    p.add_argument(
        "--dask",
        action="store_true",
        help="also issue 13's Dask stages (zoo on dask-local:2; 5,000 sleep "
        "actions on 32 workers; quick: 5 models, 500 actions on 8 workers)",
    )
    p.add_argument(
        "--devices",
        action="store_true",
        help="also issue 39's device stages: placement's cost per action vs plain Dask "
        "(1,000 tiny actions; quick: 200) and the zoo on 2 workers, one with a device "
        "(5 models; quick: 3), both 3 runs",
    )
    p.add_argument(
        "--only-devices",
        action="store_true",
        help="only issue 39's device stages (written to <date>-devices-<mode>.md)",
    )
    p.add_argument(
        "--record",
        action="store_true",
        help="write the results to benchmarks/results/, which the repository keeps "
        "(default: benchmarks/results/local/, which it ignores)",
    )
    p.add_argument(
        "--readme",
        action="store_true",
        help="rewrite docs/performance.md's tables from this run (implies --record)",
    )
    p.add_argument(
        "--readme-from",
        type=Path,
        default=None,
        metavar="FILE",
        help="only rewrite docs/performance.md's tables from FILE (a "
        "latest-readme.md an earlier run wrote); runs nothing",
    )
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    allow_bytecode()
    ensure_venv(__file__)
    args = _parse(argv)
    if args.readme_from is not None:
        try:
            _readme.splice(args.readme_from.read_text(encoding="utf-8").splitlines())
        except (OSError, _readme.ReadmeError) as e:
            print(f"run.py: {e}", file=sys.stderr)
            return 2
        print(f"docs/performance.md's tables rewritten from {args.readme_from}")
        return 0
    ensure_bench_extra()
    short = args.quick or args.only_devices  # the device stages run 3 rounds
    res = Results("quick" if args.quick else "full", args.runs or (3 if short else 5))
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="kiln-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    machine, commit = _report.machine(work), _report.git_commit()  # before results are written
    print(f"kiln benchmarks ({res.mode}, {res.runs} runs) in {work}", flush=True)
    try:
        _stages(args, res, work)
    finally:
        if not args.keep and args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    return _finish(args, res, time.perf_counter() - started, machine, commit, work)


def _stage(res: Results, name: str, run: Callable[[], None]) -> None:
    """Run one benchmark; a failure is reported, and the others still run."""
    print(name, flush=True)
    started = time.perf_counter()
    try:
        run()
    except Exception as e:  # noqa: BLE001 - every stage gets its chance
        traceback.print_exc()
        res.errors.append(f"{name}: {type(e).__name__}: {e}")
    took = time.perf_counter() - started
    res.stage_s[name] = took
    print(f"  ({name}: {took:.0f} s)", flush=True)


def _stages(args: argparse.Namespace, res: Results, work: Path) -> None:
    quick, runs = args.quick, res.runs
    zoo_models = 5 if quick else 20
    if args.only_cache:
        _stage(
            res,
            "model zoo cache",
            lambda: setattr(res, "cache", bench_zoo_cache(zoo_models, work=work, runs=runs)),
        )
        return
    if args.only_devices:
        _devices_stage(args, res, work)
        return
    _stage(res, "warm-up (untimed)", lambda: warm(work))
    small, big = make_graph(100, 10), make_graph(100, 100)
    defaults = small if quick else big
    _stage(
        res,
        f"kiln's defaults (cache on), graph {defaults.label}",
        lambda: setattr(
            res,
            "defaults",
            bench_defaults(defaults, work=work, runs=runs, trivial=1_000 if quick else 10_000),
        ),
    )
    if args.only_defaults:
        return
    peers = [KILN_PY, KILN_SH, NINJA, DOIT]
    _stage(
        res,
        f"graph {small.label}",
        lambda: res.graphs.append(
            bench_graph(small, [*peers, iree_build(6 if quick else 60)], work=work, runs=runs)
        ),
    )
    if quick:
        _stage(
            res,
            f"graph {big.label} (no-op only)",
            lambda: res.graphs.append(
                bench_graph(big, [KILN_PY, DOIT], work=work, runs=runs, scenarios=["no-op"])
            ),
        )
        _stage(
            res,
            f"-j sweep {big.label} no-op",
            lambda: res.jobs.append(bench_jobs(big, work=work, runs=runs, scenarios=["no-op"])),
        )
        _stage(
            res,
            f"-j sweep {small.label} clean",
            lambda: res.jobs.append(bench_jobs(small, work=work, runs=runs, scenarios=["clean"])),
        )
    else:
        _stage(
            res,
            f"graph {big.label}",
            lambda: res.graphs.append(
                bench_graph(big, [*peers, iree_build(30)], work=work, runs=runs)
            ),
        )
        _stage(
            res,
            f"-j sweep {big.label}",
            lambda: res.jobs.append(bench_jobs(big, work=work, runs=runs)),
        )
    jobs = args.throughput_jobs or default_jobs()
    _stage(
        res,
        f"throughput -j {jobs}",
        lambda: setattr(
            res,
            "throughput",
            bench_throughput(work, runs, jobs, actions=1_000 if quick else 10_000),
        ),
    )
    _stage(
        res,
        f"analysis {big.label}",
        lambda: res.analysis.append(bench_analysis(big, work=work, runs=runs)),
    )
    if not quick:
        huge = make_graph(100, 1000)
        _stage(
            res,
            f"analysis {huge.label}",
            lambda: res.analysis.append(bench_analysis(huge, work=work, runs=runs)),
        )
        _stage(res, "iree.build scaling", lambda: res.probe.extend(_iree_probe(work)))
    _stage(
        res,
        "process actions",
        lambda: setattr(res, "process", bench_process(200, work=work, runs=runs)),
    )
    if not args.no_zoo:
        _stage(
            res,
            "model zoo",
            lambda: setattr(res, "zoo", bench_zoo(zoo_models, work=work, runs=runs)),
        )
        _stage(
            res,
            "model zoo cache",
            lambda: setattr(res, "cache", bench_zoo_cache(zoo_models, work=work, runs=runs)),
        )
    if args.dask:
        from _dask_row import bench_dask

        _stage(
            res,
            "dask",
            lambda: setattr(
                res,
                "dask",
                bench_dask(
                    work / "dask",
                    zoo=zoo_models,
                    actions=500 if quick else 5000,
                    workers=8 if quick else 32,
                    runs=1 if quick else 3,
                ),
            ),
        )
    if args.devices:
        _devices_stage(args, res, work)


def _devices_stage(args: argparse.Namespace, res: Results, work: Path) -> None:
    from _dask_devices import bench_devices

    actions, zoo = (200, 3) if args.quick else (1000, 5)
    _stage(
        res,
        "devices",
        lambda: setattr(
            res,
            "devices",
            bench_devices(work / "devices", actions=actions, zoo=zoo, runs=args.runs or 3),
        ),
    )


def _command(args: argparse.Namespace) -> str:
    flags = [
        f
        for f, on in (
            ("--quick", args.quick),
            ("--dask", args.dask),
            ("--devices", args.devices),
            ("--only-devices", args.only_devices),
            ("--no-zoo", args.no_zoo),
            ("--only-defaults", args.only_defaults),
            ("--only-cache", args.only_cache),
        )
        if on
    ]
    if args.runs:
        flags.append(f"--runs {args.runs}")
    if args.throughput_jobs:
        flags.append("--throughput-jobs " + ",".join(map(str, args.throughput_jobs)))
    if args.work_dir is not None:
        flags.append(f"--work-dir {args.work_dir}")
    return " ".join(["benchmarks/run.py", *flags])


def _finish(
    args: argparse.Namespace, res: Results, took: float, machine: list[str], commit: str, work: Path
) -> int:
    command = _command(args)
    text = markdown(res, command, took, machine)
    print("\n" + text)
    results = results_dir(args)
    results.mkdir(parents=True, exist_ok=True)
    today = datetime.date.today().isoformat()
    if args.only_cache or args.only_defaults or args.only_devices:  # partial: latest.md
        # keeps the last whole one
        part = "cache" if args.only_cache else "devices" if args.only_devices else "defaults"
        dated = results / f"{today}-{part}-{res.mode}.md"
        dated.write_text(text)
        print(f"written to {dated.relative_to(ROOT)}")
        return 1 if res.errors else 0
    dated = results / f"{today}-{res.mode}.md"
    dated.write_text(text)
    (results / "latest.md").write_text(text)
    section = _readme.render(
        res, command, _report.machine_summary(work), _report.versions(), commit, targets(res)
    )
    (results / "latest-readme.md").write_text("\n".join(section) + "\n")
    where = results.relative_to(ROOT)
    print(f"written to {dated.relative_to(ROOT)}, {where}/latest.md and latest-readme.md")
    if args.readme:
        _readme.splice(section)
        print("docs/performance.md's tables rewritten")
    return 1 if res.errors else 0


def _iree_probe(work: Path) -> list[tuple[str, str, str]]:
    """iree.build's clean build of narrow graphs with more and more layers: its
    dependency walk follows every path, so time grows exponentially with depth."""
    rows = []
    for layers in (8, 10, 12, 14, 16):
        graph = make_graph(layers, 10)
        r = bench_graph(graph, [iree_build(30)], work=work, runs=1, scenarios=["clean"])
        s = r.series["clean"]["iree.build"]
        if s.timeout_s:
            rows.append((graph.label, f"> {s.timeout_s:g}", s.note))
            break
        rows.append((graph.label, f"{s.wall_s:.2f}", s.note))
    return rows


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
