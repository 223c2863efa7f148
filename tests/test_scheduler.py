"""Scheduling: an action starts only when every dependency succeeded, ``-j`` bounds
concurrency, failures cascade to dependents only, ``--fail-fast`` stops launching,
and the end of a build names the root causes.

In-process tests drive ``Executor.run`` with actions that record what they do;
hypothesis checks the invariants on random graphs. The CLI tests run real
``kiln build`` subprocesses on build modules written to disk.
"""

from __future__ import annotations

import json
import re
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator, Set
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln.base.errors import BuildDefinitionError
from kiln.engine.scheduler import BuildResult, SchedulerOptions
from kiln.executor import (
    ActionConcurrency,
    BuildAction,
    BuildContext,
    BuildDependency,
    BuildFile,
    DependenceException,
    Executor,
    ProgressReporter,
)
from kiln.planning.plan import make_plan

HEADER = """\
from kiln import cl_arg, entrypoint, run_command, source_file
from kiln.executor import *
"""


class Failure(RuntimeError):
    """Raised by a recorded action that was told to fail."""


@dataclass
class Recorder:
    """What recorded actions did, in order, from any thread."""

    events: list[tuple[str, str]] = field(default_factory=list)
    times: dict[tuple[str, str], float] = field(default_factory=dict)
    running: int = 0
    max_running: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def note(self, kind: str, name: str) -> None:
        with self.lock:
            self.events.append((kind, name))
            self.times[(kind, name)] = time.monotonic()
            if kind == "start":
                self.running += 1
                self.max_running = max(self.max_running, self.running)
            else:
                self.running -= 1

    def started(self) -> list[str]:
        return [name for kind, name in self.events if kind == "start"]

    def index(self, kind: str, name: str) -> int:
        return self.events.index((kind, name))


class RecordedAction(BuildAction):
    """Writes its output after sleeping ``sleep`` s, or raises ``Failure``."""

    def __init__(
        self, *, rec: Recorder, out: BuildFile, fail: bool = False, sleep: float = 0.0, **kw
    ):
        super().__init__(**kw)
        self._rec = rec
        self._out = out
        self._fail = fail
        self._sleep = sleep

    def _invoke(self) -> None:
        self._rec.note("start", self.desc)
        try:
            if self._sleep:
                time.sleep(self._sleep)
            if self._fail:
                raise Failure(f"{self.desc} failed on purpose")
            self._out.get_fs_path().write_text(self.desc)
        finally:
            self._rec.note("end", self.desc)


