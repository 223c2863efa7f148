"""Results flow forward: a build's ``BuildResult`` records what happened to each
node (times, failure); graph nodes hold their definition only, and show the
latest build's record read-only, as iree.build's reporters expect.

Also the collaborators the ``Executor`` facade composes: nodes reach the graph
registry, the output layout and the run context, not the executor.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kiln.engine.request import SchedulerOptions
from kiln.engine.result import BuildResult
from kiln.executor import (
    BuildAction,
    BuildContext,
    BuildDependency,
    BuildFile,
    DependenceException,
    Executor,
    FileNamespace,
    ProgressReporter,
)
from kiln.output_dir.layout import OutputLayout, namespace_dir, output_rel_path

RUN_STATE = {"start_time", "invoke_time", "finish_time", "failure"}


class Write(BuildAction):
    """Writes its output, or fails when the file ``switch`` exists."""

    def __init__(self, out: BuildFile, switch: Path, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.out = out
        self._switch = switch

    def _invoke(self) -> None:
        if self._switch.exists():
            raise RuntimeError("told to fail")
        self.out.get_fs_path().write_text(self.desc)


@pytest.fixture()
def executor(tmp_path: Path) -> Iterator[Executor]:
    ex = Executor(tmp_path / "out", reporter=ProgressReporter())
    yield ex
    ex.close()


def _chain(ex: Executor, switch: Path) -> tuple[Write, Write, BuildFile]:
    with ex.get_context("") as root:
        a_out = root.allocate_file("a.txt")
        a = Write(a_out, switch, desc="write a", executor=ex)
        a_out.deps.add(a)
        b_out = root.allocate_file("b.txt")
        b = Write(b_out, switch.with_name("never"), desc="write b", executor=ex, deps=[a_out])
        b_out.deps.add(b)
    return a, b, b_out


def test_the_result_holds_each_nodes_run_and_nodes_hold_none(
    executor: Executor, tmp_path: Path
) -> None:
    switch = tmp_path / "fail"
    switch.touch()
    a, b, b_out = _chain(executor, switch)
    result = executor.run([b_out], SchedulerOptions(jobs=1))
    assert isinstance(result, BuildResult)
    assert result.failed == [a] and result.not_run == [b]
    assert isinstance(result.runs[a].failure, RuntimeError)
    assert isinstance(result.failure(b), DependenceException)
    assert result.runs[a].start_time is not None and result.runs[a].finish_time is not None
    assert result.runs[b].start_time is None  # never started
    for node in (a, b, b_out):
        assert not RUN_STATE & set(vars(node))  # definitions only
    # The read-only view iree.build reporters use shows the same record.
    assert a.failure is result.runs[a].failure and b.is_dependence_failure
    with pytest.raises(AttributeError):
        a.failure = None  # type: ignore[misc]


def test_a_later_build_replaces_the_view_of_what_it_planned(
    executor: Executor, tmp_path: Path
) -> None:
    switch = tmp_path / "fail"
    switch.touch()
    a, b, b_out = _chain(executor, switch)
    first = executor.run([b_out], SchedulerOptions(jobs=1))
    assert not first.ok and b.failure is not None
    switch.unlink()  # outside a's key: only asked to retry does it run again
    second = executor.run([b_out], SchedulerOptions(jobs=1, retry_failed=True))
    assert second.ok and second.built == [a, b]
    assert a.failure is None and b.failure is None
    assert b.execution_time >= 0.0 and b.invoke_time is not None
    assert isinstance(first.runs[a].failure, RuntimeError)  # the first result is kept as it was


def test_nodes_reach_the_collaborators_not_the_executor(executor: Executor) -> None:
    with executor.get_context("") as root:
        f = root.allocate_file("x/y.bin", FileNamespace.BIN)
        action = BuildAction(desc="d", executor=executor)
    assert root.registry is executor.graph
    assert executor.all is executor.graph.all and executor.all["x/y.bin"] is f
    assert f.layout is executor.layout
    assert action.run_context is executor.run_context
    # The reporter the facade is given is the one actions reach.
    reporter = ProgressReporter()
    executor.reporter = reporter
    assert action.run_context.reporter is reporter


def test_the_layout_places_each_namespace_and_log(tmp_path: Path) -> None:
    layout = OutputLayout(tmp_path / "out", warn=lambda m: None)
    assert layout.root(FileNamespace.GEN) == tmp_path / "out" / "genfiles"
    plat = layout.root(FileNamespace.PLATFORM_BIN)
    assert plat.parent == tmp_path / "out" / "platform" and "-" in plat.name
    assert layout.manifest_path == tmp_path / "out" / "manifest.json"
    assert output_rel_path("bin/m.vmfb") == "bin/m.vmfb"
    assert (
        output_rel_path("platform_bin/a/b.so")
        == f"{namespace_dir(FileNamespace.PLATFORM_BIN)}/a/b.so"
    )
    assert output_rel_path("src:/abs/path") is None and output_rel_path("gen/") is None


def test_log_paths_stay_under_kilns_directory(executor: Executor) -> None:
    with executor.get_context("") as root:
        f = root.allocate_file("deep/" + "n" * 253)  # + ".log": too long a name
    log = Path(executor.run_context.log_path(f))
    assert log.parent == executor.layout.kiln_dir / "logs" / "deep" and log.parent.is_dir()
    assert len(log.name) < 255 and log.name.endswith(".log")


def test_every_node_kind_accepts_the_seed_constructor(executor: Executor) -> None:
    ctx = BuildContext("sub", executor)
    dep = BuildDependency(executor=executor)
    assert ctx.executor is executor and dep.executor is executor
    assert dep.failure is None and dep.execution_time == 0.0


NO_COMPILER = """
import importlib.metadata

_real = importlib.metadata.version


def _version(name):
    if name == "iree-base-compiler":
        raise importlib.metadata.PackageNotFoundError(name)
    return _real(name)


importlib.metadata.version = _version
"""

WITH_COMPILE = """
from kiln import *


@entrypoint
def model():
    onnx = source_file("model.onnx")
    mlir = onnx_import(name="model.mlir", source=onnx)
    return [onnx, *compile(name="model", source=mlir, targets=["vmvx"])]
"""


def test_the_manifest_of_a_build_that_needs_no_compiler_keys_no_compile(
    tmp_path: Path,
) -> None:
    """Building a file that no compile produces, with iree-base-compiler missing,
    succeeds: the manifest is made from the build's result and keys nothing the
    build did not plan (it used to key every compile, and fail with ToolError)."""
    import json
    import os
    import subprocess
    import sys

    (tmp_path / "model.onnx").write_bytes(b"not really a model")
    (tmp_path / "build.py").write_text(WITH_COMPILE)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(NO_COMPILER)
    env = {**os.environ, "NO_COLOR": "1", "PYTHONPATH": str(site)}
    r = subprocess.run(
        [sys.executable, "-m", "kiln", "build", "build.py", "model/model.onnx"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    manifest = json.loads((tmp_path / "kiln-out/manifest.json").read_text())
    statuses = {o["path"]: o["status"] for o in manifest["entrypoints"]["model"]["outputs"]}
    assert statuses["../model.onnx"] == "built"
    assert statuses["bin/model/model_vmvx.vmfb"] == "not built"
