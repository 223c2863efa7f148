"""A build module may have any file name that is a module name (``random.py``,
``json.py``, ``typing.py``, ``kiln.py``, a dependency's ``cloudpickle.py``...): it is
loaded under a private name (``kiln.base.modnames``), and no import of its file name,
kiln's, the standard library's or a library's, in kiln's process or in a worker,
ever runs it again. Its sibling modules still import. Real subprocess builds,
started from another directory (``python -m kiln`` puts its own working directory
first on the path, before kiln runs)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

MODULE = """
import functools
import importlib
import json as _json
import sys

from kiln import *
from iree.build.executor import ActionConcurrency, BuildAction, BuildContext
import helper_sib

ME = __file__


def where(name):
    try:
        return importlib.import_module(name).__file__ or "builtin"
    except ImportError:
        return "missing"


def _probe(path, name, names):
    # In a worker: what the names import there, and the sibling, by this module.
    found = {n: where(n) for n in names}
    found["sibling"] = helper_sib.VALUE
    with open(path, "w") as f:
        _json.dump(found, f)


class Probe(BuildAction):
    def __init__(self, path, name, names, **kwargs):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kwargs)
        self.args = (path, name, names)

    def _remotable_thunk(self):
        return functools.partial(_probe, *self.args)


NAMES = [NAME, "random", "json", "logging", "typing", "pickle", "cloudpickle"]


@entrypoint
def probe():
    ctx = BuildContext.current()
    here = ctx.allocate_file("here.json")  # in kiln's process, at analysis
    here_found = {n: where(n) for n in NAMES}
    here_found["sibling"] = helper_sib.VALUE
    text = _json.dumps(here_found).replace("'", "").replace("{", "{{").replace("}", "}}")
    command = ["sh", "-c", f"echo '{text}' > {{out}}"]
    written = run_command(name="here-written.json", command=command)
    out = ctx.allocate_file("worker.json")
    out.deps.add(Probe(str(out.get_fs_path()), NAME, NAMES, desc="Probing", executor=ctx.executor))
    return [written, out]
"""

NAMES = ["random", "json", "logging", "typing", "kiln", "build", "cloudpickle", "rich", "numpy"]


@pytest.mark.parametrize("name", NAMES)
def test_a_build_module_may_take_any_module_name(tmp_path: Path, name: str) -> None:
    project = tmp_path / "project"
    project.mkdir()
    module = project / f"{name}.py"
    module.write_text(f"NAME = {name!r}\n" + MODULE)
    (project / "helper_sib.py").write_text('VALUE = "from the sibling"\n')
    r = subprocess.run(
        [sys.executable, "-m", "kiln", "build", str(module), "--no-cache"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    for found_in in ("here-written.json", "worker.json"):
        found = json.loads((tmp_path / "kiln-out" / "genfiles" / "probe" / found_in).read_text())
        assert found.pop("sibling") == "from the sibling", found_in
        for imported, where in found.items():
            # Never the build module, nor anything else from its directory.
            assert not where.startswith(str(project)), (found_in, imported, where)
        for stdlib in ("random", "json", "logging", "typing", "pickle"):
            assert found[stdlib] not in ("missing",), (found_in, stdlib)
        assert found["cloudpickle"] != "missing"
        if name == "kiln":
            assert found["kiln"].endswith("__init__.py"), found


def test_a_build_module_named_as_the_library_it_uses_gets_the_library(
    tmp_path: Path, kiln_in_process
) -> None:
    """``colorsys.py`` that imports ``colorsys`` gets Python's, run twice in this
    process from two directories; afterwards the name is Python's module again."""
    for where in ("a", "b"):
        (tmp_path / where).mkdir()
        (tmp_path / where / "colorsys.py").write_text(
            "import colorsys\n"
            "from kiln import *\n"
            "RGB = colorsys.hls_to_rgb(0.0, 0.5, 1.0)\n"
            "@entrypoint\n"
            "def ep():\n"
            f"    return run_command(name='{where}.txt',\n"
            "                       command=['sh', '-c', f'echo \\'{RGB}\\' > {{out}}'])\n"
        )
        r = kiln_in_process(
            "build", f"{where}/colorsys.py", "--no-cache", "--output-dir", f"o{where}"
        )
        assert r.returncode == 0, r.stderr
        built = tmp_path / f"o{where}" / "genfiles" / "ep" / f"{where}.txt"
        assert built.read_text() == "(1.0, 0.0, 0.0)\n"
    assert not any(type(f).__name__ == "_HiddenBuildModules" for f in sys.meta_path)
    module = importlib.import_module("colorsys")
    assert not (module.__file__ or "").startswith(str(tmp_path))
