"""The targets of issue 16 (and, with ``--dask``, issue 13's two measured ones):
each with what was measured, the goal, the verdict and the margin."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from _defaults import (
    CACHE_OVER_NO_CACHE,
    CACHED,
    CACHED_CLEAN_OF_DOIT,
    DEFINED,
    OWN_CPU_BEFORE_MS,
    WARM_OF_CLEAN,
    DefaultsResult,
)
from _measure import Series
from _results import Results
from _synthetic import KILN_SYSTEMS, GraphResult
from _zoo_cache import cache_targets

NOOP_S, CLEAN_PY_S = 0.3, 2.0  # 10k actions, seconds
NOOP_OF_DOIT, CLEAN_OF_DOIT = 1 / 4, 1 / 4
THROUGHPUT_OF_NINJA, OWN_CPU_OF_NINJA = 0.7, 2.0
JOBS_SPREAD = 1.10  # no-op: slowest -j ÷ fastest; clean: -j ÷ fastest smaller -j
ANALYSIS_S, ANALYSIS_LINEAR, ANALYSIS_BYTES = 2.0, 11.0, 1500  # 100k actions; per action
ZOO_CLEAN, ZOO_NOOP = 0.55, 1 / 50  # ÷ iree.build
PROCESS_MS = 5.0  # a hermetic PROCESS action's cost over a THREAD action
DASK_ZOO, DASK_MS = 1.3, 2.0  # issue 13
PROPORTIONAL_TOLERANCE = 1.25


@dataclass
class Target:
    name: str
    measured: str
    goal: str
    met: bool | None  # None: not measured
    margin: str

    def row(self) -> str:
        verdict = {True: "met", False: "**missed**", None: "not measured"}[self.met]
        return f"| {self.name} | {self.measured} | {self.goal} | {verdict} | {self.margin} |"


def table(rows: Sequence[Target]) -> list[str]:
    return [
        "| target | measured | goal | verdict | margin |",
        "|---|---|---|---|---|",
        *(t.row() for t in rows),
    ]


def _get(results: Sequence[GraphResult], actions: int, scenario: str, system: str) -> Series | None:
    for r in results:
        if r.graph.actions == actions:
            s = r.series.get(scenario, {}).get(system)
            if s is not None and s.samples and s.timeout_s is None and not s.failed:
                return s
    return None


def _upper(
    name: str, value: float | None, limit: float, unit: str = " s", digits: int = 3
) -> Target:
    goal = f"≤ {limit:g}{unit}"
    if value is None:
        return Target(name, "—", goal, None, "")
    return Target(
        name, f"{value:.{digits}f}{unit}", goal, value <= limit, f"{value / limit:.2f}× the limit"
    )


def _versus(name: str, kiln: Series | None, peer: Series | None, limit: float, goal: str) -> Target:
    """kiln's wall ÷ the peer's, at most ``limit``."""
    if kiln is None or peer is None:
        return Target(name, "—", goal, None, "")
    r = kiln.wall_s / peer.wall_s
    return Target(
        name,
        f"{kiln.wall_s:.3f} s vs {peer.wall_s:.3f} s ({r:.3f}×)",
        goal,
        r <= limit,
        f"{r / limit:.2f}× the limit",
    )


def targets(res: Results) -> list[Target]:
    """Every target, in the order of issue 16, then the older ones that still apply."""
    g = res.graphs
    rows: list[Target] = []
    doit_noop = _get(g, 10_000, "no-op", "doit")
    for system in KILN_SYSTEMS:
        noop = _get(g, 10_000, "no-op", system)
        rows.append(_upper(f"10k no-op, {system}", noop.wall_s if noop else None, NOOP_S))
        rows.append(
            _versus(
                f"10k no-op, {system}, vs doit", noop, doit_noop, NOOP_OF_DOIT, "≤ 1/4 of doit's"
            )
        )
    clean = _get(g, 10_000, "clean", "kiln (py)")
    rows.append(
        _upper("10k clean, in-process actions", clean.wall_s if clean else None, CLEAN_PY_S)
    )
    rows.append(
        _versus(
            "10k clean, in-process actions, vs doit",
            clean,
            _get(g, 10_000, "clean", "doit"),
            CLEAN_OF_DOIT,
            "≥ 4× faster (≤ 0.25× doit's)",
        )
    )
    rows.append(
        _versus(
            "10k clean, run_command actions, vs Ninja (-j 2)",
            _get(g, 10_000, "clean", "kiln (sh)"),
            _get(g, 10_000, "clean", "ninja"),
            1.0,
            "≤ Ninja's wall",
        )
    )
    rows += _throughput_targets(res)
    rows += _jobs_targets(res)
    rows += _analysis_targets(res)
    rows += _zoo_targets(res)
    rows.append(_process_target(res))
    if res.dask is not None:
        rows += _dask_targets(res)
    for system in KILN_SYSTEMS:
        rows.append(_proportional(g, system))
    rows += [Target(name, got, goal, met, "") for name, got, goal, met in cache_targets(res.cache)]
    if res.defaults is not None:
        rows += defaults_targets(res.defaults)
    if res.devices is not None:
        rows += [Target(n, got, goal, met, "") for n, got, goal, met in res.devices.targets()]
    return rows


def defaults_targets(d: DefaultsResult) -> list[Target]:
    """Issue 29: kiln's defaults (the local cache on), on the work directory's disk."""
    py, sh = CACHED
    n = f"{d.graph.actions // 1000}k"
    rows = [
        _versus(
            f"defaults: {n} in-process clean, cache on ÷ --no-cache",
            d.get("clean", py),
            d.get("clean", "kiln (py)"),
            CACHE_OVER_NO_CACHE,
            f"≤ {CACHE_OVER_NO_CACHE:g}× (at most 10% over)",
        ),
        _versus(
            f"defaults: {n} in-process clean, cache on, vs doit",
            d.get("clean", py),
            d.get("clean", "doit"),
            CACHED_CLEAN_OF_DOIT,
            f"≤ {CACHED_CLEAN_OF_DOIT:g}× doit's wall",
        ),
        _versus(
            f"defaults: {n} run_command (sha256sum) clean, cache on, vs Ninja",
            d.get("clean", sh),
            d.get("clean", "ninja"),
            1.0,
            "≤ Ninja's wall",
        ),
    ]
    doit = d.get("no-op", "doit")
    defined = d.get(DEFINED, py)
    for system in CACHED:
        noop = d.get("no-op", system)
        limit = max(NOOP_S, doit.wall_s * NOOP_OF_DOIT) if doit else NOOP_S
        row = _upper(f"defaults: {n} no-op, {system}", noop.wall_s if noop else None, limit)
        if defined is not None and noop is not None:
            # What no build of this graph goes below: Python defining the graph.
            floor = f"; the graph's definition alone (kiln list --all): {defined.wall_s:.3f} s"
            over = ", itself over the limit" if defined.wall_s > limit else ""
            row = dataclasses.replace(row, margin=row.margin + floor + over)
        rows.append(row)
        rows.append(
            _versus(
                f"defaults: {n} warm cache, fresh output dir ÷ clean, {system}",
                d.get("warm cache, fresh output dir", system),
                d.get("clean", system),
                WARM_OF_CLEAN,
                f"≤ {WARM_OF_CLEAN:g}",
            )
        )
    kiln, ninja = d.trivial.get("kiln, cache on"), d.trivial.get("ninja")
    if kiln and ninja and kiln.samples and ninja.samples:
        rate, peer = d.trivial_actions / kiln.wall_s, d.trivial_actions / ninja.wall_s
        rows.append(
            Target(
                f"defaults: {d.trivial_actions:,} trivial commands -j 2, actions/s",
                f"kiln {rate:,.0f}/s, Ninja {peer:,.0f}/s ({rate / peer:.2f})",
                "stated beside Ninja's",
                None,
                "",
            )
        )
    own = kiln.own_cpu_s if kiln and kiln.samples else None
    rows.append(
        _upper(
            "defaults: kiln's own CPU per trivial command, cache on "
            f"(93466eb: {OWN_CPU_BEFORE_MS:.3f} ms)",
            None if own is None else 1000 * own / d.trivial_actions,
            OWN_CPU_BEFORE_MS / 2,
            " ms",
        )
    )
    per = d.cache_files_per_output
    rows.append(
        Target(
            "defaults: files created in the cache per action output (strace, clean)",
            "—" if per is None else f"{per:.4f}",
            "nothing per action (a few files in all)",
            None if per is None else per <= 0.01,
            d.files_note,
        )
    )
    return rows


def _throughput_targets(res: Results) -> list[Target]:
    t = res.throughput
    if t is None:
        return [
            Target(
                "throughput: trivial commands, kiln ÷ Ninja actions/s",
                "—",
                f"≥ {THROUGHPUT_OF_NINJA:g} at every -j",
                None,
                "",
            ),
            Target(
                "own CPU per subprocess action, kiln ÷ Ninja",
                "—",
                f"≤ {OWN_CPU_OF_NINJA:g}×",
                None,
                "",
            ),
        ]
    rows = []
    for j in t.series:
        kiln, ninja = t.per_second(j, "kiln"), t.per_second(j, "ninja")
        r = kiln / ninja
        rows.append(
            Target(
                f"throughput, {t.actions:,} trivial commands, -j {j}: kiln ÷ Ninja actions/s",
                f"{kiln:,.0f}/s vs {ninja:,.0f}/s ({r:.2f})",
                f"≥ {THROUGHPUT_OF_NINJA:g}",
                r >= THROUGHPUT_OF_NINJA,
                f"{r / THROUGHPUT_OF_NINJA:.2f}× the floor",
            )
        )
    for j in t.series:
        kiln_ms, ninja_ms = t.own_ms(j, "kiln"), t.own_ms(j, "ninja")
        name = f"own CPU per subprocess action, -j {j}: kiln ÷ Ninja"
        if kiln_ms is None or not ninja_ms:
            rows.append(
                Target(
                    name,
                    "—"
                    if kiln_ms is None
                    else f"kiln {kiln_ms:.3f} ms, Ninja below the clock tick",
                    f"≤ {OWN_CPU_OF_NINJA:g}×",
                    None,
                    "",
                )
            )
            continue
        r = kiln_ms / ninja_ms
        rows.append(
            Target(
                name,
                f"{kiln_ms:.3f} ms vs {ninja_ms:.3f} ms ({r:.1f}×)",
                f"≤ {OWN_CPU_OF_NINJA:g}×",
                r <= OWN_CPU_OF_NINJA,
                f"{r / OWN_CPU_OF_NINJA:.2f}× the limit",
            )
        )
    return rows


def _jobs_targets(res: Results) -> list[Target]:
    noop = next((r for r in res.jobs if r.graph.actions == 10_000 and "no-op" in r.series), None)
    clean = next(
        (r for r in sorted(res.jobs, key=lambda r: -r.graph.actions) if "clean" in r.series), None
    )
    rows = []
    goal = f"slowest ÷ fastest ≤ {JOBS_SPREAD:g}"
    spread = noop.spread("no-op") if noop else None
    if noop is None or spread is None:
        rows.append(Target("10k no-op independent of -j", "—", goal, None, ""))
    else:
        walls = ", ".join(f"-j {j}: {s.wall_s:.3f}" for j, s in noop.series["no-op"].items())
        rows.append(
            Target(
                "10k no-op independent of -j",
                f"{walls} s ({spread:.2f}×)",
                goal,
                spread <= JOBS_SPREAD,
                f"{(spread - 1) * 100:.0f}% spread",
            )
        )
    goal = f"each -j ≤ {JOBS_SPREAD:g}× the fastest smaller -j"
    worst = clean.worst_slowdown("clean") if clean else None
    if clean is None or worst is None:
        rows.append(Target("in-process clean not slower as -j grows", "—", goal, None, ""))
    else:
        ratio, j, best_j = worst
        walls = ", ".join(f"-j {j}: {s.wall_s:.2f}" for j, s in clean.series["clean"].items())
        rows.append(
            Target(
                f"{clean.graph.actions // 1000}k in-process clean not slower as -j grows",
                f"{walls} s",
                goal,
                ratio <= JOBS_SPREAD,
                f"worst: -j {j} {ratio:.2f}× -j {best_j}",
            )
        )
    return rows


def _analysis_targets(res: Results) -> list[Target]:
    by_size = {a.actions: a for a in res.analysis}
    big, small = by_size.get(100_000), by_size.get(10_000)
    rows = [
        _upper(
            "100k analysis (definition + plan)", big.median("total") if big else None, ANALYSIS_S
        )
    ]
    name, goal = "100k analysis, peak memory per action", f"≤ {ANALYSIS_BYTES / 1000:g} KB"
    if big is None:
        rows.append(Target(name, "—", goal, None, ""))
    else:
        per = big.process.rss_mib * 2**20 / big.actions
        measured = f"{per / 1000:.2f} KB ({big.process.rss_mib:.0f} MiB peak RSS of the process"
        if small is not None:  # what each further action adds, start-up and import excluded
            extra = (big.process.rss_mib - small.process.rss_mib) * 2**20
            measured += f"; {extra / (big.actions - small.actions) / 1000:.2f} KB per added action"
        loaded = big.median("peak_loaded_mib")
        measured += (
            f"; {loaded:.0f} MiB, {loaded * 2**20 / big.actions / 1000:.2f} KB per "
            "action, reached while CPython compiled the build module, before "
            "kiln made a node"
        )
        if big.graph_bytes is not None:
            measured += (
                f"; the graph and plan hold {big.graph_bytes / big.actions / 1000:.2f} "
                "KB per action (tracemalloc)"
            )
        rows.append(
            Target(
                name,
                measured + ")",
                goal,
                per <= ANALYSIS_BYTES,
                f"{per / ANALYSIS_BYTES:.2f}× the limit",
            )
        )
    name, goal = "analysis linear: 100k ÷ 10k time", f"≤ {ANALYSIS_LINEAR:g}×"
    if big and small:
        r = big.median("total") / small.median("total")
        rows.append(
            Target(
                name,
                f"{r:.1f}×",
                goal,
                r <= ANALYSIS_LINEAR,
                f"{r / ANALYSIS_LINEAR:.2f}× the limit",
            )
        )
    else:
        rows.append(Target(name, "—", goal, None, ""))
    return rows


def _zoo_targets(res: Results) -> list[Target]:
    zoo = res.zoo
    clean_goal, noop_goal = f"≤ {ZOO_CLEAN:g}× iree.build", "≤ 1/50 of iree.build"
    if zoo is None:
        return [
            Target("zoo clean vs iree.build", "—", clean_goal, None, ""),
            Target("zoo no-op vs iree.build", "—", noop_goal, None, ""),
        ]
    n, s = len(zoo.models), zoo.series
    return [
        _versus(
            f"zoo ({n} models, cpu) clean vs iree.build",
            s["clean"]["kiln"],
            s["clean"]["iree.build"],
            ZOO_CLEAN,
            clean_goal,
        ),
        _versus(
            f"zoo ({n} models, cpu) no-op vs iree.build",
            s["no-op"]["kiln"],
            s["no-op"]["iree.build"],
            ZOO_NOOP,
            noop_goal,
        ),
    ]


def _process_target(res: Results) -> Target:
    name = "hermetic process actions: cost per action over in-process"
    p = res.process
    if p is None or {"PROCESS", "THREAD"} - set(p.wall_s):
        return Target(name, "—", f"≤ {PROCESS_MS:g} ms", None, "")
    extra = p.per_action_ms("PROCESS") - p.per_action_ms("THREAD")
    return Target(
        name,
        f"{extra:.2f} ms ({p.actions} actions, -j 2, wall)",
        f"≤ {PROCESS_MS:g} ms",
        extra <= PROCESS_MS,
        f"{extra / PROCESS_MS:.2f}× the limit",
    )


def _proportional(graphs: Sequence[GraphResult], system: str) -> Target:
    name = f"10k change source 0 ∝ affected actions, {system}"
    r = next((g for g in graphs if g.graph.actions == 10_000), None)
    clean, noop, change = (
        _get(graphs, 10_000, s, system) for s in ("clean", "no-op", "change source 0")
    )
    if r is None or clean is None or noop is None or change is None:
        return Target(name, "—", "", None, "")
    share = r.affected / r.graph.actions
    expected = noop.wall_s + (clean.wall_s - noop.wall_s) * share
    ratio = change.wall_s / expected
    return Target(
        name,
        f"{change.wall_s:.2f} s for {r.affected:,} affected",
        f"≈ no-op + clean work × {share:.3f} = {expected:.2f} s "
        f"(±{PROPORTIONAL_TOLERANCE - 1:.0%})",
        ratio <= PROPORTIONAL_TOLERANCE,
        f"{ratio:.2f}× expected",
    )


def _dask_targets(res: Results) -> list[Target]:
    d = res.dask
    assert d is not None
    rows = []
    name, goal = (
        f"issue 13: zoo ({d.zoo_models} models) on dask-local:2 vs local -j 2",
        f"≤ {DASK_ZOO:g}×",
    )
    if d.zoo_local_s and d.zoo_dask_s:
        r = d.zoo_dask_s / d.zoo_local_s
        rows.append(
            Target(
                name,
                f"{d.zoo_dask_s:.2f} s vs {d.zoo_local_s:.2f} s ({r:.2f}×)",
                goal,
                r <= DASK_ZOO,
                f"{r / DASK_ZOO:.2f}× the limit",
            )
        )
    else:
        rows.append(Target(name, "—", goal, None, ""))
    ms = d.overhead.get("dask_ms_per_action")
    row = _upper(
        f"issue 13: kiln's added cost per action on Dask ({d.actions:,} x sleep "
        f"0.02 s, {d.workers} workers)",
        ms,
        DASK_MS,
        " ms",
        2,
    )
    alone = d.overhead.get("dask_alone_ms_per_action")
    if alone is not None and row.measured != "—":
        row = dataclasses.replace(
            row,
            measured=f"{row.measured} (Dask alone, the same "
            f"commands from a plain Client: {alone:.2f} ms)",
        )
    rows.append(row)
    return rows
