"""kiln's layers, checked on its source (docs/architecture.md): the import-linter
contract in pyproject.toml (``lint-imports``, which ``scripts/test`` also runs)
holds, it is able to fail, and no kiln module imports itself back through others.
Every import counts: those inside functions and those under ``if TYPE_CHECKING:``
(a type is a dependency too)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(
    src: Path, config: Path = ROOT / "pyproject.toml"
) -> subprocess.CompletedProcess[str]:
    """``lint-imports`` with kiln's contracts on the package under ``src``."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
        timeout=300,
    )


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return found


def import_graph(package: str = "kiln") -> dict[str, set[str]]:
    graph = grimp.build_graph(package, exclude_type_checking_imports=False, cache_dir=None)
    return {m: set(graph.find_modules_directly_imported_by(m)) for m in graph.modules}


def test_the_layer_contract_holds() -> None:
    r = lint_imports(ROOT / "src")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Contracts: 1 kept, 0 broken." in r.stdout


def test_the_layer_contract_is_able_to_fail(tmp_path: Path) -> None:
    """A copy of kiln in which the graph model names the scheduler, under
    ``TYPE_CHECKING``: the contract is broken, naming the import."""
    shutil.copytree(
        ROOT / "src" / "kiln", tmp_path / "kiln", ignore=shutil.ignore_patterns("__pycache__")
    )
    nodes = tmp_path / "kiln" / "graph" / "nodes.py"
    nodes.write_text(
        nodes.read_text().replace(
            "from kiln.graph.definition_site import DefinitionSite\n",
            "from kiln.graph.definition_site import DefinitionSite\n"
            "from typing import TYPE_CHECKING\n"
            "if TYPE_CHECKING:\n    from kiln.engine.scheduler import Scheduler\n",
            1,
        )
    )
    r = lint_imports(tmp_path)
    assert r.returncode != 0
    assert "kiln.graph is not allowed to import kiln.engine" in r.stdout, r.stdout
    assert "kiln.graph.nodes -> kiln.engine.scheduler" in r.stdout


def test_no_import_cycle_among_kiln_modules() -> None:
    assert cycles(import_graph()) == []


def test_the_cycle_check_finds_a_cycle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_package_does_not_import_the_command_line() -> None:
    """``import kiln`` stays fast: the command line is imported on first use."""
    graph = import_graph()
    assert not {m for m in graph["kiln"] if m == "kiln.cli" or m.startswith("kiln.cli.")}
