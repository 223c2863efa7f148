"""kiln as users run it (issue 29): its defaults, the local cache on, in the work
directory's filesystem (an ordinary disk unless ``--work-dir`` says otherwise),
beside the same builds with ``--no-cache`` and the peers, alternated in each round.

The 100 × 100 layered graph (``_graph.py``), each round and each system in turn:
clean (output directory and cache emptied first), no-op, and for kiln with the
cache, a fresh output directory with the cache warm; kiln with and without the
cache share one directory (and so the state of the file system there). For the
in-process module, ``kiln list --all`` too: Python's start, kiln's imports and
the module defining its graph, and nothing else, the floor under every kiln
command on this graph (a no-op's included). Then
10,000 trivial commands (``: > OUT``) at ``-j 2``: kiln with the cache, kiln with
``--no-cache``, Ninja, each from clean (the cache emptied too). Its own CPU per
command is set against ``OWN_CPU_BEFORE_MS``, what kiln at 93466eb (before this
issue) spent, measured on this 2-core machine beside Ninja. Where ``strace`` is
installed, one more clean build of the graph runs under it, counting the files
kiln creates per output.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from _graph import Graph
from _measure import Series, checked, run_child, say
from _synthetic import BIN, DOIT, KILN_PY, KILN_SH, NINJA, System, _tool, failure
from _throughput_row import _write as write_trivial

# kiln's own CPU per trivial command at 93466eb, with the cache on (its default): the
# median of 5 clean builds of 10,000 commands at -j 2 (own CPU 33.7, 37.4, 38.1, 42.6,
# 42.9 s), alternated with this change and Ninja on this 2-core VM on 2026-12-02, under
# a load average of 6 to 12 (Ninja: 0.22-0.29 ms per command then). A figure of a loaded
# machine: compare it with a run under a like load.
OWN_CPU_BEFORE_MS = 3.81
CACHE_OVER_NO_CACHE, CACHED_CLEAN_OF_DOIT, WARM_OF_CLEAN = 1.10, 0.5, 0.1


def _kiln_cache(module: str) -> Callable[[Path], list[str]]:
    """kiln's defaults; only the cache's place is chosen, inside the graph's directory."""
    return lambda root: [
        *_tool("kiln", "kiln"),
        "build",
        module,
        "-j",
        "2",
        "--output-dir",
        "out",
        "--cache-dir",
        "cache",
    ]


KILN_PY_CACHE = System(
    "kiln (py), cache on",
    "kiln_py_cache",
    KILN_PY.write,
    _kiln_cache("gen_kiln_py.py"),
    ("out", "cache"),
    KILN_PY.final,
    KILN_PY.count,
)
KILN_SH_CACHE = System(
    "kiln (sh), cache on",
    "kiln_sh_cache",
    KILN_SH.write,
    _kiln_cache("gen_kiln_sh.py"),
    ("out", "cache"),
    KILN_SH.final,
    KILN_SH.count,
)
SYSTEMS = (KILN_PY_CACHE, KILN_PY, KILN_SH_CACHE, KILN_SH, NINJA, DOIT)
CACHED = (KILN_PY_CACHE.name, KILN_SH_CACHE.name)
TRIVIAL = ("kiln, cache on", "kiln --no-cache", "ninja")
DEFINED = "graph defined only (kiln list --all)"
Log = Callable[[str], None]


@dataclass
class DefaultsResult:
    """``graph[scenario][system]``, ``trivial[system]`` (10,000 trivial commands)."""

    graph: Graph
    runs: int
    series: dict[str, dict[str, Series]] = field(default_factory=dict)
    trivial: dict[str, Series] = field(default_factory=dict)
    trivial_actions: int = 10_000
    cache_files_per_output: float | None = None
    files_note: str = ""

    def get(self, scenario: str, system: str) -> Series | None:
        s = self.series.get(scenario, {}).get(system)
        return s if s is not None and s.samples and not s.failed else None


