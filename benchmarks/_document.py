"""The results file of one ``run.py`` run, as markdown."""

from __future__ import annotations

import datetime

import _report
from _defaults import defaults_table
from _results import Results
from _targets import table, targets
from _zoo_cache import cache_table


def markdown(res: Results, command: str, took_s: float, machine: list[str]) -> str:
    out = [
        f"# kiln benchmarks — {datetime.date.today().isoformat()} ({res.mode})",
        "",
        f"`{command}`: medians of {res.runs} runs unless the table says otherwise; "
        "whole processes from the command line (`-j 2` / `-n 2` unless a table says "
        "otherwise), CPU time counting every process the command started (the harness "
        "adopts and reaps any left behind); the run took "
        f"{took_s / 60:.1f} min. kiln runs with bytecode writing on "
        "(`PYTHONDONTWRITEBYTECODE` unset, as on a user's machine), warmed by one untimed "
        "build of each kind of action first. 'own CPU' is a program's process alone (all "
        "its threads, none of its children), read from /proc before it is reaped.",
        "",
        *machine,
        "",
        "## Targets",
        "",
        *table(targets(res)),
        "",
        *_defaults_section(res),
    ]
    if res.graphs:  # none in a run of --only-defaults or --only-cache
        out += [
            "## Synthetic graph: layered diamonds",
            "",
            "L layers × W nodes; node (0, j) reads source j, node (k, j) reads (k-1, j) and "
            "one or two other nodes of layer k-1 (seeded RNG); each action writes the SHA-256 "
            "of each input. kiln (py): a `BuildAction` subclass in-process (THREAD); kiln (sh) "
            "and Ninja: `sh -c 'sha256sum IN... > OUT'`; doit: Python actions; iree.build: "
            "`BuildAction` subclasses. 'Change source 0' rewrites source 0; "
            + ", ".join(
                f"{g.affected:,} of {g.graph.actions:,} actions depend on it"
                for g in res.graphs
                if "change source 0" in g.series
            )
            + ". Ratios are wall time, kiln ÷ peer (< 1: kiln faster).",
            "",
            *_report.graph_table(res.graphs),
        ]
    if res.probe:
        out += [
            "",
            "iree.build, clean build of W=10 graphs of growing depth (one run, "
            "30 s limit): its graph walk visits every path, so 100 layers never finish.",
            "",
            "| graph | wall s | note |",
            "|---|--:|---|",
            *(f"| {g} | {w} | {n} |" for g, w, n in res.probe),
        ]
    if res.throughput is not None:
        out += [
            "",
            "## Throughput: independent trivial commands",
            "",
            f"{res.throughput.actions:,} independent `sh -c ': > OUT'` commands built from "
            "clean: kiln as `run_command` actions (`--no-cache`), Ninja as a rule "
            "`: > $out`, alternating, at each -j from 1 to the machine's cores. Own CPU "
            "is the build system's process alone; other processes' CPU is everything "
            "else the build ran (the commands, and any helper process).",
            "",
            *res.throughput.table(),
        ]
    if res.jobs:
        out += [
            "",
            "## kiln with more jobs",
            "",
            "kiln (py) on the layered-diamonds graph at each -j (the -j values in turn, "
            "reversed every other round): clean builds (`--no-cache`) and no-op "
            "rebuilds.",
            "",
        ]
        for sweep in res.jobs:
            out += [*sweep.table(), ""]
    if res.analysis:
        out += [
            "",
            "## Graph analysis alone (kiln)",
            "",
            "Import the in-process build module, call its entrypoint, make the plan (cycle "
            "check, topological order); nothing runs. 'definition + plan' excludes "
            "interpreter start-up and `import kiln`; the module is compiled from source "
            "each run (kiln writes no bytecode beside it). Peak RSS is the whole "
            "process's; 'once loaded' is the peak it had reached when the module had "
            "loaded (CPython compiling the module's data, before kiln made a node); "
            "'graph + plan' is what tracemalloc counts the graph and the plan holding, "
            "in one more untimed run.",
            "",
            *_report.analysis_table(res.analysis),
        ]
    if res.process is not None:
        out += [
            "",
            "## Out-of-process actions (kiln)",
            "",
            "`benchmarks/process_actions.py`: a clean build of "
            f"{res.process.actions} independent trivial actions (each writes one small "
            "file), `-j 2`, as THREAD and as PROCESS actions. Every PROCESS action runs "
            "hermetically in a fresh worker; the difference is what that costs.",
            "",
            *res.process.table(),
        ]
    if res.zoo is not None:
        out += [
            "",
            "## Model zoo: ONNX import + compile (host CPU)",
            "",
            "kiln: `kiln build benchmarks/zoo_kiln.py MODEL... -j 2`; iree.build: "
            "`python -m iree.build benchmarks/zoo_iree.py MODEL... "
            "--iree-hal-target-device=llvm-cpu --iree-llvmcpu-target-cpu=host` "
            "(its own concurrency). The models are the first of "
            "`examples/zoo_models.py`'s `model_zoo()`.",
            "",
            *_report.zoo_table(res.zoo),
        ]
    if res.cache is not None:
        out += [
            "",
            "## Model zoo: the shared cache (host CPU)",
            "",
            "kiln alone, `kiln build benchmarks/zoo_kiln.py MODEL... -j 2` into a new output "
            "directory each time: clean with `--no-cache`; clean with an empty local cache; "
            "with that cache warm; clean with an empty local cache uploading to an empty "
            "remote (nginx WebDAV on 127.0.0.1); with a new empty local cache and that "
            "remote warm. The rows above run kiln with `--no-cache`.",
            "",
            *cache_table(res.cache),
        ]
    if res.dask is not None:
        out += ["", "## Remote execution on Dask (issue 13)", "", *res.dask.table()]
    if res.devices is not None:
        out += ["", "## Devices on Dask (issue 39)", "", *res.devices.table()]
    if res.stage_s:
        out += [
            "",
            "Stages took: "
            + "; ".join(f"{name} {s:.0f} s" for name, s in res.stage_s.items())
            + ".",
        ]
    if res.errors:
        out += [
            "",
            "## Errors (these benchmarks are missing above)",
            "",
            *(f"- {e}" for e in res.errors),
        ]
    return "\n".join(out) + "\n"


def _defaults_section(res: Results) -> list[str]:
    d = res.defaults
    if d is None:
        return []
    return [
        "## kiln's defaults: the local cache on (issue 29)",
        "",
        f"The {d.graph.label} layered graph in the work directory (its filesystem is named "
        "above), each system in turn in every round: clean (output directory and cache "
        "emptied), no-op, and with the cache a fresh output directory while the cache is "
        "warm. kiln's rows say whether the cache is on (its default) or off (`--no-cache`); "
        "the other tables of this file run kiln with `--no-cache`. Ratios are wall time.",
        "",
        *defaults_table(d),
        "",
    ]
