"""kiln's layers, checked on its source (docs/architecture.md): the import-linter
contract in pyproject.toml (``lint-imports``, which ``scripts/test`` also runs)
holds, it is able to fail, and no kiln module imports itself back through others.
Every import counts: those inside functions and those under ``if TYPE_CHECKING:``
(a type is a dependency too)."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
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


def private_imports(src: Path) -> list[str]:
    """Imports of a private module or name (a segment with one leading underscore)
    from outside the package that holds it, as ``file:line: dotted.name``.

    A private module ``kiln.a._m`` (and all in it) belongs to ``kiln.a``; a private
    name ``_n`` of the module ``kiln.a.m`` belongs to ``kiln.a`` as well. Importers
    inside that package (its subpackages included) may use it; others may not. The
    lazy table of ``kiln/__init__.py`` counts too: any string constant that is a
    dotted ``kiln.`` name is read as an import of it."""
    found: list[str] = []
    for path in sorted(src.rglob("*.py")):
        importer = path.relative_to(src).with_suffix("").parts
        package = importer[:-1]
        for lineno, dotted in _imported_names(ast.parse(path.read_text(), str(path))):
            owner = _private_owner(src, dotted)
            if owner is not None and package[: len(owner)] != owner:
                found.append(f"{path.relative_to(src)}:{lineno}: {'.'.join(dotted)}")
    return found


def _imported_names(tree: ast.AST) -> Iterator[tuple[int, tuple[str, ...]]]:
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names:
                yield node.lineno, (*node.module.split("."), alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, tuple(alias.name.split("."))
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and re.fullmatch(r"kiln(\.\w+)+", node.value)
        ):
            yield node.lineno, tuple(node.value.split("."))


def _private_owner(src: Path, dotted: tuple[str, ...]) -> tuple[str, ...] | None:
    """The package a private part of ``dotted`` belongs to, or None when all of
    ``dotted`` is public (or it is not kiln's)."""
    if dotted[0] != "kiln":
        return None
    for i, part in enumerate(dotted):
        if part.startswith("_") and not part.startswith("__"):
            holder = dotted[:i]
            is_package = (src.joinpath(*holder) / "__init__.py").is_file()
            return holder if is_package else holder[:-1]
    return None


def test_no_private_module_or_name_is_imported_across_packages() -> None:
    assert private_imports(ROOT / "src") == []


def test_the_private_import_check_is_able_to_fail(tmp_path: Path) -> None:
    """Planted in a copy of kiln: a private module of ``actions`` imported by the
    command line, a private name of ``cache.index`` imported by the engine, and a
    private module named in a lazy table's string. Each is found; an import of a
    private name from inside its own package is not."""
    shutil.copytree(
        ROOT / "src" / "kiln", tmp_path / "kiln", ignore=shutil.ignore_patterns("__pycache__")
    )
    (tmp_path / "kiln" / "cli" / "planted.py").write_text(
        "from kiln.actions._http import x\n"
        "from kiln.cache.index import _y\n"
        'LAZY = {"Z": "kiln.actions._reference"}\n'
    )
    (tmp_path / "kiln" / "cache" / "planted.py").write_text("from kiln.cache.index import _y\n")
    assert private_imports(tmp_path) == [
        "kiln/cli/planted.py:1: kiln.actions._http.x",
        "kiln/cli/planted.py:2: kiln.cache.index._y",
        "kiln/cli/planted.py:3: kiln.actions._reference",
    ]
