"""Where a PROCESS action's worker runs (``kiln.planning.sandbox.runs_in_output_dir``).

An action of iree.build's kind (a library's ``_remotable_thunk``, given absolute
paths by ``get_fs_path()``) runs where iree.build's worker processes run: in the
directory the build was started in, so that a relative path of its own (an export
writing ``model.mlir``, which the module then reads by ``os.path.abspath``) lands
where upstream puts it, never in kiln's output directory. An action that names its
files relative to where it runs (kiln's own, a ``RemotableThunk``, one that sets
``relative_paths``) runs in the output directory. Every worker starts there afresh,
whatever an earlier action did to its own.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import needs
import pytest

pytestmark = pytest.mark.in_process

Kiln = Callable[..., Any]

# An action library shaped as sharktank's ``export_model`` and turbine's generator
# actions are: the worker makes the program from plain values and writes it where
# they say, relative to its working directory; the module allocates that path
# made absolute in its own process.
LIBRARY = '''\
import functools
import os
from pathlib import Path

from iree.build.executor import ActionConcurrency, BuildAction, BuildContext


def _export(spec):
    out = Path(spec["mlir_path"])
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(spec["program"])
    os.chdir("/")  # what a worker does to itself stays with it


class Export(BuildAction):
    def __init__(self, spec, **kwargs):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kwargs)
        self.spec = spec

    def _remotable_thunk(self):
        return functools.partial(_export, self.spec)


def export_model(spec):
    context = BuildContext.current()
    action = Export(spec, desc=f"Export {spec['mlir_path']}", executor=context.executor)
    out = context.allocate_file(str(Path(spec["mlir_path"]).absolute()))
    out.deps.add(action)
    return out


def _where(path):
    Path(path).write_text(os.getcwd())


class Where(BuildAction):
    """Writes the directory its worker runs in to its output."""

    def __init__(self, out, concurrency=ActionConcurrency.PROCESS, **kwargs):
        super().__init__(concurrency=concurrency, **kwargs)
        self.out = out
        out.deps.add(self)

    def _remotable_thunk(self):
        return functools.partial(_where, str(self.out.get_fs_path()))

    def _invoke(self):  # as a THREAD action: in kiln's own process
        _where(str(self.out.get_fs_path()))


class RelativeWhere(Where):
    relative_paths = True


class SandboxedWhere(Where):
    def sandbox_thunk(self, path):
        return functools.partial(_where, path(self.out))


class Read(BuildAction):
    def __init__(self, sources, out, **kwargs):
        super().__init__(**kwargs)
        self.sources = sources
        self.out = out
        self.deps.update(sources)
        out.deps.add(self)

    def _invoke(self):
        text = "".join(f.get_fs_path().read_text() for f in self.sources)
        self.out.get_fs_path().write_text(text)


def read(name, sources):
    context = BuildContext.current()
    out = context.allocate_file(name)
    Read(context.files(sources), out, desc=f"Reading {name}", executor=context.executor)
    return out


def where(name, kind=Where, concurrency=ActionConcurrency.PROCESS):
    context = BuildContext.current()
    out = context.allocate_file(name)
    kind(out, concurrency=concurrency, desc=f"Where {name}", executor=context.executor)
    return out
'''

BUILDER = """\
import os

from iree.build import *
from iree.build.executor import ActionConcurrency

from exportlib import RelativeWhere, SandboxedWhere, export_model, read, where


@entrypoint
def exported():
    export_model({"mlir_path": "model.mlir", "program": "module {}\\n"})
    return read("program.txt", [os.path.abspath("model.mlir")])


@entrypoint
def process():
    return where("process.txt")


@entrypoint
def places():
    return [
        where("process.txt"),
        where("thread.txt", concurrency=ActionConcurrency.THREAD),
        where("relative.txt", RelativeWhere),
        where("sandboxed.txt", SandboxedWhere),
    ]


if __name__ == "__main__":
    iree_build_main()
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "exportlib.py").write_text(LIBRARY)
    (proj / "builder.py").write_text(BUILDER)
    return proj


def _built(out: Path, name: str) -> str:
    return (out / "genfiles" / name).read_text()


def test_a_relative_write_lands_where_the_build_started_and_is_read_back(
    kiln: Kiln, project: Path, tmp_path: Path
) -> None:
    # Started from the project's parent, as `kiln build proj/builder.py`.
    r = kiln("build", "proj/builder.py", "exported")
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "model.mlir").read_text() == "module {}\n"
    out = tmp_path / "kiln-out"
    assert _built(out, "exported/program.txt") == "module {}\n"
    assert not [p for p in out.rglob("model.mlir") if ".kiln" not in p.parts]
    # Keyed and kept as any file an action writes outside: unchanged, nothing runs.
    again = kiln("build", "proj/builder.py", "exported")
    assert again.returncode == 0 and "0 built, 2 up to date" in again.stderr, again.stderr


def test_another_output_directory_changes_nothing_of_it(
    kiln: Kiln, project: Path, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere" / "out"
    r = kiln("build", "proj/builder.py", "exported", "--output-dir", str(elsewhere))
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "model.mlir").read_text() == "module {}\n"
    assert _built(elsewhere, "exported/program.txt") == "module {}\n"


def test_each_kind_of_action_runs_where_it_names_its_files_from(
    kiln: Kiln, project: Path, tmp_path: Path
) -> None:
    r = kiln("build", "proj/builder.py", "places", "-j", "1")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "kiln-out"
    assert _built(out, "places/process.txt") == str(tmp_path)  # iree.build's kind
    assert _built(out, "places/thread.txt") == str(tmp_path)  # kiln's own process
    assert _built(out, "places/relative.txt") == str(out)  # relative_paths = True
    assert _built(out, "places/sandboxed.txt") == str(out)  # a RemotableThunk


def test_the_reproducibility_check_reruns_it_where_it_ran(
    kiln: Kiln, project: Path, tmp_path: Path
) -> None:
    # Run again in place, its worker runs where it ran (the bytes name the place).
    r = kiln("build", "proj/builder.py", "process", "--check-reproducible", "--no-cache")
    assert r.returncode == 0, r.stderr
    assert _built(tmp_path / "kiln-out", "process/process.txt") == str(tmp_path)


def test_upstream_writes_the_same_file_in_the_same_place(project: Path, tmp_path: Path) -> None:
    needs.module("iree.build")  # compared with iree-base-compiler's iree.build
    # iree.build does not put the module's directory on the path: the library is found
    # through PYTHONPATH, as an installed one would be.
    path = os.pathsep.join(p for p in (str(project), os.environ.get("PYTHONPATH")) if p)
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": path}
    for tool, out in (("iree.build", "uout"), ("kiln", "kout")):
        (tmp_path / "model.mlir").unlink(missing_ok=True)
        argv = [sys.executable, "-m", tool, "proj/builder.py", "exported", "--output-dir", out]
        r = subprocess.run(argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, (tool, r.stderr)
        assert (tmp_path / "model.mlir").read_text() == "module {}\n", tool
        assert _built(tmp_path / out, "exported/program.txt") == "module {}\n", tool
    assert json.dumps(sorted(os.listdir(tmp_path))) == json.dumps(
        sorted(["kout", "model.mlir", "proj", "uout"])
    )
