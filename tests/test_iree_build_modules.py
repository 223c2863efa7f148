"""Build modules written for iree.build, and an action library that imports
``iree.build.executor`` itself, run on kiln without a changed line, and give what
IREE's own iree.build (iree-base-compiler 3.13) gives on the same files: the same
outputs, the same paths printed on stdout, the same names, the same listings.

The modules are kiln's own, in the style of the real ones: shark-ai's builders
(``cl_arg("target")``, ``executor.BuildContext.current()``, a library's
``needs_file`` that frees a path with ``executor.all[k] = None``, weights placed
in ``genfiles/`` by hand), iree-turbine's ``build_actions`` (a PROCESS action
whose attribute holds return marshallers kiln cannot key), sharktank's
``export_model`` (an action that writes an absolute path beside the module), and
IREE's test-suite importer (inputs named by absolute paths, a directory among them).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import needs
import pytest
from dask_cluster import dask_cluster as dask_cluster  # noqa: F401 - the fixture

needs.module("iree.build")

LIBRARY = '''\
"""An action library written for iree.build (as turbine's and shortfin's are)."""

import functools
import os
from pathlib import Path

from iree.build.executor import (
    ActionConcurrency,
    BuildAction,
    BuildContext,
    BuildFile,
    FileNamespace,
)


def needs_file(filename, ctx, namespace=FileNamespace.GEN):
    out_file = ctx.allocate_file(filename, namespace=namespace).get_fs_path()
    if os.path.exists(out_file):
        return False
    ctx.executor.all[os.path.join(ctx.path, filename)] = None
    return True


def get_cached(filename, ctx, namespace=FileNamespace.GEN):
    try:
        return ctx.allocate_file(filename, namespace=namespace)
    except RuntimeError:
        return ctx.file(filename)


class WriteText(BuildAction):
    def __init__(self, text, output_file, **kwargs):
        super().__init__(**kwargs)
        self.text = text
        self.output_file = output_file
        output_file.deps.add(self)

    def _invoke(self):
        self.output_file.get_fs_path().write_text(self.text)


def write_text(*, name, text, namespace=FileNamespace.GEN):
    context = BuildContext.current()
    output_file = context.allocate_file(name, namespace=namespace)
    WriteText(text, output_file, desc=f"Writing {name}", executor=context.executor)
    return output_file


def _listing(path):
    if not path.is_dir():
        return [path.read_text().strip()]
    return [
        f"{p.relative_to(path).as_posix()}={p.read_text().strip()}"
        for p in sorted(path.rglob("*"))
        if p.is_file()
    ]


class Concat(BuildAction):
    def __init__(self, sources, output_file, **kwargs):
        super().__init__(**kwargs)
        self.sources = sources
        self.output_file = output_file
        self.deps.update(sources)
        output_file.deps.add(self)

    def _invoke(self):
        parts = [line for f in self.sources for line in _listing(f.get_fs_path())]
        self.output_file.get_fs_path().write_text("\\n".join(parts) + "\\n")


def concat(*, name, sources):
    context = BuildContext.current()
    output_file = context.allocate_file(name)
    Concat(context.files(sources), output_file, desc=f"Joining {name}", executor=context.executor)
    return output_file


def shout(text):
    return text.upper() + "\\n"


class TextMarshaller:
    """Saves a generator's result: one per declared return, held by the action."""

    def prepare_action(self, context, name, action):
        output_file = context.allocate_file(f"{name}.mlir")
        action.returns.append((self, output_file))
        output_file.deps.add(action)

    def save_remote_result(self, result, path):
        Path(path).write_text(result)


class RemoteGenerator:
    def __init__(self, thunk, args, return_info):
        self.thunk = thunk
        self.args = args
        self.return_info = return_info

    def __call__(self):
        result = self.thunk(*self.args)
        for marshaller, path in self.return_info:
            marshaller.save_remote_result(result, path)


class GeneratorAction(BuildAction):
    def __init__(self, thunk, args, **kwargs):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kwargs)
        self.thunk = thunk
        self.args = args
        self.returns = []

    def _remotable_thunk(self):
        info = [(m, f.get_fs_path()) for m, f in self.returns]
        return RemoteGenerator(self.thunk, self.args, info)