class RecordingReporter(ProgressReporter):
    """Keeps every event the scheduler reports."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.graphs: list[Set[BuildDependency]] = []
        self.started: list[str] = []
        self.finished: list[str] = []
        self.failures: list[str] = []
        self.ended = 0

    def start_graph(self, all_deps: Set[BuildDependency]) -> None:
        self.graphs.append(set(all_deps))

    def start_dep(self, dep: BuildDependency) -> None:
        with self.lock:
            self.started.append(str(dep))

    def finish_dep(self, dep: BuildDependency) -> None:
        with self.lock:
            self.finished.append(str(dep))

    def report_failure(self, dep: BuildDependency) -> None:
        with self.lock:
            self.failures.append(str(dep))

    def end_graph(self) -> None:
        self.ended += 1


@dataclass
class Node:
    deps: list[str] = field(default_factory=list)
    fail: bool = False
    sleep: float = 0.0
    concurrency: ActionConcurrency = ActionConcurrency.THREAD


@dataclass
class Graph:
    executor: Executor
    rec: Recorder
    reporter: RecordingReporter
    files: dict[str, BuildFile]
    actions: dict[str, BuildAction]

    def run(self, targets: Collection[str] | None = None, **options) -> BuildResult:
        names = self.files if targets is None else targets
        return self.executor.run([self.files[n] for n in names], SchedulerOptions(**options))


pytestmark = pytest.mark.in_process


def declare(output_dir: Path, nodes: dict[str, Node]) -> Graph:
    """Declare one recorded action per node (in the given order, deps first), each
    producing the file named after it."""
    reporter = RecordingReporter()
    executor = Executor(output_dir, reporter=reporter)
    rec = Recorder()
    files: dict[str, BuildFile] = {}
    actions: dict[str, BuildAction] = {}
    with executor.get_context(""):
        ctx = BuildContext.current()
        for name, node in nodes.items():
            out = ctx.allocate_file(name)
            action = RecordedAction(
                rec=rec,
                out=out,
                fail=node.fail,
                sleep=node.sleep,
                desc=name,
                executor=executor,
                concurrency=node.concurrency,
                deps=[files[d] for d in node.deps],
            )
            out.deps.add(action)
            files[name] = out
            actions[name] = action
    return Graph(executor, rec, reporter, files, actions)


@pytest.fixture
def graph(tmp_path: Path) -> Iterator[Callable[[dict[str, Node]], Graph]]:
    made: list[Graph] = []

    def make(nodes: dict[str, Node]) -> Graph:
        g = declare(tmp_path / f"out{len(made)}", nodes)
        made.append(g)
        return g

    yield make
    for g in made:
        g.executor.close()


def names(actions: Collection[BuildAction]) -> set[str]:
    return {a.desc for a in actions}


# -- ordering and concurrency ------------------------------------------------


def test_diamond_join_starts_after_slow_branch_ended(graph) -> None:
    # The seed started D as soon as ANY input was ready: here, when fast C ended
    # while slow B was still running.
    g = graph(
        {
            "A": Node(),
            "B": Node(deps=["A"], sleep=0.5),
            "C": Node(deps=["A"]),
            "D": Node(deps=["B", "C"]),
        }
    )
    result = g.run(["D"], jobs=4)

    assert result.ok
    assert names(result.built) == {"A", "B", "C", "D"}
    rec = g.rec
    assert rec.index("end", "C") < rec.index("end", "B")  # C really was the fast one
    assert rec.index("end", "B") < rec.index("start", "D")
    assert rec.index("end", "C") < rec.index("start", "D")
    assert rec.times[("end", "B")] <= rec.times[("start", "D")]
    assert rec.started().count("D") == 1


@pytest.mark.parametrize("jobs", [1, 2, 3])
def test_jobs_bounds_running_actions(graph, jobs: int) -> None:
    g = graph({f"a{i}": Node(sleep=0.2) for i in range(6)})
    result = g.run(jobs=jobs)

    assert result.ok and len(result.built) == 6
    assert g.rec.max_running == jobs


def test_inline_actions_count_against_jobs(graph) -> None:
    nodes = {f"t{i}": Node(sleep=0.1) for i in range(4)}
    nodes |= {f"n{i}": Node(sleep=0.05, concurrency=ActionConcurrency.NONE) for i in range(3)}
    g = graph(nodes)
    result = g.run(jobs=2)

    assert result.ok and len(result.built) == 7
    assert g.rec.max_running <= 2


def test_failure_cascades_to_transitive_dependents_only(graph) -> None:
    g = graph(
        {
            "A": Node(fail=True),
            "B": Node(deps=["A"]),
            "C": Node(deps=["B"]),
            "D": Node(),
            "E": Node(deps=["D"]),
        }
    )
    result = g.run(jobs=2)

    assert not result.ok
    assert names(result.failed) == {"A"}
    assert names(result.not_run) == {"B", "C"}
    assert names(result.built) == {"D", "E"}
    assert set(g.rec.started()) == {"A", "D", "E"}
    assert isinstance(g.actions["A"].failure, Failure)
    for name in ("B", "C"):
        assert isinstance(g.actions[name].failure, DependenceException)
        assert g.actions[name].is_dependence_failure
    assert g.actions["E"].failure is None
    assert g.reporter.failures == ["A"]
    assert not g.files["B"].get_fs_path().exists()


def test_fail_fast_launches_nothing_after_a_failure(graph) -> None:
    nodes = {"bad": Node(fail=True)}
    nodes |= {f"ok{i}": Node(deps=[f"ok{i - 1}"] if i else []) for i in range(4)}
    g = graph(nodes)
    result = g.run(["bad", "ok3"], jobs=1, fail_fast=True)

    assert names(result.failed) == {"bad"}
    started = g.rec.started()
    assert started.index("bad") == len(started) - 1  # nothing launched after it
    assert names(result.not_run) == {f"ok{i}" for i in range(4)} - set(started)
    assert not result.ok


def test_without_fail_fast_the_rest_of_the_graph_builds(graph) -> None:
    nodes = {"bad": Node(fail=True)}
    nodes |= {f"ok{i}": Node(deps=[f"ok{i - 1}"] if i else []) for i in range(4)}
    g = graph(nodes)
    result = g.run(["bad", "ok3"], jobs=1)

    assert names(result.failed) == {"bad"}
    assert names(result.built) == {"ok0", "ok1", "ok2", "ok3"}
    assert result.not_run == []


def test_only_what_the_targets_need_runs(graph) -> None:
    g = graph({"A": Node(), "B": Node(deps=["A"]), "C": Node(), "D": Node(deps=["C"])})
    result = g.run(["B"], jobs=2)

    assert names(result.built) == {"A", "B"}
    assert set(g.rec.started()) == {"A", "B"}


def test_reporter_sees_every_action_once(graph) -> None:
    g = graph({"A": Node(), "B": Node(deps=["A"], fail=True), "C": Node(deps=["B"])})
    g.run(jobs=2)

    r = g.reporter
    assert len(r.graphs) == 1 and r.ended == 1
    assert {str(d) for d in r.graphs[0] if isinstance(d, BuildAction)} == {"A", "B", "C"}
    assert sorted(r.started) == ["A", "B"]
    assert sorted(r.finished) == ["A", "B"]
    assert r.failures == ["B"]


def test_second_build_runs_nothing(graph) -> None:
    nodes = {"A": Node(), "B": Node(deps=["A"])}
    first = graph(nodes)
    assert first.run(jobs=2).ok
    first.executor.close()
    again = declare(first.executor.output_dir, nodes)
    try:
        result = again.run(jobs=2)
    finally:
        again.executor.close()
    assert result.ok
    assert result.built == [] and names(result.skipped) == {"A", "B"}
    assert again.rec.started() == []


# -- invariants on random graphs ---------------------------------------------


@dataclass
class RandomBuild:
    deps: list[list[int]]
    failing: set[int]
    targets: set[int]
    concurrency: list[ActionConcurrency]
    jobs: int


@st.composite
def random_builds(draw: st.DrawFn, max_actions: int = 30) -> RandomBuild:
    n = draw(st.integers(1, max_actions))
    deps = [
        sorted(draw(st.sets(st.integers(0, i - 1), max_size=min(i, 4)))) if i else []
        for i in range(n)
    ]
    failing = draw(st.sets(st.integers(0, n - 1), max_size=max(1, n // 4)))
    targets = draw(st.sets(st.integers(0, n - 1), min_size=1))
    kinds = st.sampled_from([ActionConcurrency.THREAD, ActionConcurrency.NONE])
    concurrency = draw(st.lists(kinds, min_size=n, max_size=n))
    jobs = draw(st.integers(1, 4))
    return RandomBuild(deps, failing, targets, concurrency, jobs)


def closure(start: set[int], edges: list[list[int]]) -> set[int]:
    """``start`` and every node reachable from it along ``edges``."""
    seen = set(start)
    stack = list(start)
    while stack:
        for nxt in edges[stack.pop()]:
            if nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def run_random(spec: RandomBuild, fail_fast: bool = False) -> tuple[Graph, BuildResult]:
    nodes = {
        f"n{i}": Node(
            deps=[f"n{d}" for d in spec.deps[i]],
            fail=i in spec.failing,
            concurrency=spec.concurrency[i],
        )
        for i in range(len(spec.deps))
    }
    with tempfile.TemporaryDirectory() as out:
        g = declare(Path(out), nodes)
        try:
            result = g.run(
                [f"n{t}" for t in sorted(spec.targets)], jobs=spec.jobs, fail_fast=fail_fast
            )
        finally:
            g.executor.close()
    return g, result


RANDOM = settings(max_examples=75, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@RANDOM
@given(random_builds())
def test_random_graph_invariants(spec: RandomBuild) -> None:
    g, result = run_random(spec)
    n = len(spec.deps)
    consumers: list[list[int]] = [[] for _ in range(n)]
    for i, ds in enumerate(spec.deps):
        for d in ds:
            consumers[d].append(i)
    needed = closure(spec.targets, spec.deps)
    # Not run: everything downstream (strictly) of a failing action it needs.
    blocked = closure({c for f in spec.failing & needed for c in consumers[f]}, consumers)
    blocked &= needed
    ran = needed - blocked

    started = g.rec.started()
    assert len(started) == len(set(started)), "an action ran twice"
    assert set(started) == {f"n{i}" for i in ran}
    for i in ran:
        for d in spec.deps[i]:
            assert g.rec.index("end", f"n{d}") < g.rec.index("start", f"n{i}")
    assert names(result.failed) == {f"n{i}" for i in ran & spec.failing}
    assert names(result.built) == {f"n{i}" for i in ran - spec.failing}
    assert names(result.not_run) == {f"n{i}" for i in blocked}
    assert len(result.not_run) == len(blocked)
    assert result.skipped == []
    assert result.ok == (not (needed & spec.failing))
    for i in blocked:
        assert isinstance(g.actions[f"n{i}"].failure, DependenceException)
    for i in ran:
        failure = g.actions[f"n{i}"].failure
        assert isinstance(failure, Failure) if i in spec.failing else failure is None
    assert g.rec.max_running <= spec.jobs


@RANDOM
@given(random_builds(max_actions=20))
def test_random_graph_fail_fast_with_one_job(spec: RandomBuild) -> None:
    spec.jobs = 1
    g, result = run_random(spec, fail_fast=True)

    started = g.rec.started()
    assert len(started) == len(set(started))
    failed = [i for i, name in enumerate(started) if int(name[1:]) in spec.failing]
    if failed:
        assert failed == [len(started) - 1], "an action started after the first failure"
        assert len(result.failed) == 1
    needed = {f"n{i}" for i in closure(spec.targets, spec.deps)}
    assert names(result.not_run) == needed - set(started)
    assert names(result.built) == set(started) - names(result.failed)


class _Vertex:
    """A node of an arbitrary (possibly cyclic) graph, for the plan's walk alone."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.deps: set[_Vertex] = set()

    def __str__(self) -> str:
        return self.name


