"""A build module's functions, run in a PROCESS worker, find their module by name
as they do in kiln's own process (``kiln.execution.process.byvalue``): torch 2.13's dynamo
imports the module of every function it traces, and a build module reaches the
worker pickled by value, under a private name that imports nothing there. And the
iree.build shim's look at a library's globals is silent."""

from __future__ import annotations

import json
from pathlib import Path

BUILD = """
import functools
import importlib
import json
import os

from iree.build import *
from iree.build.executor import ActionConcurrency, BuildAction, BuildContext

SCALE = 7


class Model:
    def forward(self, x):
        return x * SCALE


def _run(path):
    name = Model.forward.__globals__["__name__"]
    module = importlib.import_module(name)  # what torch 2.13's dynamo does
    found = {
        "pid": os.getpid(),
        "same_name": module.__name__ == name,
        "scale": module.SCALE,
        "model_is_the_class": module.Model is Model,
    }
    for other in (name[:-1] + "x", "kiln_build_000000000000_nothing"):
        try:
            importlib.import_module(other)
            found[other] = "imported"
        except ModuleNotFoundError:
            found[other] = "not found"
    with open(path, "w") as f:
        json.dump(found, f)


class Probe(BuildAction):
    def __init__(self, path, **kwargs):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kwargs)
        self.path = path

    def _remotable_thunk(self):
        return functools.partial(_run, self.path)


@entrypoint
def probe():
    ctx = BuildContext.current()
    out = ctx.allocate_file("probe.json")
    out.deps.add(Probe(str(out.get_fs_path()), desc="Probing", executor=ctx.executor))
    return out
"""


def test_a_worker_imports_the_build_module_its_functions_came_from(kiln, tmp_path: Path) -> None:
    (tmp_path / "probe_build.py").write_text(BUILD)
    result = kiln("build", "probe_build.py", "--no-cache")
    assert result.returncode == 0, result.stdout + result.stderr
    found = json.loads((tmp_path / "kiln-out" / "genfiles" / "probe" / "probe.json").read_text())
    assert found.pop("same_name") is True
    assert found.pop("scale") == 7
    assert found.pop("model_is_the_class") is True
    assert found.pop("pid") > 0
    # Only names of build modules whose functions the worker holds import.
    assert sorted(found.values()) == ["not found", "not found"], found


NOISY = """
import warnings


class _Deprecated:
    @property
    def __class__(self):  # as torch 2.13's torch.distributed.reduce_op warns
        warnings.warn("noisy.old is deprecated", FutureWarning, stacklevel=2)
        return _Deprecated


old = _Deprecated()
"""


def test_kilns_look_at_a_librarys_globals_prints_no_warning(tmp_path: Path) -> None:
    # The iree.build shim looks over imported modules' globals (torch 2.13's printed
    # a FutureWarning under an iree-turbine build); a deprecated global that warns
    # when its type is asked is not the user's doing.
    import types
    import warnings

    from kiln.base.iree_shim import _holders

    noisy = types.ModuleType("noisy")
    exec(NOISY, noisy.__dict__)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        assert _holders({"noisy": noisy}, lambda home: home == "kiln", set()) == []
    assert [str(w.message) for w in seen] == []
