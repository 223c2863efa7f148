"""What an action reaches only while it runs (issue: complete keys), through the real
command line on real files: a project module it imports at run time
(``importlib.import_module``, ``__import__``, an ``import`` inside the function),
in a worker process or in kiln's own, and a compiled extension module of the
project (a ``.so`` built here with gcc), rebuilt with another value. Each is
recorded with the action's result and checked on the next build (``kiln
explain`` names the file), and such a result never comes from or goes to the
shared cache.
"""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sysconfig
from collections.abc import Callable
from pathlib import Path
from typing import Any

import needs
import pytest

ACTIONS = """
import functools
import importlib
import os
from kiln import entrypoint
from kiln.executor import ActionConcurrency, BuildAction, BuildContext

LOG = os.path.abspath("ran.log")


def by_import_module(out):
    return importlib.import_module("rt_helper").VALUE


def by_dunder_import(out):
    return __import__("rt_helper").VALUE


def by_statement(out):
    import rt_helper

    return rt_helper.VALUE


def by_extension(out):
    import rt_ext

    return rt_ext.value()


WAYS = {
    "by_import_module": by_import_module,
    "by_dunder_import": by_dunder_import,
    "by_statement": by_statement,
    "by_extension": by_extension,
}


def run(how, name, out):
    with open(LOG, "a") as log:
        log.write(name + "\\n")
    value = WAYS[how](out)
    with open(out, "w") as f:
        f.write(str(value))


class RunTime(BuildAction):
    def __init__(self, how, output, **kwargs):
        super().__init__(**kwargs)
        self.how = how
        self.output = output
        output.deps.add(self)

    def _remotable_thunk(self):  # a worker runs in the output directory
        return functools.partial(run, self.how, self.output.path, self.output.action_path)

    def _invoke(self):
        if self.concurrency is ActionConcurrency.PROCESS:
            return super()._invoke()
        run(self.how, self.output.path, str(self.output.get_fs_path()))


@entrypoint
def ep():
    ctx = BuildContext.current()
    outs = []
    for how, concurrency in WHAT:
        out = ctx.allocate_file(f"{how}-{concurrency}.txt")
        RunTime(how, out, desc=out.path, executor=ctx.executor,
                concurrency=getattr(ActionConcurrency, concurrency))
        outs.append(out)
    return outs
"""

HOWS = ("by_import_module", "by_dunder_import", "by_statement")


def _write_build(root: Path, what: list[tuple[str, str]]) -> None:
    (root / "build.py").write_text(ACTIONS.replace("WHAT", repr(what)))


def _ran(root: Path) -> list[str]:
    log = root / "ran.log"
    found = sorted(log.read_text().split()) if log.exists() else []
    log.write_text("")
    return found


