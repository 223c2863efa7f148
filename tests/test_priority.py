"""Critical-path scheduling: of the ready actions, the one with the longest
remaining path starts first, by durations recorded in past builds (by chain
length without history); the durations table is added to old databases."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hypothesis import given
from test_scheduler import RANDOM, Node, RandomBuild, closure, declare, random_builds, run_random

from kiln.executor import ActionConcurrency
from kiln.state import StateStore

# Three independent chains, declared shortest first: c1 (1 action), c2 (2), c3 (3).
CHAINS = {
    "c1_0": Node(),
    "c2_0": Node(),
    "c2_1": Node(deps=["c2_0"]),
    "c3_0": Node(),
    "c3_1": Node(deps=["c3_0"]),
    "c3_2": Node(deps=["c3_1"]),
}
TAILS = ["c1_0", "c2_1", "c3_2"]


def test_longest_chain_starts_first_without_history(tmp_path: Path) -> None:
    g = declare(tmp_path / "out", CHAINS)
    try:
        assert g.run(TAILS, jobs=1).ok
    finally:
        g.executor.close()
    started = g.rec.started()
    heads = [name for name in started if name.endswith("_0")]
    assert heads == ["c3_0", "c2_0", "c1_0"], started


def test_without_critical_path_the_order_is_first_come(tmp_path: Path) -> None:
    g = declare(tmp_path / "out", CHAINS)
    try:
        assert g.run(TAILS, jobs=1, critical_path=False).ok
    finally:
        g.executor.close()
    heads = [name for name in g.rec.started() if name.endswith("_0")]
    assert heads == ["c1_0", "c2_0", "c3_0"]


SKEWED = {
    "slow": Node(sleep=0.3),
    "quick0": Node(),
    "quick1": Node(deps=["quick0"]),
}


def test_recorded_durations_decide_the_order(tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = declare(out, SKEWED)
    try:
        assert first.run(["slow", "quick1"], jobs=1).ok
    finally:
        first.executor.close()
    # No history: the two-action chain goes first.
    assert first.rec.started()[0] == "quick0"

    store = StateStore(out, warn=lambda m: None)
    try:
        durations = store.durations()
    finally:
        store.close()
    assert set(durations) == {"gen/slow", "gen/quick0", "gen/quick1"}
    assert durations["gen/slow"] >= 0.25 and durations["gen/quick0"] < 0.25

    for name in SKEWED:  # make every action run again
        (out / "genfiles" / name).unlink()
    second = declare(out, SKEWED)
    try:
        assert second.run(["slow", "quick1"], jobs=1).ok
    finally:
        second.executor.close()
    # With history, 0.3 s of "slow" outweighs the chain of two quick actions.
    assert second.rec.started()[0] == "slow"


def test_a_database_without_durations_gains_the_table(tmp_path: Path) -> None:
    out = tmp_path / "out"
    g = declare(out, {"a": Node(), "b": Node(deps=["a"])})
    try:
        assert g.run(["b"]).ok
    finally:
        g.executor.close()
    db_path = out / ".kiln" / "state.db"
    with sqlite3.connect(db_path) as db:  # as an older kiln wrote it
        db.execute("DROP TABLE durations")

    warnings: list[str] = []
    store = StateStore(out, warn=warnings.append)
    try:
        assert store.durations() == {}
        assert set(store.records()) == {"gen/a", "gen/b"}  # nothing lost
    finally:
        store.close()
    assert warnings == []
    assert not list((out / ".kiln").glob("state.db.corrupt-*"))
    with sqlite3.connect(db_path) as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
    assert "durations" in tables

    again = declare(out, {"a": Node(), "b": Node(deps=["a"])})
    try:
        result = again.run(["b"])
    finally:
        again.executor.close()
    assert result.ok and result.built == [] and len(result.skipped) == 2


@pytest.mark.slow
@RANDOM
@given(random_builds(max_actions=20))
def test_random_graph_starts_a_longest_chain_first(spec: RandomBuild) -> None:
    spec.failing = set()
    spec.concurrency = [ActionConcurrency.THREAD] * len(spec.deps)
    spec.jobs = 1
    g, result = run_random(spec)
    assert result.ok
    needed = closure(spec.targets, spec.deps)
    consumers: dict[int, list[int]] = {i: [] for i in needed}
    for i in needed:
        for d in spec.deps[i]:
            consumers[d].append(i)
    chain: dict[int, int] = {}  # actions on the longest path from i to the end
    for i in sorted(needed, reverse=True):  # deps have smaller numbers
        chain[i] = 1 + max((chain[c] for c in consumers[i]), default=0)
    roots = [i for i in needed if not spec.deps[i]]
    first = int(g.rec.started()[0][1:])
    assert first in roots
    assert chain[first] == max(chain[r] for r in roots)
