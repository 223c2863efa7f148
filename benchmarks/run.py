#!/usr/bin/env python3
"""kiln's benchmarks against Ninja, doit and upstream iree.build: one command.

    benchmarks/run.py            # full: 1,000 and 10,000 actions, 100,000 analysis,
                                 #       20 zoo models; medians of 5 runs
    benchmarks/run.py --quick    # 1,000 actions + 10,000-action no-op, 5 zoo
                                 #       models; 3 runs; under two minutes
Both also time 200 trivial out-of-process actions (``process_actions.py``).

Every measurement is a whole process started from the command line, Python
start-up included: wall time, CPU time (user + sys of the process and its
children) and peak RSS, from ``os.wait4``. Results are printed and written as
markdown to ``benchmarks/results/<date>-<quick|full>.md`` and ``latest.md``.
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

import _report
from _env import ensure_bench_extra, ensure_venv
from _graph import make_graph
from _synthetic import (
    DOIT,
    KILN_PY,
    KILN_SH,
    NINJA,
    AnalysisResult,
    GraphResult,
    bench_analysis,
    bench_graph,
    iree_build,
)
from _zoo import ZooResult, bench_zoo
from _zoo_cache import ZooCacheResult, bench_zoo_cache, cache_table, cache_targets
from process_actions import ProcessResult, bench_process

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def _parse(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--quick", action="store_true", help="the short run (under two minutes)")
    p.add_argument("--runs", type=int, default=None, help="runs per scenario (5; --quick: 3)")
    p.add_argument("--work-dir", type=Path, default=None,
                   help="where graphs and outputs go (default: a temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep the work directory")
    p.add_argument("--no-zoo", action="store_true", help="skip the model-zoo benchmark")
    p.add_argument("--only-cache", action="store_true",
                   help="only the zoo cache benchmark (written to <date>-cache-<mode>.md)")
    return p.parse_args(argv)  # fmt: skip


def main(argv: list[str]) -> int:
    ensure_venv(__file__)
    ensure_bench_extra()
    args = _parse(argv)
    mode = "quick" if args.quick else "full"
    runs = args.runs or (3 if args.quick else 5)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="kiln-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    machine = _report.machine()
    print(f"kiln benchmarks ({mode}, {runs} runs) in {work}", flush=True)
    graphs: list[GraphResult] = []
    analysis: list[AnalysisResult] = []
    probe: list[tuple[str, str, str]] = []
    zoos: list[ZooResult] = []
    processes: list[ProcessResult] = []
    caches: list[ZooCacheResult] = []
    errors: list[str] = []

    def stage(name: str, run: Callable[[], None]) -> None:
        """Run one benchmark; a failure is reported, and the others still run."""
        print(name, flush=True)
        try:
            run()
        except Exception as e:  # noqa: BLE001 - every stage gets its chance
            traceback.print_exc()
            errors.append(f"{name}: {type(e).__name__}: {e}")

    small, big = make_graph(100, 10), make_graph(100, 100)
    peers = [KILN_PY, KILN_SH, NINJA, DOIT]
    try:
        if args.only_cache:
            stage("model zoo cache", lambda: caches.append(bench_zoo_cache(
                5 if args.quick else 20, work=work, runs=runs)))
            return _finish(args, mode, runs, started, machine, [], [], [], None, [], caches,
                           errors)
        stage(f"graph {small.label}", lambda: graphs.append(bench_graph(
            small, [*peers, iree_build(6 if args.quick else 60)], work=work, runs=runs)))
        if args.quick:
            stage(f"graph {big.label} (no-op only)", lambda: graphs.append(bench_graph(
                big, [KILN_PY], work=work, runs=runs, scenarios=["no-op"])))
        else:
            stage(f"graph {big.label}", lambda: graphs.append(bench_graph(
                big, [*peers, iree_build(30)], work=work, runs=runs)))
            huge = make_graph(100, 1000)
            stage(f"analysis {big.label}", lambda: analysis.append(
                bench_analysis(big, work=work, runs=runs)))
            stage(f"analysis {huge.label}", lambda: analysis.append(
                bench_analysis(huge, work=work, runs=runs)))
            stage("iree.build scaling", lambda: probe.extend(_iree_probe(work)))
        stage("process actions", lambda: processes.append(bench_process(
            200, work=work, runs=runs)))
        if not args.no_zoo:
            stage("model zoo", lambda: zoos.append(bench_zoo(
                5 if args.quick else 20, work=work, runs=runs)))
            stage("model zoo cache", lambda: caches.append(bench_zoo_cache(
                5 if args.quick else 20, work=work, runs=runs)))
    finally:
        if not args.keep and args.work_dir is None:
            shutil.rmtree(work, ignore_errors=True)
    zoo = zoos[0] if zoos else None
    return _finish(args, mode, runs, started, machine, graphs, analysis, probe, zoo, processes,
                   caches, errors)


def _finish(
    args: argparse.Namespace, mode: str, runs: int, started: float, machine: list[str],
    graphs: list[GraphResult], analysis: list[AnalysisResult], probe: list[tuple[str, str, str]],
    zoo: ZooResult | None, processes: list[ProcessResult], caches: list[ZooCacheResult],
    errors: list[str],
) -> int:  # fmt: skip
    took = time.perf_counter() - started
    process = processes[0] if processes else None
    cache = caches[0] if caches else None
    text = _markdown(mode, runs, took, machine, graphs, analysis, probe, zoo, process, cache,
                     errors)
    print("\n" + text)
    results = HERE / "results"
    results.mkdir(exist_ok=True)
    if args.only_cache:  # a partial run: latest.md keeps the last whole one
        dated = results / f"{datetime.date.today().isoformat()}-cache-{mode}.md"
        dated.write_text(text)
        print(f"written to {dated.relative_to(ROOT)}")
        return 1 if errors else 0
    dated = results / f"{datetime.date.today().isoformat()}-{mode}.md"
    dated.write_text(text)
    (results / "latest.md").write_text(text)
    print(f"written to {dated.relative_to(ROOT)} and benchmarks/results/latest.md")
    return 1 if errors else 0


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


def _markdown(
    mode: str,
    runs: int,
    took: float,
    machine: list[str],
    graphs: list[GraphResult],
    analysis: list[AnalysisResult],
    probe: list[tuple[str, str, str]],
    zoo: ZooResult | None,
    process: ProcessResult | None,
    cache: ZooCacheResult | None,
    errors: list[str],
) -> str:
    command = "benchmarks/run.py" + (" --quick" if mode == "quick" else "")
    out = [
        f"# kiln benchmarks — {datetime.date.today().isoformat()} ({mode})",
        "",
        f"`{command}`: medians of {runs} runs unless the table says otherwise; "
        f"whole processes from the command line (`-j 2` / `-n 2`); the run took "
        f"{took / 60:.1f} min.",
        "",
        *machine,
        "",
        "## Synthetic graph: layered diamonds",
        "",
        "L layers × W nodes; node (0, j) reads source j, node (k, j) reads (k-1, j) and "
        "one or two other nodes of layer k-1 (seeded RNG); each action writes the SHA-256 "
        "of each input. kiln (py): a `BuildAction` subclass in-process (THREAD); kiln (sh) "
        "and Ninja: `sh -c 'sha256sum IN... > OUT'`; doit: Python actions; iree.build: "
        "`BuildAction` subclasses. 'Change source 0' rewrites source 0; "
        + ", ".join(f"{g.affected:,} of {g.graph.actions:,} actions depend on it"
                    for g in graphs if "change source 0" in g.series)  # fmt: skip
        + ". Ratios are wall time, kiln ÷ peer (< 1: kiln faster).",
        "",
        *_report.graph_table(graphs),
    ]
    if probe:
        out += ["", "iree.build, clean build of W=10 graphs of growing depth (one run, "
                "30 s limit): its graph walk visits every path, so 100 layers never finish.",
                "", "| graph | wall s | note |", "|---|--:|---|",
                *(f"| {g} | {w} | {n} |" for g, w, n in probe)]  # fmt: skip
    if analysis:
        out += ["", "## Graph analysis alone (kiln)", "",
                "Import the in-process build module, call its entrypoint, `make_plan` (cycle "
                "check, topological order); nothing runs. 'definition + plan' excludes "
                "interpreter start-up and `import kiln`; bytecode of the module is cached.",
                "", *_report.analysis_table(analysis)]  # fmt: skip
    if process is not None:
        out += ["", "## Out-of-process actions (kiln)", "",
                "`benchmarks/process_actions.py`: a clean build of 200 independent trivial "
                "actions (each writes one small file), `-j 2`, as THREAD and as PROCESS "
                "actions. Every PROCESS action runs in a fresh worker forked from a clean "
                "template (hermetic actions); the difference is what that costs.",
                "", *process.table()]  # fmt: skip
    if zoo is not None:
        out += ["", "## Model zoo: ONNX import + compile (host CPU)", "",
                "kiln: `kiln build benchmarks/zoo_kiln.py MODEL... -j 2`; iree.build: "
                "`python -m iree.build benchmarks/zoo_iree.py MODEL... "
                "--iree-hal-target-device=llvm-cpu --iree-llvmcpu-target-cpu=host` "
                "(its own concurrency). The models are the first of "
                "`examples/zoo_models.py`'s `model_zoo()`.",
                "", *_report.zoo_table(zoo)]  # fmt: skip
    if cache is not None:
        out += ["", "## Model zoo: the shared cache (host CPU)", "",
                "kiln alone, `kiln build benchmarks/zoo_kiln.py MODEL... -j 2` into a new output "
                "directory each time: clean with `--no-cache`; clean with an empty local cache; "
                "with that cache warm; clean with an empty local cache uploading to an empty "
                "remote (nginx WebDAV on 127.0.0.1); with a new empty local cache and that "
                "remote warm. The rows above run kiln with `--no-cache`.",
                "", *cache_table(cache)]  # fmt: skip
    cache_rows = [f"| {name} | {got} | {goal} | {'met' if met else '**missed**'} | |"
                  for name, got, goal, met in cache_targets(cache)]  # fmt: skip
    out += ["", "## Targets", "", *_report.targets(graphs, analysis, zoo), *cache_rows, ""]
    if errors:
        out += ["## Errors (these benchmarks are missing above)", "",
                *(f"- {e}" for e in errors), ""]  # fmt: skip
    return "\n".join(out)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