@st.composite
def any_digraphs(draw: st.DrawFn) -> tuple[list[set[int]], list[int]]:
    n = draw(st.integers(1, 12))
    edges = [draw(st.sets(st.integers(0, n - 1), max_size=4)) for _ in range(n)]
    targets = draw(st.lists(st.integers(0, n - 1), min_size=1, max_size=4))
    return edges, targets


def _has_cycle(edges: list[set[int]], reached: set[int]) -> bool:
    remaining = {i: len(edges[i]) for i in reached}  # Kahn's algorithm, by dependencies
    users: dict[int, list[int]] = {i: [] for i in reached}
    for i in reached:
        for d in edges[i]:
            users[d].append(i)
    ready = [i for i, k in remaining.items() if k == 0]
    done = 0
    while ready:
        done += 1
        for u in users[ready.pop()]:
            remaining[u] -= 1
            if remaining[u] == 0:
                ready.append(u)
    return done < len(reached)


@RANDOM
@given(any_digraphs())
def test_plan_of_any_graph_is_an_order_or_names_a_real_cycle(
    graph: tuple[list[set[int]], list[int]],
) -> None:
    """On any directed graph: the plan is a topological order of exactly what the
    targets reach, with every edge in ``consumers``, or a cycle error whose path is
    made of real edges and closes on itself."""
    edges, targets = graph
    nodes = [_Vertex(f"v{i}") for i in range(len(edges))]
    for node, deps in zip(nodes, edges, strict=True):
        node.deps = {nodes[d] for d in deps}
    reached = closure(set(targets), [sorted(e) for e in edges])
    index = {node: i for i, node in enumerate(nodes)}
    try:
        plan = make_plan([nodes[t] for t in targets], [])  # type: ignore[misc]
    except BuildDefinitionError as e:
        assert _has_cycle(edges, reached), str(e)
        path = re.search(r"dependency cycle: (.+) \(each needs", str(e))
        assert path, str(e)
        names = path.group(1).split(" -> ")
        assert names[0] == names[-1] and len(names) >= 2
        for a, b in zip(names[:-1], names[1:], strict=True):
            assert int(b[1:]) in edges[int(a[1:])], f"{a} -> {b} is no edge: {e}"
        return
    assert not _has_cycle(edges, reached)
    order = [index[n] for n in plan.order]  # type: ignore[index]
    assert sorted(order) == sorted(reached)
    position = {i: k for k, i in enumerate(order)}
    for i in reached:
        assert all(position[d] < position[i] for d in edges[i])
        users = sorted(index[u] for u in plan.consumers[nodes[i]])  # type: ignore[index]
        assert users == sorted(u for u in reached if i in edges[u])


