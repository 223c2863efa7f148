"""The engine's front door: a build is asked by one frozen ``BuildRequest``, made
once by the command line, and the command line never configures the executor by
assigning its attributes (``kiln.engine.request``)."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from kiln.base.action_env import ActionEnvironment
from kiln.devices.identity import local_set
from kiln.engine.request import BuildRequest, SchedulerOptions
from kiln.executor import Executor

CLI = Path(__file__).resolve().parent.parent / "src" / "kiln" / "cli"

# Methods that change the container they are called on.
_MUTATORS = {"append", "extend", "insert", "add", "update", "setdefault", "pop", "clear"}


def _on_executor(node: ast.expr) -> bool:
    """Whether ``node`` is an attribute reached from an executor: ``executor.x``,
    ``inv.executor.x``, ``executor.run_context.x``..."""
    if not isinstance(node, ast.Attribute):
        return False
    value = node.value
    while isinstance(value, ast.Attribute):
        if value.attr == "executor":
            return True
        value = value.value
    return isinstance(value, ast.Name) and value.id == "executor"


def _is_executor(node: ast.expr) -> bool:
    return _on_executor(node) or (isinstance(node, ast.Name) and node.id == "executor")


def _sets_executor(node: ast.AST) -> bool:
    """Whether statement or call ``node`` sets an attribute reached from an executor."""
    targets: list[ast.expr] = []
    if isinstance(node, ast.Assign):
        targets = node.targets
    elif isinstance(node, ast.AugAssign | ast.AnnAssign | ast.For):
        targets = [node.target]
    elif isinstance(node, ast.withitem) and node.optional_vars is not None:
        targets = [node.optional_vars]
    elif isinstance(node, ast.Call):
        func = node.func
        if isinstance(func, ast.Name) and func.id == "setattr" and node.args:
            return _is_executor(node.args[0])
        return (
            isinstance(func, ast.Attribute) and func.attr in _MUTATORS and _on_executor(func.value)
        )
    return any(
        isinstance(e, ast.Attribute) and _on_executor(e) for t in targets for e in ast.walk(t)
    )


def executor_writes(source: str) -> list[int]:
    """The lines of ``source`` that set an attribute reached from an executor: by
    assignment (plain, augmented, annotated, ``with ... as``, ``for``), ``setattr``,
    or a call that changes a container it holds (``executor.readers.append(...)``)."""
    tree = ast.parse(source)
    lines = {getattr(n, "lineno", None) for n in ast.walk(tree) if _sets_executor(n)}
    # A ``with`` item has no line of its own: its ``with`` statement's.
    lines |= {
        w.lineno
        for w in ast.walk(tree)
        if isinstance(w, ast.With) and any(_sets_executor(i) for i in w.items)
    }
    return sorted(line for line in lines if line is not None)


def test_the_command_line_never_sets_the_executors_attributes() -> None:
    hits = {
        str(path.relative_to(CLI)): lines
        for path in sorted(CLI.glob("*.py"))
        if (lines := executor_writes(path.read_text()))
    }
    assert hits == {}


@pytest.mark.parametrize(
    "line",
    [
        "executor.strict_keys = True",
        "executor.run_context.environment = env",
        "inv.executor.cache = cache",
        "executor.verbose_level += 1",
        "executor.read_only: bool = True",
        "with remote as executor.remote: pass",
        "for executor.x in y: pass",
        "setattr(executor, 'cache', None)",
        "executor.event_readers.append(log)",
        "inv.executor.run_context.devices.update(x)",
    ],
)
def test_the_check_finds_each_way_of_setting_them(line: str) -> None:
    assert executor_writes(line) == [1]


def test_the_check_lets_reading_and_calling_be() -> None:
    source = "x = executor.cache\nexecutor.run(t, request)\ny = [executor.all]\nlog.append(1)\n"
    assert executor_writes(source) == []


def test_a_request_is_frozen() -> None:
    request = BuildRequest(options=SchedulerOptions(jobs=2))
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.strict_keys = True  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        request.options.dry_run = True  # type: ignore[misc]
    devices = local_set()
    connected = request.connected(None, devices, ())
    assert connected.devices is devices and connected.options is request.options
    assert request.devices is None  # a new value: the request made once is unchanged


def test_the_executor_is_made_with_its_request(tmp_path: Path) -> None:
    environment = ActionEnvironment({"A": "1"})
    request = BuildRequest(environment=environment, strict_keys=True, read_only=True, verbose=2)
    executor = Executor(tmp_path / "out", request=request, source_root=str(tmp_path))
    assert executor.run_context.environment is environment
    assert executor.strict_keys and executor.read_only and executor.verbose_level == 2
    assert executor.source_root == str(tmp_path)
    again = executor.request(request.options)
    assert again == dataclasses.replace(request, devices=executor.run_context.devices)


def test_a_read_only_request_writes_nothing_once_the_state_is_open(tmp_path: Path) -> None:
    """A request that asks for no writes is a dry run whatever the executor did
    before: once a first build had opened the state, ``read_only`` was ignored."""
    from test_scheduler import Node, declare

    g = declare(tmp_path / "out", {"a": Node()})
    try:
        assert g.run().ok
        made = Path(g.files["a"].fs_str)
        made.unlink()
        g.executor.run([g.files["a"]], BuildRequest(read_only=True))
        assert not made.exists()
        assert g.rec.started() == ["a"], g.rec.events
    finally:
        g.executor.close()