def bench_defaults(
    graph: Graph, *, work: Path, runs: int, trivial: int = 10_000, log: Callable[[str], None] = say
) -> DefaultsResult:
    """Every row of issue 29 (see the module's docstring)."""
    result = DefaultsResult(graph, runs, trivial_actions=trivial)
    for scenario in ("clean", "no-op", "warm cache, fresh output dir"):
        systems = CACHED if scenario.startswith("warm") else [s.name for s in SYSTEMS]
        result.series[scenario] = {name: Series(name) for name in systems}
    result.series[DEFINED] = {KILN_PY_CACHE.name: Series(KILN_PY_CACHE.name)}
    result.trivial = {name: Series(name) for name in TRIVIAL}
    # kiln with and without the cache build in one directory, so that both meet the
    # same file system: on this machine's ext4, creating a file after many deletions
    # nearby cost 0.1 to 0.7 ms of kernel time, depending on the directory's history
    # (a clean build of the 10k graph: 1.4 to 7.8 s of system time, the same build).
    shared = {KILN_PY_CACHE.name: KILN_PY.key, KILN_SH_CACHE.name: KILN_SH.key}
    roots = {s.name: work / "defaults" / graph.label / shared.get(s.name, s.key) for s in SYSTEMS}
    for s in SYSTEMS:
        s.setup(graph, roots[s.name])
    trivial_root = work / "defaults" / f"trivial-{trivial}"
    write_trivial(trivial_root, trivial)
    for round_ in range(runs):
        order = SYSTEMS if round_ % 2 == 0 else tuple(reversed(SYSTEMS))
        for s in order:
            _graph_round(s, graph, roots[s.name], result, round_, log)
        names = TRIVIAL if round_ % 2 == 0 else tuple(reversed(TRIVIAL))
        for name in names:
            _trivial_run(name, trivial_root, trivial, result, round_, log)
    if shutil.which("strace"):
        result.cache_files_per_output, result.files_note = _files_per_output(graph, work)
    return result


def _graph_round(
    s: System,
    graph: Graph,
    root: Path,
    result: DefaultsResult,
    round_: int,
    log: Callable[..., None],
) -> None:
    s.clear(root)
    steps = ["clean", "no-op"] + (["warm cache, fresh output dir"] if s.name in CACHED else [])
    for scenario in steps:
        if scenario.startswith("warm"):
            shutil.rmtree(root / "out")
        path = root / f"{s.key}-{scenario.split(',')[0].replace(' ', '_')}-{round_}.log"
        sample = run_child(s.argv(root), cwd=root, log=path)
        why = failure(sample, s, graph, root)
        series = result.series[scenario][s.name]
        if why is not None:
            series.failed, series.note = True, why
            log(f"  {s.name} {scenario}: {why} (log: {path})")
            return
        series.samples.append(sample)
        count = s.count(path.read_text(errors="replace"))
        if count is not None:
            series.actions_run = count
        took = f"{sample.wall_s:.2f} s wall, {sample.cpu_s:.2f} s CPU"
        log(f"  {s.name} {graph.label} {scenario}: {took}")
    if s.name in result.series[DEFINED]:
        argv = [*_tool("kiln", "kiln"), "list", "gen_kiln_py.py", "--all", "--output-dir", "out"]
        path = root / f"{s.key}-defined-{round_}.log"
        sample = checked(run_child(argv, cwd=root, log=path), f"{s.name}: kiln list --all")
        result.series[DEFINED][s.name].samples.append(sample)
        log(f"  {s.name} {graph.label} {DEFINED}: {sample.wall_s:.2f} s wall")


def _trivial_argv(name: str) -> list[str]:
    if name == "ninja":
        return [str(BIN / "ninja"), "-j2"]
    flags = ["--no-cache"] if name.endswith("--no-cache") else ["--cache-dir", "cache"]
    return [
        *_tool("kiln", "kiln"),
        "build",
        "touch.py",
        "-j",
        "2",
        "--output-dir",
        "kiln-out",
        *flags,
    ]