def generate(thunk, *args, name):
    context = BuildContext.current()
    action = GeneratorAction(
        thunk, args, desc=f"Generate {name}", executor=context.executor
    )
    TextMarshaller().prepare_action(context, name, action)
    return [f for _, f in action.returns]


def _export(path, text):
    Path(path).write_text(text)


class ExportAction(BuildAction):
    def __init__(self, path, text, **kwargs):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kwargs)
        self.path = path
        self.text = text

    def _remotable_thunk(self):
        return functools.partial(_export, self.path, self.text)


def export_model(text, mlir_path):
    context = BuildContext.current()
    output_file = context.allocate_file(str(Path(mlir_path).absolute()))
    action = ExportAction(
        str(output_file.get_fs_path()), text, desc=f"Exporting {mlir_path}",
        executor=context.executor,
    )
    output_file.deps.add(action)
    return output_file


def _export_from_config(config):
    # As sharktank's export: the worker builds the model from its config and writes
    # where the config says, relative to its working directory.
    path = Path(config["mlir_path"])
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(config["text"])


class ConfigExportAction(BuildAction):
    def __init__(self, config, **kwargs):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kwargs)
        self.config = config

    def _remotable_thunk(self):
        return functools.partial(_export_from_config, self.config)


def export_from_config(config):
    context = BuildContext.current()
    action = ConfigExportAction(
        config, desc=f"Export into {config['mlir_path']}", executor=context.executor
    )
    output_file = context.allocate_file(str(Path(config["mlir_path"]).absolute()))
    output_file.deps.add(action)
    return output_file


def _where(path):
    import iree.build.executor

    Path(path).write_text(iree.build.executor.__file__)


class WhereAction(BuildAction):
    def __init__(self, output_file, **kwargs):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kwargs)
        self.output_file = output_file
        output_file.deps.add(self)

    def _remotable_thunk(self):
        return functools.partial(_where, str(self.output_file.get_fs_path()))
'''

BUILDER = '''\
"""Artifacts for a model, built the way shark-ai's builders build them."""

import os
from pathlib import Path

from iree.build import *

from actionlib import *

HERE = Path(__file__).resolve().parent


@entrypoint(description="Retrieves a set of configuration files.")
def config(
    target=cl_arg("target", default="gfx942", help="IREE target architecture."),
    model=cl_arg("model", type=str, default="sdxl", help="Model architecture"),
):
    ctx = executor.BuildContext.current()
    names = [f"{model}_config.json", f"{model}_flags_{target}.txt"]
    for name in names:
        if needs_file(name, ctx):
            write_text(name=name, text=f"{name} for {target}\\n")
    get_cached(names[0], ctx)
    return names


@entrypoint(description="Uses the weights placed in the output directory.")
def weights():
    ctx = executor.BuildContext.current()
    if needs_file("model.irpa", ctx):
        write_text(name="model.irpa", text="fetched weights\\n")
    return concat(name="summary.txt", sources=["model.irpa"])


@entrypoint(description="Reads inputs named by absolute paths.")
def inputs():
    ctx = executor.BuildContext.current()
    data = ctx.allocate_file(str(HERE / "testdata"))
    model = ctx.allocate_file(str(HERE / "model.txt"))
    return concat(name="inputs.txt", sources=[data, model])


@entrypoint(description="Generates a program through an action library.")
def generated():
    return generate(shout, "hello program", name="program")


@entrypoint(description="Exports beside the module, then reads it back.")
def exported():
    export_model("exported program\\n", "exported/model.mlir")
    return concat(name="exported.txt", sources=[os.path.abspath("exported/model.mlir")])


@entrypoint(description="Imports and compiles an ONNX model.")
def compiled():
    ctx = executor.BuildContext.current()
    model = ctx.allocate_file(str(HERE / "add.onnx"))
    onnx_import(name="add.mlir", source=model)
    return compile(name="add", source="add.mlir")


@entrypoint(description="Exports to a path relative to where it runs, then reads it.")
def relative():
    export_from_config({"mlir_path": "relative/model.mlir", "text": "relative program\\n"})
    return concat(name="relative.txt", sources=[os.path.abspath("relative/model.mlir")])