def _build(kiln: Callable[..., Any], *args: str) -> Any:
    result = kiln("build", "build.py", *args)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def _edit(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` with an mtime seconds before the one it had, so that
    not even a bytecode cache written by the test's own Python can hide the edit."""
    before = path.stat().st_mtime_ns
    path.write_text(text)
    os.utime(path, ns=(before - 10_000_000_000, before - 10_000_000_000))


@pytest.mark.parametrize("concurrency", ["PROCESS", "THREAD", "NONE"])
def test_a_module_imported_at_run_time_is_checked_on_the_next_build(
    tmp_path: Path, kiln: Callable[..., Any], concurrency: str
) -> None:
    (tmp_path / "rt_helper.py").write_text("VALUE = 1\n")
    _write_build(tmp_path, [(how, concurrency) for how in HOWS])
    out = tmp_path / "kiln-out/genfiles/ep"
    _build(kiln)
    assert len(_ran(tmp_path)) == 3
    assert (out / f"by_statement-{concurrency}.txt").read_text() == "1"
    _build(kiln)
    assert _ran(tmp_path) == []  # recorded, and unchanged: a no-op build

    _edit(tmp_path / "rt_helper.py", "VALUE = 2\n")
    explained = kiln("explain", "build.py")
    assert "rt_helper.py, which it imported while it ran, changed" in explained.stdout, (
        explained.stdout + explained.stderr
    )
    _build(kiln)
    # Every action that imported it reruns, however many imported it in one process.
    assert len(_ran(tmp_path)) == 3
    for how in HOWS:
        assert (out / f"{how}-{concurrency}.txt").read_text() == "2"
    _build(kiln)
    assert _ran(tmp_path) == []


@pytest.mark.parametrize("concurrency", ["PROCESS", "THREAD"])
def test_a_failure_from_a_module_imported_at_run_time_is_retried_once_it_is_fixed(
    tmp_path: Path, kiln: Callable[..., Any], concurrency: str
) -> None:
    """A failure is remembered with its key (not run again while nothing changed),
    and with what the failed run imported: fixing that module runs it again."""
    (tmp_path / "rt_helper.py").write_text("VALUE = int('broken')\n")
    _write_build(tmp_path, [("by_import_module", concurrency)])
    result = kiln("build", "build.py")
    assert result.returncode == 1 and "broken" in result.stderr, result.stderr
    result = kiln("build", "build.py")
    assert result.returncode == 1
    assert _ran(tmp_path) == [f"ep/by_import_module-{concurrency}.txt"]  # remembered
    _edit(tmp_path / "rt_helper.py", "VALUE = 7\n")
    explained = kiln("explain", "build.py")
    assert "it failed in an earlier build; since then rt_helper.py" in explained.stdout, (
        explained.stdout
    )
    _build(kiln)
    assert _ran(tmp_path) == [f"ep/by_import_module-{concurrency}.txt"]
    out = tmp_path / f"kiln-out/genfiles/ep/by_import_module-{concurrency}.txt"
    assert out.read_text() == "7"


def test_a_result_that_imported_a_module_at_run_time_is_not_shared(
    tmp_path: Path, kiln: Callable[..., Any]
) -> None:
    """Another output directory (another checkout, another machine) with another
    version of the module never gets this one's result from the cache."""
    (tmp_path / "rt_helper.py").write_text("VALUE = 1\n")
    _write_build(tmp_path, [("by_import_module", "PROCESS"), ("by_statement", "THREAD")])
    _build(kiln)
    _edit(tmp_path / "rt_helper.py", "VALUE = 3\n")
    _build(kiln, "--output-dir", "other")
    other = tmp_path / "other/genfiles/ep"
    assert (other / "by_import_module-PROCESS.txt").read_text() == "3"
    assert (other / "by_statement-THREAD.txt").read_text() == "3"
    assert len(_ran(tmp_path)) == 4


def test_a_module_edited_while_the_action_ran_reruns_it(
    tmp_path: Path, kiln: Callable[..., Any]
) -> None:
    """The digest is taken after the run: a module changed after the action started
    counts as changed (its result may be from the old version)."""
    (tmp_path / "rt_helper.py").write_text("VALUE = 1\n")
    (tmp_path / "build.py").write_text(
        ACTIONS.replace("WHAT", repr([("by_import_module", "PROCESS")])).replace(
            "    value = WAYS[how](out)\n",
            "    value = WAYS[how](out)\n"
            "    with open(LOG.replace('ran.log', 'rt_helper.py'), 'a') as f:\n"
            "        f.write('# touched\\n')\n",
        )
    )
    _build(kiln)
    assert _ran(tmp_path) == ["ep/by_import_module-PROCESS.txt"]
    explained = kiln("explain", "build.py")
    assert "rt_helper.py, which it imported while it ran, changed while it ran" in (
        explained.stdout
    ), explained.stdout


def test_a_module_replaced_by_a_fifo_or_a_link_is_checked_without_hanging(
    tmp_path: Path, kiln: Callable[..., Any]
) -> None:
    (tmp_path / "rt_helper.py").write_text("VALUE = 1\n")
    (tmp_path / "elsewhere.py").write_text("VALUE = 5\n")
    _write_build(tmp_path, [("by_statement", "PROCESS")])
    _build(kiln)
    _ran(tmp_path)
    (tmp_path / "rt_helper.py").unlink()
    os.mkfifo(tmp_path / "rt_helper.py")
    explained = kiln("explain", "build.py", timeout=60)
    assert "rt_helper.py, which it imported while it ran," in explained.stdout, explained.stdout
    assert "not a regular file" in explained.stdout, explained.stdout
    (tmp_path / "rt_helper.py").unlink()
    (tmp_path / "rt_helper.py").symlink_to(tmp_path / "elsewhere.py")
    _build(kiln)
    assert _ran(tmp_path) == ["ep/by_statement-PROCESS.txt"]
    assert (tmp_path / "kiln-out/genfiles/ep/by_statement-PROCESS.txt").read_text() == "5"


def test_a_library_imported_at_run_time_is_not_recorded(
    tmp_path: Path, kiln: Callable[..., Any]
) -> None:
    """Installed and standard modules are keyed by their versions, not recorded."""
    (tmp_path / "rt_helper.py").write_text("import json, email.mime.text\nVALUE = 1\n")
    _write_build(tmp_path, [("by_statement", "PROCESS"), ("by_statement", "THREAD")])
    _build(kiln)
    with sqlite3.connect(tmp_path / "kiln-out/.kiln/state.db") as db:
        rows = [json.loads(r[0]) for r in db.execute("SELECT inputs FROM actions")]
    assert len(rows) == 2
    for inputs in rows:
        reached = [k for k in inputs if k.startswith("!")]
        assert reached == [f"!imported:{tmp_path / 'rt_helper.py'}"], inputs


EXT = """
#define PY_SSIZE_T_CLEAN
#include <Python.h>

static PyObject *value(PyObject *self, PyObject *args) { return PyLong_FromLong(VALUE); }
static PyMethodDef methods[] = {{"value", value, METH_NOARGS, NULL}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "rt_ext", NULL, -1, methods};
PyMODINIT_FUNC PyInit_rt_ext(void) { return PyModule_Create(&module); }
"""


def _compile_extension(root: Path, value: int) -> None:
    """Build ``rt_ext`` (``value()`` returns ``value``) with gcc and Python's headers,
    into a new file renamed over the old, as a build tool does."""
    gcc = needs.program("gcc", "cc")
    source = root / "rt_ext.c"
    source.write_text(EXT.replace("VALUE", str(value)))
    target = root / f"rt_ext{sysconfig.get_config_var('EXT_SUFFIX')}"
    tmp = root / "rt_ext.tmp.so"
    include = sysconfig.get_paths()["include"]
    subprocess.run(
        [gcc, "-shared", "-fPIC", f"-I{include}", str(source), "-o", str(tmp)], check=True
    )
    os.replace(tmp, target)


STATIC_EXT = """
import os
import rt_ext
from kiln import entrypoint
from kiln.executor import BuildAction, BuildContext

LOG = os.path.abspath("ran.log")


class Static(BuildAction):
    def __init__(self, output, **kwargs):
        super().__init__(**kwargs)
        self.output = output
        output.deps.add(self)

    def _invoke(self):
        with open(LOG, "a") as log:
            log.write("static\\n")
        self.output.get_fs_path().write_text(str(rt_ext.value()))


@entrypoint
def ext():
    ctx = BuildContext.current()
    out = ctx.allocate_file("static.txt")
    Static(out, desc="static", executor=ctx.executor)
    return out
"""


def test_a_rebuilt_extension_module_imported_at_run_time_reruns_its_actions(
    tmp_path: Path, kiln: Callable[..., Any]
) -> None:
    """In a worker or in kiln's process: its bytes count, not just its name."""
    _compile_extension(tmp_path, 1)
    (tmp_path / "rt_helper.py").write_text("VALUE = 0\n")
    _write_build(tmp_path, [("by_extension", "PROCESS"), ("by_extension", "THREAD")])
    out = tmp_path / "kiln-out/genfiles/ep"
    _build(kiln)
    _build(kiln)  # no-op
    assert _ran(tmp_path) == ["ep/by_extension-PROCESS.txt", "ep/by_extension-THREAD.txt"]
    assert (out / "by_extension-PROCESS.txt").read_text() == "1"

    _compile_extension(tmp_path, 2)
    explained = kiln("explain", "build.py")
    assert "which it imported while it ran, changed" in explained.stdout, explained.stdout
    assert "rt_ext" in explained.stdout
    _build(kiln)
    assert _ran(tmp_path) == ["ep/by_extension-PROCESS.txt", "ep/by_extension-THREAD.txt"]
    for name in ("by_extension-PROCESS.txt", "by_extension-THREAD.txt"):
        assert (out / name).read_text() == "2"


def test_a_rebuilt_extension_module_the_build_module_imports_reruns_its_actions(
    tmp_path: Path, kiln: Callable[..., Any]
) -> None:
    """Named by the action's code (``kiln.planning.code_key``): keyed by the extension's bytes,
    and so never served from the cache with another build's extension."""
    _compile_extension(tmp_path, 1)
    (tmp_path / "static.py").write_text(STATIC_EXT)
    assert kiln("build", "static.py").returncode == 0
    assert kiln("build", "static.py").returncode == 0
    assert _ran(tmp_path) == ["static"]
    _compile_extension(tmp_path, 2)
    explained = kiln("explain", "static.py")
    assert "the action's code changed" in explained.stdout, explained.stdout
    assert kiln("build", "static.py").returncode == 0
    assert _ran(tmp_path) == ["static"]
    assert (tmp_path / "kiln-out/genfiles/ext/static.txt").read_text() == "2"
    _compile_extension(tmp_path, 1)
    assert kiln("build", "static.py", "--output-dir", "other").returncode == 0
    assert (tmp_path / "other/genfiles/ext/static.txt").read_text() == "1"


@pytest.mark.parametrize("concurrency", ["THREAD", "PROCESS"])
def test_a_check_never_stores_a_result_that_imported_a_module_over_a_withdrawal(
    tmp_path: Path, kiln: Callable[..., Any], concurrency: str
) -> None:
    """An action that imported a project module at run time, up to date here, whose
    key a check elsewhere withdrew: this directory's check finds it reproduces,
    and still does not put it into the cache (its key does not cover the module),
    so another directory with another version of the module runs it."""
    (tmp_path / "rt_helper.py").write_text("VALUE = 1\n")
    noise = tmp_path / "noise"
    (tmp_path / "build.py").write_text(
        ACTIONS.replace("WHAT", repr([("by_statement", concurrency)])).replace(
            "    value = WAYS[how](out)\n",
            "    value = WAYS[how](out)\n"
            f"    if os.path.exists({str(noise)!r}):\n"
            "        value = f'{value} {os.urandom(8).hex()}'\n",
        )
    )
    _build(kiln)
    noise.write_text("")  # the same key, not reproducible while it exists
    withdrawn = kiln("build", "build.py", "--output-dir", "noisy", "--check-reproducible")
    assert withdrawn.returncode == 1 and "1 not reproducible" in withdrawn.stderr
    noise.unlink()
    _ran(tmp_path)
    checked = _build(kiln, "--check-reproducible")  # up to date here, and reproduced
    assert "0 built, 1 up to date" in checked.stderr, checked.stderr
    assert _ran(tmp_path) == [f"ep/by_statement-{concurrency}.txt"]  # the check's second run

    _edit(tmp_path / "rt_helper.py", "VALUE = 2\n")
    _build(kiln, "--output-dir", "other")
    assert _ran(tmp_path) == [f"ep/by_statement-{concurrency}.txt"]
    assert (tmp_path / f"other/genfiles/ep/by_statement-{concurrency}.txt").read_text() == "2"


@pytest.mark.parametrize("executor", [None, "dask-local:2"])
def test_no_bytecode_is_written_into_the_source_tree(
    tmp_path: Path, kiln: Callable[..., Any], executor: str | None
) -> None:
    """With bytecode allowed (as by default), neither what the build module imports
    as it loads nor what its actions import while they run (in kiln's process, in
    a worker, on a local Dask worker) leaves a ``__pycache__`` beside the sources."""
    if executor is not None:
        from dask_cluster import require_dask

        require_dask()
    (tmp_path / "rt_helper.py").write_text("VALUE = 4\n")
    (tmp_path / "sibling.py").write_text("NAME = 'sibling'\n")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg/__init__.py").write_text("")
    (tmp_path / "pkg/deep.py").write_text("DEEP = 1\n")
    what = [(how, c) for how in HOWS for c in ("PROCESS", "THREAD", "NONE")]
    _write_build(tmp_path, what)
    build = tmp_path / "build.py"
    build.write_text("import sibling\nimport pkg.deep\n" + build.read_text())
    args = ["--executor", executor] if executor else []
    allowed = {"PYTHONDONTWRITEBYTECODE": ""}  # bytecode allowed, as by default
    r = kiln("build", "build.py", *args, env=allowed)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "kiln-out/genfiles/ep/by_statement-THREAD.txt").read_text() == "4"
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("__pycache__"))
    assert left == [], left