# -- through the command line --------------------------------------------------

TIMED = (
    HEADER
    + """
import functools
import json
import os
import threading
import time
from pathlib import Path

_lock = threading.Lock()
_state = {"running": 0, "max": 0}


class Timed(BuildAction):
    def __init__(self, out, sleep, fail, **kw):
        super().__init__(**kw)
        self.out = out
        self.sleep = sleep
        self.fail = fail

    def _invoke(self):
        with _lock:
            _state["running"] += 1
            _state["max"] = max(_state["max"], _state["running"])
        start = time.time()
        try:
            time.sleep(self.sleep)
            if self.fail:
                raise ValueError(f"boom in {self.desc}")
        finally:
            with _lock:
                _state["running"] -= 1
        record = {"start": start, "end": time.time(), "pid": os.getpid()}
        self.out.get_fs_path().write_text(json.dumps(record))


class MaxRunning(BuildAction):
    def __init__(self, out, **kw):
        super().__init__(**kw)
        self.out = out

    def _invoke(self):
        self.out.get_fs_path().write_text(str(_state["max"]))


def timed(name, sleep=0.0, inputs=(), fail=False):
    ctx = BuildContext.current()
    out = ctx.allocate_file(name)
    deps = ctx.files(list(inputs))
    out.deps.add(Timed(out, sleep, fail, desc=f"timed {name}", executor=ctx.executor, deps=deps))
    return out


def max_running(inputs):
    ctx = BuildContext.current()
    out = ctx.allocate_file("max_running.txt")
    deps = ctx.files(list(inputs))
    out.deps.add(MaxRunning(out, desc="count", executor=ctx.executor, deps=deps))
    return out
"""
)


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def test_cli_diamond_join_waits_for_the_slow_branch(write_module, kiln, tmp_path: Path) -> None:
    write_module(
        TIMED
        + """
@entrypoint
def diamond():
    a = timed("a")
    b = timed("b", sleep=0.5, inputs=[a])
    c = timed("c", inputs=[a])
    return timed("d", inputs=[b, c])
""",
        header=False,
    )
    r = kiln("build", "build.py", "-j", "4")

    assert r.returncode == 0, r.stderr
    gen = tmp_path / "kiln-out" / "genfiles" / "diamond"
    b, c, d = (read_json(gen / n) for n in "bcd")
    assert c["end"] <= b["end"]
    assert b["end"] <= d["start"]
    assert r.stdout.splitlines() == [str(gen / "d")]


