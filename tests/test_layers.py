"""kiln's layers, checked on its source: the core never imports the built-in
actions or the command line, the actions never import the command line, and no
kiln module imports itself back through others (an import cycle).

Layers, lowest first: the core (``kiln.*`` outside the packages below),
``kiln.actions``, ``kiln.cli``; the facade ``kiln`` (``__init__``), ``kiln.__main__``
and ``kiln.iree_build`` (iree.build's modules as kiln provides them) sit above
them all. Every import counts, those inside
functions included, except those under ``if TYPE_CHECKING:``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parent.parent / "src"
FACADE = {"kiln", "kiln.__main__"}


def _modules(src: Path = SRC) -> dict[str, tuple[Path, bool]]:
    """Module name -> (file, is a package's ``__init__``)."""
    out = {}
    for path in sorted((src / "kiln").rglob("*.py")):
        parts = list(path.relative_to(src).with_suffix("").parts)
        package = parts[-1] == "__init__"
        out[".".join(parts[:-1] if package else parts)] = (path, package)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return "TYPE_CHECKING" in ast.unparse(test)


def _imports_of(name: str, path: Path, package: bool, known: set[str]) -> set[str]:
    """The kiln modules ``name`` imports (``from pkg import mod`` names ``pkg.mod``)."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.orelse:
                    visit_node(stmt)
                continue
            visit_node(child)

    def visit_node(node: ast.AST) -> None:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = name.split(".") if package else name.split(".")[:-1]
                pkg = pkg[: len(pkg) - (node.level - 1)]
                base = ".".join([*pkg, base] if base else pkg)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.add(sub if sub in known else base)
        visit(node)

    visit(ast.parse(path.read_text(), str(path)))
    return {m for m in found if m in known and m != name}


def import_graph(src: Path = SRC) -> dict[str, set[str]]:
    modules = _modules(src)
    known = set(modules)
    return {n: _imports_of(n, p, pkg, known) for n, (p, pkg) in modules.items()}


def layer(module: str) -> int:
    """0: core, 1: built-in actions, 2: command line, 3: the facade."""
    if module in FACADE or module == "kiln.iree_build" or module.startswith("kiln.iree_build."):
        return 3
    if module == "kiln.cli" or module.startswith("kiln.cli."):
        return 2
    if module == "kiln.actions" or module.startswith("kiln.actions."):
        return 1
    return 0


def layer_violations(graph: dict[str, set[str]]) -> list[str]:
    names = ("core", "actions", "cli", "facade")
    return sorted(
        f"{m} ({names[layer(m)]}) imports {t} ({names[layer(t)]})"
        for m, targets in graph.items()
        for t in targets
        if layer(t) > layer(m)
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


def test_no_lower_layer_imports_a_higher_one() -> None:
    assert layer_violations(import_graph()) == []


def test_no_import_cycle_among_kiln_modules() -> None:
    assert cycles(import_graph()) == []


def test_the_package_does_not_import_the_command_line() -> None:
    graph = import_graph()
    assert not {m for m in graph["kiln"] if layer(m) == 2}


@pytest.fixture()
def tangled(tmp_path: Path) -> Path:
    """A small package with a backwards import and a cycle hidden in a function."""
    pkg = tmp_path / "kiln"
    (pkg / "cli").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "cli" / "__init__.py").write_text("")
    (pkg / "cli" / "main.py").write_text("from kiln import graph\n")
    (pkg / "graph.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from kiln.executor import Executor\n"
        "def f():\n    from kiln.cli.main import x\n"
    )
    (pkg / "executor.py").write_text("from .graph import f\n")
    (pkg / "plan.py").write_text("import kiln.executor\n")
    return tmp_path


def test_the_checks_find_what_they_look_for(tangled: Path) -> None:
    graph = import_graph(tangled)
    assert graph["kiln.graph"] == {"kiln.cli.main"}  # TYPE_CHECKING ignored
    assert graph["kiln.executor"] == {"kiln.graph"}  # relative import resolved
    assert layer_violations(graph) == ["kiln.graph (core) imports kiln.cli.main (cli)"]
    assert cycles(graph) == [["kiln.cli.main", "kiln.graph"]]