def _trivial_run(
    name: str,
    root: Path,
    actions: int,
    result: DefaultsResult,
    round_: int,
    log: Callable[..., None],
) -> None:
    for rel in ("kiln-out", "out", "cache", ".ninja_log", ".ninja_deps"):
        path = root / rel
        if path.is_dir():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)
    path = root / f"{name.split(',')[0].replace(' ', '_')}-{round_}.log"
    sample = checked(run_child(_trivial_argv(name), cwd=root, log=path), f"trivial {name}")
    where = root / ("out" if name == "ninja" else "kiln-out/genfiles/touch")
    made = sum(1 for _ in where.iterdir()) if where.is_dir() else 0
    if made != actions:
        raise RuntimeError(f"trivial {name} made {made} of {actions} files (log: {path})")
    result.trivial[name].samples.append(sample)
    own = "—" if sample.own_cpu_s is None else f"{1000 * sample.own_cpu_s / actions:.3f} ms"
    log(f"  trivial {name}: {sample.wall_s:.2f} s, {actions / sample.wall_s:,.0f}/s, own {own}/cmd")


_CREATE = re.compile(r'open(?:at)?\([^"]*"([^"]+)"[^)]*O_CREAT')


def _files_per_output(graph: Graph, work: Path) -> tuple[float | None, str]:
    """Files kiln creates in the cache in a clean build, per output, and what it
    creates in all, counted with ``strace`` (``O_CREAT`` opens)."""
    root = work / "defaults" / "strace"
    KILN_PY_CACHE.setup(graph, root)
    KILN_PY_CACHE.clear(root)
    with tempfile.NamedTemporaryFile(suffix=".strace") as trace:
        argv = ["strace", "-f", "-qq", "-e", "trace=open,openat,creat", "-o", trace.name]
        r = subprocess.run(
            [*argv, *KILN_PY_CACHE.argv(root)], cwd=root, capture_output=True, timeout=1800
        )
        if r.returncode != 0:
            return None, f"strace run failed ({r.returncode})"
        created = _CREATE.findall(Path(trace.name).read_text(errors="replace"))
    outputs = sum(1 for p in created if "/genfiles/" in p)
    in_cache = sum(1 for p in created if "/cache/" in p)
    if not outputs:
        return None, "no output seen"
    note = (
        f"{len(created)} files created for {outputs:,} outputs: {outputs:,} in the output "
        f"tree, {in_cache} in the cache, {len(created) - outputs - in_cache} others "
        "(state, lock, events)"
    )
    return in_cache / outputs, note


def defaults_table(r: DefaultsResult) -> list[str]:
    lines = [
        "| graph | scenario | system | runs | wall s | CPU s | of which sys s | actions run "
        "| ÷ --no-cache | ÷ peer |",
        "|---|---|---|--:|--:|--:|--:|--:|--:|--:|",
    ]
    pairs = {
        KILN_PY_CACHE.name: (KILN_PY.name, DOIT.name),
        KILN_SH_CACHE.name: (KILN_SH.name, NINJA.name),
    }
    for scenario, by_system in r.series.items():
        for name, s in by_system.items():
            if not s.samples:
                continue
            plain, peer = pairs.get(name, (None, None))
            ratios = [
                f"{s.wall_s / o.wall_s:.2f}" if (o := r.get(scenario, other or "")) else ""
                for other in (plain, peer)
            ]
            sys_s = "" if s.sys_s is None else f"{s.sys_s:.2f}"
            lines.append(
                f"| {r.graph.label} | {scenario} | {name} | {len(s.samples)} | {s.wall_s:.2f} "
                f"| {s.cpu_s:.2f} | {sys_s} | {s.actions_run or ''} | {ratios[0]} | {ratios[1]} |"
            )
    lines += [
        "",
        f"{r.trivial_actions:,} trivial commands (`: > OUT`), -j 2, from clean:",
        "",
        "| system | runs | wall s | actions/s | own CPU ms per command |",
        "|---|--:|--:|--:|--:|",
    ]
    for name, s in r.trivial.items():
        if s.samples:
            own = s.own_cpu_s
            own_ms = "—" if own is None else f"{1000 * own / r.trivial_actions:.3f}"
            lines.append(
                f"| {name} | {len(s.samples)} | {s.wall_s:.2f} "
                f"| {r.trivial_actions / s.wall_s:,.0f} | {own_ms} |"
            )
    if r.files_note:
        lines += ["", f"Files created by a clean build with the cache on: {r.files_note}."]
    return lines