def test_cli_jobs_bounds_concurrency(write_module, kiln, tmp_path: Path) -> None:
    write_module(
        TIMED
        + """
@entrypoint
def parallel():
    return max_running([timed(f"t{i}", sleep=0.2) for i in range(6)])
""",
        header=False,
    )
    r = kiln("build", "build.py", "-j", "2")

    assert r.returncode == 0, r.stderr
    out = tmp_path / "kiln-out" / "genfiles" / "parallel" / "max_running.txt"
    assert out.read_text() == "2"


FAIL_FAST = (
    TIMED
    + """
@entrypoint
def chain():
    x1 = timed("x1", sleep=0.5)
    x2 = timed("x2", inputs=[x1])
    return timed("x3", inputs=[x2])

@entrypoint
def bad():
    return timed("bad", fail=True)
"""
)


def test_cli_failure_leaves_unrelated_actions_building(write_module, kiln, tmp_path) -> None:
    write_module(FAIL_FAST, header=False)
    r = kiln("build", "build.py", "-j", "2")

    assert r.returncode == 1
    assert (tmp_path / "kiln-out" / "genfiles" / "chain" / "x3").is_file()
    assert "3 built, 0 up to date, 1 failed, 0 not run" in r.stderr
    # stdout lists the outputs of the targets that did build
    assert r.stdout.splitlines() == [str(tmp_path / "kiln-out" / "genfiles" / "chain" / "x3")]


def test_cli_fail_fast_stops_launching(write_module, kiln, tmp_path: Path) -> None:
    write_module(FAIL_FAST, header=False)
    r = kiln("build", "build.py", "-j", "2", "--fail-fast")

    assert r.returncode == 1
    gen = tmp_path / "kiln-out" / "genfiles" / "chain"
    assert not (gen / "x2").exists() and not (gen / "x3").exists()
    assert re.search(r"FAILED: \d built, 0 up to date, 1 failed, 2 not run", r.stderr), r.stderr