@entrypoint(description="Imports an ONNX model of an older opset.")
def upgraded():
    ctx = executor.BuildContext.current()
    return onnx_import(name="pool.mlir", source=ctx.allocate_file(str(HERE / "pool.onnx")))


if __name__ == "__main__":
    iree_build_main()
'''

TARGET_ARGS = ["--iree-hal-target-device=llvm-cpu", "--iree-llvmcpu-target-cpu=host"]
ENTRYPOINTS = [
    "config",
    "weights",
    "inputs",
    "generated",
    "exported",
    "compiled",
    "relative",
    "upgraded",
]
KILN = ["-m", "kiln"]
UPSTREAM = ["-m", "iree.build"]


def _add_model(path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["c"])],
        "add",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("a", "b")],
        [helper.make_tensor_value_info("c", TensorProto.FLOAT, [4])],
    )
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)


def project(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "actionlib.py").write_text(LIBRARY)
    (root / "builder.py").write_text(BUILDER)
    (root / "testdata" / "sub").mkdir(parents=True)
    (root / "testdata" / "a.txt").write_text("alpha\n")
    (root / "testdata" / "sub" / "b.txt").write_text("beta\n")
    (root / "model.txt").write_text("a model\n")
    (root / "exported").mkdir()
    _add_model(root / "add.onnx")
    # IR version 3, opset 6: upgraded to opset 17 by both importers.
    import onnx

    data = Path(os.path.dirname(onnx.__file__)) / "backend/test/data/pytorch-converted"
    shutil.copy(data / "test_AvgPool2d" / "model.onnx", root / "pool.onnx")
    return root


def run(cwd: Path, tool: list[str], *args: str, env: dict[str, str] | None = None):
    return subprocess.run(
        [sys.executable, *tool, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "NO_COLOR": "1", **(env or {})},
    )


def prefill(out: Path) -> None:
    """Weights placed by hand before the first build, as Flux's builder expects."""
    (out / "genfiles" / "weights").mkdir(parents=True)
    (out / "genfiles" / "weights" / "model.irpa").write_text("weights placed by hand\n")


def tree(out: Path) -> dict[str, str]:
    """The files of an output directory (not kiln's or iree.build's own), by path,
    with their text (binaries, and the compiled module, which embeds its input's
    absolute path, by name only): an imported ``.mlir`` byte for byte."""
    found = {}
    for path in sorted(out.rglob("*")):
        rel = path.relative_to(out).as_posix()
        if path.is_dir() or rel.startswith(".kiln/") or rel in ("manifest.json", ".metadata.json"):
            continue
        text = path.suffix in (".txt", ".json", ".irpa", ".mlir")
        found[rel] = path.read_text() if text else "<binary>"
    return found


@pytest.fixture(scope="module")
def both(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """The builder built by kiln (twice) and by iree.build, into two output
    directories of the same project, each prefilled with the same weights."""
    root = project(tmp_path_factory.mktemp("proj"))
    for name in ("kout", "uout"):
        prefill(root / name)
    args = ["--target=gfx1100", *TARGET_ARGS]
    # Its own cache: a module-scoped fixture is made before each test's private one.
    cache = {"KILN_CACHE_DIR": str(tmp_path_factory.mktemp("kiln-cache"))}
    ours = run(root, KILN, "builder.py", "--output-dir", "kout", *args, env=cache)
    exported = (root / "exported" / "model.mlir").read_text()
    relative = (root / "relative" / "model.mlir").read_text()
    again = run(root, KILN, "builder.py", "--output-dir", "kout", *args, env=cache)
    (root / "exported" / "model.mlir").unlink()  # iree.build writes it anew
    (root / "relative" / "model.mlir").unlink()
    upstream = run(root, UPSTREAM, "builder.py", "--output-dir", "uout", *args)
    return {
        "root": root,
        "ours": ours,
        "again": again,
        "upstream": upstream,
        "exported": exported,
        "relative": relative,
    }


def test_the_builder_builds_on_both(both) -> None:
    assert both["upstream"].returncode == 0, both["upstream"].stderr
    assert both["ours"].returncode == 0, both["ours"].stderr
    assert both["again"].returncode == 0, both["again"].stderr


def test_same_outputs_and_names(both) -> None:
    root = both["root"]
    ours, theirs = tree(root / "kout"), tree(root / "uout")
    assert ours == theirs
    assert ours["genfiles/config/sdxl_flags_gfx1100.txt"] == "sdxl_flags_gfx1100.txt for gfx1100\n"
    assert ours["genfiles/weights/summary.txt"] == "weights placed by hand\n"
    assert ours["genfiles/inputs/inputs.txt"] == "a.txt=alpha\nsub/b.txt=beta\na model\n"
    assert ours["genfiles/generated/program.mlir"] == "HELLO PROGRAM\n"
    assert ours["genfiles/exported/exported.txt"] == "exported program\n"
    assert "bin/compiled/add_cpu-host.vmfb" in ours
    assert both["exported"] == "exported program\n"  # written beside the module
    # Written by a worker, relative to where it runs: where iree.build's runs, where
    # the build was started (not in kiln's output directory), and read from there.
    assert both["relative"] == "relative program\n"
    assert ours["genfiles/relative/relative.txt"] == "relative program\n"
    assert not (root / "kout" / "relative").exists()
    assert "torch.onnx_meta.ir_version = 3 :" in ours["genfiles/upgraded/pool.mlir"]


def test_same_paths_printed_on_stdout(both) -> None:
    ours = both["ours"].stdout.replace("kout/", "OUT/").splitlines()
    theirs = both["upstream"].stdout.replace("uout/", "OUT/").splitlines()
    assert ours == theirs
    assert "OUT/bin/compiled/add_cpu-host.vmfb" in ours
    assert str(both["root"] / "exported" / "model.mlir") not in ours  # not returned
    assert both["again"].stdout == both["ours"].stdout


def test_second_build_reruns_only_what_kiln_cannot_key(both) -> None:
    again = both["again"].stderr
    assert "kiln: done: 1 built, 9 up to date" in again, again
    assert "/10] Generate program" in again  # the only action that ran
    note = "kiln: GeneratorAction actions ('Generate program', defined at"
    assert again.count(note) == 1 and "attribute 'returns'" in again
    assert "run on every build and are never cached" in again
    outside = "(and 1 more file(s) of actions like it), outside the output directory"
    assert both["ours"].stderr.count(outside) == 1, both["ours"].stderr


def test_the_users_weights_and_exported_file_are_kept_by_clean(both) -> None:
    root = both["root"]
    (root / "exported" / "model.mlir").write_text("exported program\n")
    r = run(root, KILN, "clean", "--output-dir", "kout")
    assert r.returncode == 0, r.stderr
    assert (root / "kout/genfiles/weights/model.irpa").read_text() == "weights placed by hand\n"
    assert (root / "exported/model.mlir").is_file()
    assert not (root / "kout/genfiles/config").exists()


@pytest.mark.parametrize("command", ["--list", "--list-all"])
def test_same_listings(tmp_path: Path, command: str) -> None:
    root = project(tmp_path / "proj")
    ours = run(root, KILN, "builder.py", command, "--output-dir", "kout", *TARGET_ARGS)
    theirs = run(root, UPSTREAM, "builder.py", command, "--output-dir", "uout", *TARGET_ARGS)
    assert ours.returncode == 0 and theirs.returncode == 0, (ours.stderr, theirs.stderr)
    assert ours.stdout == theirs.stdout
    assert ours.stdout.split("\n", 1)[0] == "config"


def test_help_shows_whose_option_is_whose(tmp_path: Path) -> None:
    root = project(tmp_path / "proj")
    r = run(root, KILN, "builder.py", "--help")
    assert r.returncode == 0, r.stderr
    shown = " ".join(r.stdout.split())
    module_part = shown.split("options of the build module")[1]
    assert "--target TARGET IREE target architecture." in module_part
    assert "--kiln-target SPEC" in shown and "(--target is the build module's option)" in shown


def test_workers_import_iree_build_as_kiln(tmp_path: Path) -> None:
    """The library a PROCESS thunk comes from imports iree.build in kiln's worker:
    it gets kiln's module; with the shim off, IREE's."""
    root = project(tmp_path / "proj")
    (root / "where.py").write_text(
        textwrap.dedent("""\
        from iree.build import *
        from actionlib import WhereAction

        @entrypoint
        def where():
            ctx = executor.BuildContext.current()
            out = ctx.allocate_file("where.txt")
            WhereAction(out, desc="Where", executor=ctx.executor)
            return out
        """)
    )
    r = run(root, KILN, "where.py", "--output-dir", "o")
    assert r.returncode == 0, r.stderr
    import kiln

    kiln_dir = Path(kiln.__file__).parent
    assert (root / "o/genfiles/where/where.txt").read_text() == str(
        kiln_dir / "iree_build" / "executor.py"
    )
    off = run(root, KILN, "where.py", "--output-dir", "o2", "--no-iree-build-shim")
    assert off.returncode == 2
    assert "its entrypoints are IREE's own iree.build's" in off.stderr
    env = {"KILN_NO_IREE_BUILD_SHIM": "1"}
    env_off = run(root, KILN, "where.py", "--output-dir", "o3", env=env)
    assert env_off.returncode == 2 and "IREE's own iree.build's" in env_off.stderr


IN_PROCESS = """\
import io, sys
sys.path.insert(0, ".")
import iree.build.executor as theirs
import actionlib
from kiln import iree_build_main, load_build_module

assert actionlib.BuildAction is theirs.BuildAction
for attempt in range(2):
    mod = load_build_module("builder.py")
    assert mod.WriteText.__mro__[1].__module__.startswith("kiln.graph"), mod.WriteText.__mro__
    out, err = io.StringIO(), io.StringIO()
    iree_build_main(mod, args=["config", "--output-dir", "o", "--target", "x"], stdout=out,
                    stderr=err)
    print(out.getvalue().strip(), err.getvalue().count("Writing"))
    import iree.build.executor
    assert iree.build.executor is theirs, iree.build.executor
    assert sys.modules["actionlib"] is actionlib
    assert actionlib.BuildAction is theirs.BuildAction
    assert iree.build.executor.__file__.endswith("iree/build/executor.py")
from iree.build import executor
assert executor is theirs
print("restored")
"""


def test_a_process_that_imported_iree_build_first_gets_it_back(tmp_path: Path) -> None:
    """IREE's iree.build and a library imported against it before kiln ran are set
    aside for kiln's run (the build imports them afresh, against kiln) and are
    what the process has again after it; a second run in the process works too."""
    root = project(tmp_path / "proj")
    r = run(root, ["-c", IN_PROCESS])
    assert r.returncode == 0, r.stderr
    outputs = ["o/genfiles/config/sdxl_config.json", "o/genfiles/config/sdxl_flags_x.txt"]
    assert r.stdout.splitlines() == [
        outputs[0],
        f"{outputs[1]} 2",
        outputs[0],
        f"{outputs[1]} 0",
    ] + ["restored"]


DASK_MODULE = """\
import functools

from iree.build import *
from iree.build.executor import ActionConcurrency, BuildAction


def _where(out):
    import iree.build.executor

    with open(out, "w") as f:
        f.write(iree.build.executor.__file__)


class Where(BuildAction):
    def __init__(self, out, **kwargs):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kwargs)
        self.out = out
        out.deps.add(self)

    def _remotable_thunk(self):
        return self._sandbox_thunk(lambda f: str(f.get_fs_path()))

    def _sandbox_thunk(self, path):
        return functools.partial(_where, path(self.out))


@entrypoint
def where():
    ctx = executor.BuildContext.current()
    out = ctx.allocate_file("where.txt")
    Where(out, desc="Where", executor=ctx.executor)
    return out
"""


def test_a_dask_worker_imports_iree_build_as_kiln(tmp_path: Path, dask_cluster, nginx_cache):
    (tmp_path / "build.py").write_text(DASK_MODULE)
    args = ["--executor", dask_cluster.url, "--remote-cache", nginx_cache.url]
    r = run(tmp_path, KILN, "build.py", "--output-dir", "o", "--cache-dir", "c", *args)
    assert r.returncode == 0, r.stderr
    written = (tmp_path / "o/genfiles/where/where.txt").read_text()
    assert written.endswith("/kiln/iree_build/executor.py"), written
