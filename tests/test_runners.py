"""The runner protocol (``kiln.engine.runner``): the dispatcher gives each action to
the first of its runners that takes it, so a new backend is one more class in the
list; the dispatcher asks nothing of an action's kind itself; and the check of
``--check-reproducible`` picks its second runs from its own list the same way."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path
from typing import Any

import pytest
from test_scheduler import Node, declare

from kiln.engine import dispatch, scheduler
from kiln.engine.action_outputs import ActionOutputs
from kiln.engine.incremental import Decision
from kiln.engine.reproducible import ReproducibilityCheck
from kiln.engine.runner import ON_A_WORKER, Placement, Runner, first_taking
from kiln.engine.shared import Shared
from kiln.executor import ActionConcurrency, BuildAction

pytestmark = pytest.mark.in_process


class ElsewhereRunner(Runner):
    """A backend of the kind a later issue adds: it takes the actions whose name
    starts with ``elsewhere``, runs them on a worker thread and says so."""

    def __init__(self, shared: Shared) -> None:
        self.shared = shared
        self.ran: list[str] = []
        self.shut = 0

    def takes(self, action: BuildAction) -> bool:
        return action.desc.startswith("elsewhere")

    def placement(self, action: BuildAction) -> Placement:
        return ON_A_WORKER

    def start(self, action: BuildAction, decision: Decision) -> None:
        self.shared.events.started(action, decision)
        self.ran.append(action.desc)
        action._invoke()
        produced = ActionOutputs.hash(action, self.shared.plan.outputs[action], {})
        self.shared.done.put((action, decision, None, produced))

    def shutdown(self, interrupted: bool) -> None:
        self.shut += 1


def test_a_runner_added_to_the_list_takes_its_actions(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    added: list[ElsewhereRunner] = []

    class WithElsewhere(dispatch.Dispatcher):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            added.append(ElsewhereRunner(self.shared))
            self.runners.insert(1, added[0])  # after the cache, before the rest

    monkeypatch.setattr(scheduler, "Dispatcher", WithElsewhere)
    nodes = {
        "here": Node(),
        "elsewhere-a": Node(deps=["here"]),
        "elsewhere-b": Node(concurrency=ActionConcurrency.NONE),
        "last": Node(deps=["elsewhere-a", "elsewhere-b"]),
    }
    g = declare(tmp_path / "out", nodes)
    try:
        result = g.run()
    finally:
        g.executor.close()
    assert not result.failed
    assert sorted(added[0].ran) == ["elsewhere-a", "elsewhere-b"]
    assert g.rec.started() and set(g.rec.started()) == set(nodes)
    assert (tmp_path / "out/genfiles/elsewhere-b").read_text() == "elsewhere-b"
    assert added[0].shut == 1


def test_the_last_runner_takes_every_action_and_the_first_that_takes_wins() -> None:
    class Taking:
        def __init__(self, name: str, prefix: str) -> None:
            self.name, self.prefix = name, prefix

        def takes(self, action: BuildAction) -> bool:
            return action.desc.startswith(self.prefix)

    class Named:
        def __init__(self, desc: str) -> None:
            self.desc = desc

    runners = [Taking("a", "a"), Taking("ab", "ab"), Taking("any", "")]
    assert first_taking(runners, Named("abc")).name == "a"  # type: ignore[arg-type]
    assert first_taking(runners, Named("xyz")).name == "any"  # type: ignore[arg-type]
    with pytest.raises(LookupError):
        first_taking(runners[:2], Named("xyz"))  # type: ignore[arg-type]


# Names that would mean the dispatcher tells backends or action kinds apart itself.
_BACKEND_NAMES = {
    "ActionConcurrency",
    "concurrency",
    "SpawnsCommand",
    "RemotableCommand",
    "remotable",
    "timeout",
    "cache",
    "remote",
    "ProcessPool",
    "ClusterOffload",
    "CacheRunner",
    "ClusterRunner",
    "ProcessRunner",
    "InlineRunner",
    "ThreadRunner",
    "is_tiny",
}


def backend_branches(source: str) -> list[str]:
    """The conditions and ``isinstance`` checks of ``source`` that read an action's
    kind or a backend (any ``isinstance`` but of the runner protocol's answers and
    of Ctrl-C)."""
    tree = ast.parse(source)
    conditions = [
        n.test for n in ast.walk(tree) if isinstance(n, ast.If | ast.IfExp | ast.While)
    ] + [n for n in ast.walk(tree) if isinstance(n, ast.BoolOp)]
    found = []
    for condition in conditions:
        named = {n.id for n in ast.walk(condition) if isinstance(n, ast.Name)}
        named |= {n.attr for n in ast.walk(condition) if isinstance(n, ast.Attribute)}
        if named & _BACKEND_NAMES:
            found.append(ast.unparse(condition))
    for call in ast.walk(tree):
        if (
            isinstance(call, ast.Call)
            and ast.unparse(call.func) == "isinstance"
            and ast.unparse(call.args[1]) not in {"Later", "KeyboardInterrupt"}
        ):
            found.append(ast.unparse(call))
    return list(dict.fromkeys(found))


def test_the_dispatcher_has_no_branch_of_its_own_on_a_backend() -> None:
    assert backend_branches(inspect.getsource(dispatch.Dispatcher)) == []


@pytest.mark.parametrize(
    "condition",
    [
        "a.concurrency is ActionConcurrency.PROCESS",
        "self.remote is not None and self.remote.takes(a)",
        "isinstance(a, SpawnsCommand)",
    ],
)
def test_the_structural_check_finds_a_branch_on_a_backend(condition: str) -> None:
    """The check above can fail: the old dispatcher's conditions trip it."""
    source = f"class D:\n    def f(self, a):\n        if {condition}:\n            pass\n"
    assert backend_branches(source) == [condition]


def test_the_check_picks_its_second_runs_from_its_own_list(tmp_path: Path) -> None:
    """``--check-reproducible`` asks its runners, first that takes wins: an in-process
    action runs again in place, a process action in a worker process."""
    g = declare(
        tmp_path / "out",
        {"thread": Node(), "process": Node(concurrency=ActionConcurrency.PROCESS)},
    )
    try:
        plan = g.executor.checked_plan(list(g.files.values()))
        check = ReproducibilityCheck(plan, g.executor.run_context, 1, lambda a: False)
        kinds = {
            name: type(first_taking(check.runners, a)).__name__ for name, a in g.actions.items()
        }
        # An action whose key holds the time zone and locale runs under the same ones:
        # the keyed one says nothing of another time zone; the other one does.
        keyed = ReproducibilityCheck(plan, g.executor.run_context, 1, lambda a: True)
        said: dict[str, list[str]] = {"keyed": [], "other": []}
        thread = g.actions["thread"]
        first_taking(keyed.runners, thread).run(thread, tmp_path, {}, said["keyed"].append)
        first_taking(check.runners, thread).run(thread, tmp_path, {}, said["other"].append)
    finally:
        g.executor.close()
    assert kinds == {"thread": "InPlace", "process": "ProcessInPlace"}
    assert said["keyed"] == [] and "with TZ=" in said["other"][0], said
    assert not any(r.sandboxed for r in check.runners if "InPlace" in type(r).__name__)