def test_cli_cascade_names_the_root_cause_with_traceback(write_module, kiln) -> None:
    path = write_module(
        TIMED
        + """
@entrypoint
def broken():
    first = timed("first", fail=True)
    return timed("second", inputs=[first])
""",
        header=False,
    )
    # The action is created in the module's helper ``timed``: that is its definition.
    lines = path.read_text().splitlines()
    line = 1 + next(i for i, text in enumerate(lines) if "out.deps.add(Timed(" in text)
    r = kiln("build", "build.py")

    assert r.returncode == 1
    summary = r.stderr[r.stderr.index("Root causes:") :]
    assert "timed first" in summary
    assert f"defined at {path}:{line}" in summary
    # Its details were printed when it failed, and only then.
    assert r.stderr.count("Traceback (most recent call last)") == 1
    assert r.stderr.count("ValueError: boom in timed first") == 1
    assert "timed second" not in summary  # a dependent is not a root cause
    assert "FAILED: 0 built, 0 up to date, 1 failed, 1 not run" in r.stderr


PROCESS = (
    HEADER
    + """
import functools
import os
from pathlib import Path


def write_pid(path):
    Path(path).write_text(str(os.getpid()))


def explode(message):
    raise ValueError(message)


def crash():
    os._exit(3)


class InProcess(BuildAction):
    def __init__(self, out, **kw):
        super().__init__(**kw)
        self.out = out

    def _invoke(self):
        write_pid(self.out.get_fs_path())


class OutOfProcess(BuildAction):
    def __init__(self, thunk, **kw):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kw)
        self.thunk = thunk

    def _remotable_thunk(self):
        return self.thunk


def out_of_process(name, make_thunk):
    ctx = BuildContext.current()
    out = ctx.allocate_file(name)
    thunk = make_thunk(str(out.get_fs_path()))
    out.deps.add(OutOfProcess(thunk, desc=f"process {name}", executor=ctx.executor))
    return out


@entrypoint
def pids():
    ctx = BuildContext.current()
    here = ctx.allocate_file("here.txt")
    here.deps.add(InProcess(here, desc="thread here.txt", executor=ctx.executor))
    there = out_of_process("there.txt", lambda p: functools.partial(write_pid, p))
    return [here, there]


@entrypoint
def raises():
    return out_of_process("raises.txt", lambda p: functools.partial(explode, "boom from worker"))


@entrypoint
def crashes():
    return out_of_process("crashes.txt", lambda p: crash)
"""
)


def test_process_actions_run_from_a_module_loaded_by_path(write_module, kiln, tmp_path) -> None:
    write_module(PROCESS, name="sub/build.py", header=False)
    r = kiln("build", "sub/build.py", "pids")

    assert r.returncode == 0, r.stderr
    gen = tmp_path / "kiln-out" / "genfiles" / "pids"
    here, there = (gen / "here.txt").read_text(), (gen / "there.txt").read_text()
    assert here.isdigit() and there.isdigit() and here != there
    assert r.stdout.splitlines() == [str(gen / "here.txt"), str(gen / "there.txt")]


def test_process_action_failure_names_the_exception(write_module, kiln) -> None:
    write_module(PROCESS, header=False)
    r = kiln("build", "build.py", "raises", "pids")

    assert r.returncode == 1
    summary = r.stderr[r.stderr.index("Root causes:") :]
    assert "process raises.txt" in summary
    assert r.stderr.count("ValueError: boom from worker") == 1  # when it failed
    assert "Traceback" not in r.stderr
    assert "2 built, 0 up to date, 1 failed, 0 not run" in r.stderr

    # It would fail the same way: not run again; -v shows the traceback it had.
    verbose = kiln("build", "build.py", "raises", "-v")
    assert "process raises.txt failed (unchanged): ValueError: boom from worker" in verbose.stderr
    assert "Traceback" in verbose.stderr and "explode" in verbose.stderr


def test_crashing_worker_fails_only_its_action(write_module, kiln, tmp_path) -> None:
    write_module(PROCESS, header=False)
    r = kiln("build", "build.py", "crashes", "pids", "-j", "2")

    assert r.returncode == 1
    assert "exit code 3" in r.stderr
    assert (tmp_path / "kiln-out" / "genfiles" / "pids" / "there.txt").read_text().isdigit()
    assert "2 built, 0 up to date, 1 failed, 0 not run" in r.stderr
