"""benchmarks/_targets.py: every target of issue 16 gets a row, with the right verdict."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


@pytest.fixture()
def bench() -> object:
    sys.path.insert(0, str(BENCH))
    try:
        import _measure
        import _results
        import _targets
        import _throughput_row

        yield _measure, _results, _targets, _throughput_row
    finally:
        sys.path.remove(str(BENCH))


def test_an_empty_run_lists_every_target_as_not_measured(bench) -> None:  # type: ignore[no-untyped-def]
    _, results, targets, _ = bench
    rows = targets.targets(results.Results("quick", 3))
    names = " / ".join(r.name for r in rows)
    for expected in (
        "10k no-op, kiln (py)",
        "10k no-op, kiln (sh), vs doit",
        "10k clean, in-process actions, vs doit",
        "run_command actions, vs Ninja",
        "throughput",
        "own CPU per subprocess action",
        "no-op independent of -j",
        "not slower as -j grows",
        "100k analysis (definition + plan)",
        "peak memory per action",
        "100k ÷ 10k",
        "zoo clean",
        "zoo no-op",
        "hermetic process actions",
    ):
        assert expected in names
    assert all(r.met is None for r in rows)
    assert all("not measured" in r.row() for r in rows)


def test_throughput_verdicts(bench) -> None:  # type: ignore[no-untyped-def]
    measure, results, targets, throughput = bench
    t = throughput.ThroughputResult(10_000)

    def series(system: str, wall: float, own: float) -> object:
        s = measure.Series(system)
        s.samples.append(measure.Sample(wall, own + 5.0, 10.0, 0, own_cpu_s=own))
        return s

    # kiln: 1,000/s and 3 ms own CPU per action; Ninja: 1,250/s and 1 ms.
    t.series[2] = {"kiln": series("kiln", 10.0, 30.0), "ninja": series("ninja", 8.0, 10.0)}
    res = results.Results("full", 1, throughput=t)
    rows = {r.name: r for r in targets.targets(res)}
    rate = rows["throughput, 10,000 trivial commands, -j 2: kiln ÷ Ninja actions/s"]
    own = rows["own CPU per subprocess action, -j 2: kiln ÷ Ninja"]
    assert rate.met is True and "(0.80)" in rate.measured
    assert own.met is False and "3.000 ms vs 1.000 ms" in own.measured


def test_dask_rows_state_the_floor_dask_alone_sets(bench) -> None:  # type: ignore[no-untyped-def]
    _, results, targets, _ = bench
    import _dask_row

    d = _dask_row.DaskResult(
        20,
        5000,
        32,
        zoo_local_s=5.0,
        zoo_dask_s=6.0,
        overhead={
            "ideal": 3.12,
            "dask_wall": 30.0,
            "dask_ms_per_action": 5.4,
            "local_wall": 5.4,
            "local_ms_per_action": 0.45,
            "dask_alone_wall": 22.2,
            "dask_alone_ms_per_action": 3.8,
        },
    )
    rows = {r.name: r for r in targets.targets(results.Results("full", 1, dask=d))}
    zoo = rows["issue 13: zoo (20 models) on dask-local:2 vs local -j 2"]
    cost = rows["issue 13: kiln's added cost per action on Dask (5,000 x sleep 0.02 s, 32 workers)"]
    assert zoo.met is True and "(1.20×)" in zoo.measured
    assert cost.met is False and cost.measured.startswith("5.40 ms")
    assert "Dask alone, the same commands from a plain Client: 3.80 ms" in cost.measured
    table = "\n".join(d.table())
    assert "| 5,000 | 32 | 3.12 | 30.00 | 5.40 | 3.80 | 5.40 | 0.45 |" in table


def test_analysis_memory_row_says_where_the_peak_was_reached(bench) -> None:  # type: ignore[no-untyped-def]
    measure, results, targets, _ = bench
    import _report
    import _synthetic

    def analysis(actions: int, rss_mib: float, loaded_mib: float, total_s: float) -> object:
        a = _synthetic.AnalysisResult(actions, graph_bytes=actions * 1900)
        a.phases.append(
            {
                "import_kiln": 0.04,
                "load_module": 0.5,
                "analyze": 0.8,
                "plan": 0.4,
                "total": total_s,
                "actions": actions,
                "peak_loaded_mib": loaded_mib,
            }
        )
        a.process.samples.append(measure.Sample(total_s + 0.1, total_s, rss_mib, 0))
        return a

    big = analysis(100_000, 358.0, 261.0, 1.7)
    res = results.Results("full", 1, analysis=[analysis(10_000, 45.0, 44.0, 0.13), big])
    rows = {r.name: r for r in targets.targets(res)}
    memory = rows["100k analysis, peak memory per action"]
    assert memory.met is False and memory.measured.startswith("3.75 KB")
    assert "261 MiB, 2.74 KB per action, reached while CPython compiled" in memory.measured
    assert "the graph and plan hold 1.90 KB per action (tracemalloc)" in memory.measured
    assert (
        "| 100,000 | 1 | 0.500 | 0.800 | 0.400 | 1.700 | 0.040 | 1.800 | 358 | 261 | 1,900 |"
        in "\n".join(_report.analysis_table([big]))
    )


def test_a_run_without_the_graph_stages_writes_no_empty_graph_table(bench) -> None:  # type: ignore[no-untyped-def]
    _, results, _, _ = bench
    sys.path.insert(0, str(BENCH))
    try:
        import _document

        text = _document.markdown(results.Results("full", 3), "run.py --only-defaults", 60.0, [])
    finally:
        sys.path.remove(str(BENCH))
    assert "## Targets" in text
    assert "layered diamonds" not in text  # --only-defaults ran no graph stage


def test_the_defaults_rows_give_the_no_op_its_floor_and_the_kernels_share(bench) -> None:  # type: ignore[no-untyped-def]
    measure, _, targets, _ = bench
    sys.path.insert(0, str(BENCH))
    try:
        import _defaults
        import _graph
    finally:
        sys.path.remove(str(BENCH))
    d = _defaults.DefaultsResult(_graph.make_graph(100, 100), runs=1)
    py = _defaults.KILN_PY_CACHE.name

    def series(wall: float, sys_s: float | None = None) -> object:
        s = measure.Series(py)
        s.samples.append(measure.Sample(wall, wall, 50.0, 0, sys_s=sys_s))
        return s

    d.series = {
        "clean": {py: series(9.0, 4.5)},
        "no-op": {py: series(0.9), "doit": series(1.3)},
        _defaults.DEFINED: {py: series(0.36)},
    }
    row = next(r for r in targets.defaults_targets(d) if r.name == f"defaults: 10k no-op, {py}")
    assert row.met is False and row.measured == "0.900 s"
    floor = "the graph's definition alone (kiln list --all): 0.360 s, itself over the limit"
    assert row.margin.endswith(floor)
    table = "\n".join(_defaults.defaults_table(d))
    assert f"| 100x100 | clean | {py} | 1 | 9.00 | 9.00 | 4.50 |" in table
    assert f"| 100x100 | no-op | {py} | 1 | 0.90 | 0.90 |  |" in table  # sys not measured


def test_devices_rows_give_placement_per_action_beside_plain_dask(bench) -> None:  # type: ignore[no-untyped-def]
    _, results, targets, _ = bench
    import _devices_row as row
    import _document

    d = row.DevicesResult(
        1000,
        4,
        ["m1", "m2"],
        placement={
            row.KILN_NEED: [20.8],
            row.KILN_ANY: [20.0],
            row.DASK_RES: [8.0],
            row.DASK_ANY: [7.9],
        },
        single={
            row.KILN_NEED: [3.8],
            row.KILN_ANY: [3.0],
            row.DASK_RES: [0.01],
            row.DASK_ANY: [0.01],
        },
        cpu={
            row.KILN_NEED: [10.5],
            row.KILN_ANY: [10.0],
            row.DASK_RES: [5.1],
            row.DASK_ANY: [5.0],
        },
        cpu_single={
            row.KILN_NEED: [1.5],
            row.KILN_ANY: [1.5],
            row.DASK_RES: [0.1],
            row.DASK_ANY: [0.1],
        },
        zoo={row.ZOO_LOCAL: [10.0, 12.0, 11.0], row.ZOO_DASK: [22.0, 20.0, 24.0]},
        zoo_statuses={row.ZOO_LOCAL: {"built": 10, "skipped": 4}},
        device_checks="The 4 checks of the cuda:sm_89 modules ran: 4 on w0 (w0 has the device).",
    )
    # Per action is marginal: (wall of 1,000 - wall of one) / 999.
    assert abs(d.ms_per_action(row.KILN_NEED) - 17.0 / 999 * 1000) < 1e-9
    assert abs(d.added_ms(row.KILN_NEED, row.KILN_ANY)) < 1e-9
    # The verdict is on the CPU every process spent: 0.5 s more over 999 actions.
    assert abs(d.added_ms(row.KILN_NEED, row.KILN_ANY, cpu=True) - 500 / 999) < 1e-9
    rows = {r.name: r for r in targets.targets(results.Results("full", 3, devices=d))}
    name = "issue 39: device placement's own cost per action, CPU of every process (1,000 actions)"
    cost = rows[name]
    assert cost.met is True and cost.goal == "< 1 ms"
    assert cost.measured.startswith("0.501 ms (Dask's own for resources: 0.100 ms")
    assert "in wall, paired by round: 0.000 ms (rounds: 0.000 to 0.000)" in cost.measured
    assert "in CPU, paired by round: 0.501 ms (rounds: 0.501 to 0.501)" in cost.measured
    table = "\n".join(d.table())
    assert "| kiln, needs cuda:sm_89 | 20.80 | 3.80 | 17.017 | 2.13× | 10.50 | 9.009 |" in table
    assert "| Dask, no resource | 7.90 | 0.01 | 7.898 | 1.00× | 5.00 | 4.905 |" in table
    # A round whose wall says more than the CPU does shows in the paired range.
    d.placement[row.KILN_NEED].append(23.8)
    d.single[row.KILN_NEED].append(3.8)
    d.placement[row.KILN_ANY].append(20.0)
    d.single[row.KILN_ANY].append(3.0)
    assert d.spread(row.KILN_NEED, row.KILN_ANY) == "1.502 ms (rounds: 0.000 to 3.003)"
    # The zoo: medians, the ratio to the local build, what each output came to.
    assert "| local -j 2 | 11.00 | 1.00× | 10 built, 4 skipped |" in table
    assert f"| {row.ZOO_DASK} | 22.00 | 2.00× |  |" in table
    assert "Models: m1, m2." in table and "4 on w0" in table
    text = _document.markdown(results.Results("full", 3, devices=d), "run.py", 1.0, [])
    assert "## Devices on Dask (issue 39)" in text


def test_devices_rows_unmeasured_say_so(bench) -> None:  # type: ignore[no-untyped-def]
    _, results, targets, _ = bench
    import _devices_row as row

    d = row.DevicesResult(1000, 4, [])
    rows = [r for r in targets.targets(results.Results("quick", 3, devices=d)) if "39" in r.name]
    assert len(rows) == 1 and rows[0].met is None and "not measured" in rows[0].row()
    assert d.table() == []
    # Without a one-action wall, per action falls back to wall / actions.
    d.placement = {row.KILN_NEED: [2.0]}
    assert d.ms_per_action(row.KILN_NEED) == 2.0
    assert d.ms_per_action(row.KILN_ANY) is None and d.added_ms(row.KILN_NEED, row.KILN_ANY) is None
