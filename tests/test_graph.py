"""The build graph: contexts, files, namespaces, actions, entrypoints, cl_arg, and the
definition errors (duplicate paths, escaping paths, cycles, missing sources).

In-process tests use ``Executor`` directly; the rest run ``kiln build`` on build
modules written to disk and check what the user sees.
"""

from __future__ import annotations

import platform
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from kiln import entrypoint
from kiln.base.errors import BuildDefinitionError
from kiln.engine.scheduler import SchedulerOptions
from kiln.executor import (
    ActionConcurrency,
    BuildAction,
    BuildContext,
    BuildEntrypoint,
    BuildFile,
    BuildMeta,
    Executor,
    FileNamespace,
)

pytestmark = pytest.mark.in_process


HEADER = """\
from kiln import cl_arg, entrypoint, run_command, source_file
from kiln.executor import *


"""


@pytest.fixture
def executor(tmp_path: Path) -> Iterator[Executor]:
    ex = Executor(tmp_path / "out")
    yield ex
    ex.close()


@pytest.fixture
def root(executor: Executor) -> Iterator[BuildContext]:
    with executor.get_context("") as ctx:
        yield ctx


def line_of(path: Path, text: str, nth: int = 0) -> int:
    """1-based number of the ``nth`` line of ``path`` containing ``text``."""
    hits = [i + 1 for i, line in enumerate(path.read_text().splitlines()) if text in line]
    return hits[nth]


def this_line() -> int:
    return sys._getframe(1).f_lineno


# -- contexts and files (in-process) -----------------------------------------


def test_current_context_outside_a_build_is_an_error() -> None:
    with pytest.raises(BuildDefinitionError, match="no active BuildContext"):
        BuildContext.current()


def test_current_context_nests_and_restores(executor: Executor) -> None:
    outer = executor.get_context("")
    inner = BuildContext("inner", executor)
    with outer:
        assert BuildContext.current() is outer
        with inner:
            assert BuildContext.current() is inner
        assert BuildContext.current() is outer
    with pytest.raises(BuildDefinitionError):
        BuildContext.current()


def test_allocate_file_is_relative_to_the_context(executor: Executor) -> None:
    ctx = BuildContext("models/mnist", executor)
    f = ctx.allocate_file("weights.bin")
    assert f.path == "models/mnist/weights.bin"
    assert f.namespace is FileNamespace.GEN
    assert executor.get_file("models/mnist/weights.bin") is f
    up = ctx.allocate_file("../shared.txt")  # leaves the context, not the namespace root
    assert up.path == "models/shared.txt"


def expected_platform_dir() -> str:
    machine = platform.machine().lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    return f"platform/{platform.system().lower()}-{machine}"


@pytest.mark.parametrize(
    ("namespace", "root_dir"),
    [
        (FileNamespace.GEN, "genfiles"),
        (FileNamespace.PARAMS, "params"),
        (FileNamespace.BIN, "bin"),
        (FileNamespace.PLATFORM_BIN, expected_platform_dir()),
    ],
)
def test_namespace_roots(
    executor: Executor, root: BuildContext, namespace: FileNamespace, root_dir: str
) -> None:
    f = root.allocate_file("sub/x.out", namespace=namespace)
    fs_path = f.get_fs_path()
    assert fs_path == executor.output_dir / root_dir / "sub" / "x.out"
    assert fs_path.parent.is_dir()  # get_fs_path makes the directory
    assert not fs_path.exists()


@pytest.mark.parametrize("path", ["..", "../x", "a/../../x", "../../../../etc/passwd", "."])
def test_path_leaving_the_namespace_root_is_rejected(root: BuildContext, path: str) -> None:
    with pytest.raises(BuildDefinitionError, match="output root"):
        root.allocate_file(path)


def test_dotdot_leaving_root_from_a_nested_context_is_rejected(executor: Executor) -> None:
    ctx = BuildContext("a/b", executor)
    assert ctx.allocate_file("../../ok").path == "ok"
    with pytest.raises(BuildDefinitionError, match=r"'\.\./\.\./\.\./x'"):
        ctx.allocate_file("../../../x", namespace=FileNamespace.BIN)
    assert "x" not in executor.all


def test_absolute_paths(executor: Executor, root: BuildContext, tmp_path: Path) -> None:
    # Outside the output directory: a file there, named by its path (as iree.build).
    elsewhere = tmp_path / "elsewhere.txt"
    outside = root.allocate_file(str(elsewhere))
    assert outside.path == str(elsewhere) and outside.source == elsewhere
    assert outside.get_fs_path() == elsewhere and not elsewhere.parent.joinpath("x").exists()
    assert root.file(str(elsewhere)) is outside
    assert isinstance(BuildDefinitionError("x"), RuntimeError)  # as iree.build's errors
    with pytest.raises(RuntimeError, match="duplicate path"):
        root.allocate_file(str(elsewhere))
    # Inside it but out of the namespace's root: an error.
    with pytest.raises(BuildDefinitionError, match="outside the output root"):
        root.allocate_file(str(executor.get_root(FileNamespace.GEN) / ".." / "escape.txt"))
    inside = root.allocate_file(
        str(executor.get_root(FileNamespace.BIN) / "m" / "a.vmfb"), namespace=FileNamespace.BIN
    )
    assert inside.path == "m/a.vmfb"
    assert inside.get_fs_path() == executor.output_dir / "bin" / "m" / "a.vmfb"


def test_file_and_files_lookup(executor: Executor, root: BuildContext) -> None:
    ctx = BuildContext("ep", executor)
    a = ctx.allocate_file("a.txt")
    b = ctx.allocate_file("dir/b.txt")
    assert ctx.file("a.txt") is a
    assert ctx.file(a) is a
    assert root.file("ep/a.txt") is a
    assert root.file("/ep/dir/b.txt") is b
    assert ctx.file("/ep/a.txt") is a
    assert ctx.files("a.txt") == [a]
    assert ctx.files(["dir/b.txt", a]) == [b, a]


def test_unknown_file_lists_close_names(executor: Executor) -> None:
    ctx = BuildContext("ep", executor)
    ctx.allocate_file("model.onnx")
    ctx.allocate_file("model.mlir")
    ctx.allocate_file("unrelated/zzz.bin")
    with pytest.raises(BuildDefinitionError) as info:
        ctx.file("modle.onnx")
    message = str(info.value)
    assert "'ep/modle.onnx'" in message
    assert "ep/model.onnx" in message
    assert "zzz" not in message


def test_duplicate_path_names_both_sites(root: BuildContext) -> None:
    first_line = this_line() + 1
    root.allocate_file("dup.txt")
    second_line = this_line() + 2
    with pytest.raises(BuildDefinitionError) as info:
        root.allocate_file("dup.txt")
    message = str(info.value)
    assert "'dup.txt'" in message
    assert f"{__file__}:{first_line}" in message
    assert f"{__file__}:{second_line}" in message
    assert "/kiln/" not in message.replace(__file__, "")


def test_file_and_context_share_one_namespace(executor: Executor, root: BuildContext) -> None:
    BuildContext("thing", executor)
    with pytest.raises(BuildDefinitionError, match="duplicate path 'thing'"):
        root.allocate_file("thing")


def test_cycle_is_reported_as_a_cycle(executor: Executor, root: BuildContext) -> None:
    files = [root.allocate_file(n) for n in ("a", "b", "c")]
    for i, f in enumerate(files):
        action = Noop(desc=f"make {f.path}", executor=executor, deps=[files[(i + 1) % 3]])
        f.deps.add(action)
    with pytest.raises(BuildDefinitionError) as info:
        executor.run([files[0]], _options())
    message = str(info.value)
    match = re.search(r"dependency cycle: (\S+) -> .* -> (\S+) \(", message)
    assert match, message
    assert match.group(1) == match.group(2)
    for name in ("make a", "make b", "make c"):
        assert name in message


def _options() -> SchedulerOptions:
    return SchedulerOptions(jobs=2)


# -- actions, metadata, entrypoints (in-process) ------------------------------


class Noop(BuildAction):
    def _invoke(self) -> None:
        pass


class WriteText(BuildAction):
    """Overrides ``_invoke``: runs in kiln's process."""

    def __init__(self, out: BuildFile, text: str, **kw):
        super().__init__(**kw)
        self.out = out
        self.text = text

    def _invoke(self) -> None:
        self.out.get_fs_path().write_text(self.text)


class _WriteThunk:
    def __init__(self, path: str, text: str):
        self.path = path
        self.text = text

    def __call__(self) -> None:
        Path(self.path).write_text(self.text)


class ThunkWrite(BuildAction):
    """Overrides only ``_remotable_thunk``; with THREAD or NONE the thunk runs in-process."""

    def __init__(self, out: BuildFile, text: str, **kw):
        super().__init__(**kw)
        self.out = out
        self.text = text

    def _remotable_thunk(self) -> Callable[[], None]:
        return _WriteThunk(str(self.out.get_fs_path()), self.text)


@pytest.mark.parametrize("kind", [ActionConcurrency.THREAD, ActionConcurrency.NONE])
@pytest.mark.parametrize("cls", [WriteText, ThunkWrite])
def test_user_actions_run(
    executor: Executor, root: BuildContext, kind: ActionConcurrency, cls: type
) -> None:
    out = root.allocate_file("o.txt")
    action = cls(out, "hi", desc="write o", executor=executor, concurrency=kind)
    out.deps.add(action)
    assert str(action) == "write o"
    assert action.concurrency is kind

    result = executor.run([out], _options())

    assert result.ok and result.built == [action]
    assert out.get_fs_path().read_text() == "hi"


def test_executor_build_reports_success_like_the_seed(executor: Executor) -> None:
    with executor.get_context("") as root:
        good = root.allocate_file("good.txt")
        good.deps.add(WriteText(good, "ok", desc="write good", executor=executor))
        bad = root.allocate_file("bad.txt")
        bad_action = Noop(desc="forgets its output", executor=executor)
        bad.deps.add(bad_action)
    assert executor.build(good, jobs=1) is True
    assert executor.build(good, bad, jobs=1) is False
    assert bad_action in executor.failed_deps
    assert bad in executor.failed_deps  # the file it did not make failed with it


def test_action_without_invocation_fails_cleanly(executor: Executor, root: BuildContext) -> None:
    out = root.allocate_file("o.txt")
    action = BuildAction(desc="nothing", executor=executor)
    out.deps.add(action)
    result = executor.run([out], _options())
    assert result.failed == [action]
    assert isinstance(action.failure, NotImplementedError)


def test_action_that_writes_nothing_fails(executor: Executor, root: BuildContext) -> None:
    out = root.allocate_file("never.txt")
    action = Noop(desc="lazy", executor=executor)
    out.deps.add(action)
    result = executor.run([out], _options())
    assert result.failed == [action]
    assert "never.txt" in str(action.failure)


class Note(BuildMeta):
    KEY = "tests.note"

    def __init__(self) -> None:
        super().__init__()
        self.items: list[str] = []


class OtherNote(BuildMeta):
    KEY = "tests.other"


class NoKey(BuildMeta):
    pass


def test_build_meta_is_typed_and_per_node(root: BuildContext) -> None:
    a, b = root.allocate_file("a"), root.allocate_file("b")
    note = Note.get(a)
    assert isinstance(note, Note)
    note.items.append("x")
    assert Note.get(a) is note
    assert Note.get(b) is not note and Note.get(b).items == []
    assert isinstance(OtherNote.get(a), OtherNote)
    assert Note.get(a).items == ["x"]
    with pytest.raises(TypeError, match="KEY"):
        NoKey.get(a)
    with pytest.raises(TypeError, match="KEY"):
        NoKey()


@entrypoint
def _documented():
    """Builds two things.

    More text."""
    ctx = BuildContext.current()
    for name in ("one.txt", "two.txt"):
        out = ctx.allocate_file(name)
        out.deps.add(WriteText(out, name, desc=f"write {name}", executor=ctx.executor))
    return ["one.txt", "two.txt"]


@entrypoint(description="described")
def _described():
    return _documented()


@entrypoint
def _returns_nothing():
    BuildContext.current().allocate_file("side.txt")


def test_entrypoints_declare_contexts_with_outputs(executor: Executor) -> None:
    assert _documented.description == "Builds two things."
    assert _described.description == "described"
    executor.analyze(_documented, _described, _returns_nothing)

    by_path = {ep.path: ep for ep in executor.entrypoints}
    assert set(by_path) == {
        "_documented",
        "_described",
        "_described/_documented",
        "_returns_nothing",
    }
    top = by_path["_documented"]
    assert isinstance(top, BuildEntrypoint) and top.entrypoint is _documented
    assert [f.path for f in top.outputs] == ["_documented/one.txt", "_documented/two.txt"]
    assert top.deps == set(top.outputs)
    nested = by_path["_described"]
    assert [f.path for f in nested.outputs] == [
        "_described/_documented/one.txt",
        "_described/_documented/two.txt",
    ]
    assert by_path["_returns_nothing"].outputs == []
    assert executor.get_file("_returns_nothing/side.txt").namespace is FileNamespace.GEN

    result = executor.run([nested], _options())
    assert result.ok and len(result.built) == 2
    assert all(f.get_fs_path().read_text() == Path(f.path).name for f in nested.outputs)


@entrypoint
def _returns_a_number():
    return 42


@entrypoint
def _returns_a_generator():
    ctx = BuildContext.current()
    return (ctx.allocate_file(n) for n in ("g1", "g2"))


def test_entrypoint_results_must_be_files(executor: Executor) -> None:
    with pytest.raises(BuildDefinitionError) as info:
        executor.analyze(_returns_a_number)
    message = str(info.value)
    assert "'_returns_a_number'" in message and "42" in message
    assert __file__ in message

    executor.analyze(_returns_a_generator)
    ep = executor.entrypoints[-1]
    assert [f.path for f in ep.outputs] == ["_returns_a_generator/g1", "_returns_a_generator/g2"]


def test_entrypoint_called_outside_a_build_is_an_error() -> None:
    with pytest.raises(BuildDefinitionError, match="no active BuildContext"):
        _documented()


# -- definitions through the command line --------------------------------------


def test_duplicate_path_names_both_sites_in_the_build_module(write_module, kiln) -> None:
    path = write_module(
        HEADER
        + """
@entrypoint
def twice():
    run_command(name="x.txt", command=["true"])
    return run_command(name="x.txt", command=["true"])
""",
        header=False,
    )
    r = kiln("build", "build.py")

    assert r.returncode == 2
    first = line_of(path, 'run_command(name="x.txt"', 0)
    second = line_of(path, 'run_command(name="x.txt"', 1)
    assert f"{path}:{first}" in r.stderr and f"{path}:{second}" in r.stderr
    assert "twice/x.txt" in r.stderr
    assert "src/kiln" not in r.stderr and "Traceback" not in r.stderr


def test_duplicate_path_from_a_user_action_helper(write_module, kiln) -> None:
    path = write_module(
        HEADER
        + """
class Touch(BuildAction):
    def __init__(self, ctx, name, **kw):
        super().__init__(desc=f"touch {name}", executor=ctx.executor, **kw)
        self.out = ctx.allocate_file(name, namespace=FileNamespace.BIN)
        self.out.deps.add(self)

    def _invoke(self):
        self.out.get_fs_path().write_text("")

@entrypoint
def a():
    ctx = BuildContext.current()
    Touch(ctx, "same")
    return Touch(ctx, "same").out
""",
        header=False,
    )
    r = kiln("build", "build.py")

    assert r.returncode == 2
    alloc = line_of(path, "self.out = ctx.allocate_file")
    assert f"{path}:{alloc}" in r.stderr
    assert "a/same" in r.stderr


def test_cycle_through_the_cli(write_module, kiln) -> None:
    write_module(
        HEADER
        + """
class Step(BuildAction):
    def _invoke(self):
        pass

@entrypoint
def loop():
    ctx = BuildContext.current()
    a, b, c = (ctx.allocate_file(n) for n in ("a", "b", "c"))
    a.deps.add(Step(desc="step a", executor=ctx.executor, deps=[b]))
    b.deps.add(Step(desc="step b", executor=ctx.executor, deps=[c]))
    c.deps.add(Step(desc="step c", executor=ctx.executor, deps=[a]))
    return a
""",
        header=False,
    )
    r = kiln("build", "build.py")

    assert r.returncode == 2
    match = re.search(r"cycle: (.+?) \(", r.stderr)
    assert match, r.stderr
    names = match.group(1).split(" -> ")
    assert names[0] == names[-1]
    assert {"loop/a", "loop/b", "loop/c", "step a", "step b", "step c"} <= set(names)
    assert len(names) == 7


@pytest.mark.parametrize(
    ("name", "namespace", "said"),
    [
        ("../../escape.txt", "GEN", "output root"),
        ("../../../escape.txt", "PLATFORM_BIN", "output root"),
        ("/tmp/elsewhere.txt", "BIN", "outside the output directory; kiln's own actions"),
    ],
)
def test_escaping_output_path_is_a_definition_error(
    write_module, kiln, tmp_path: Path, name: str, namespace: str, said: str
) -> None:
    write_module(
        HEADER
        + f"""
@entrypoint
def esc():
    return run_command(name={name!r}, command=["touch", "{{out}}"],
                       namespace=FileNamespace.{namespace})
""",
        header=False,
    )
    r = kiln("build", "build.py")

    assert r.returncode == 2
    assert said in r.stderr and name in r.stderr
    assert not (tmp_path / "escape.txt").exists()
    assert not (tmp_path / "kiln-out" / "escape.txt").exists()
    assert r.stdout == ""


def test_outputs_land_in_their_namespace_roots(write_module, kiln, tmp_path: Path) -> None:
    write_module(
        HEADER
        + """
@entrypoint
def spread():
    return [
        run_command(name=f"{ns.value}.txt", command=["touch", "{out}"], namespace=ns)
        for ns in FileNamespace
    ]
""",
        header=False,
    )
    r = kiln("build", "build.py")

    assert r.returncode == 0, r.stderr
    out = tmp_path / "kiln-out"
    expected = [
        out / "genfiles" / "spread" / "gen.txt",
        out / "params" / "spread" / "params.txt",
        out / "bin" / "spread" / "bin.txt",
        out / expected_platform_dir() / "spread" / "platform_bin.txt",
    ]
    assert r.stdout.splitlines() == [str(p) for p in expected]
    assert all(p.is_file() for p in expected)


# -- run_command and source_file ----------------------------------------------


def test_run_command_substitutes_out_and_inputs(write_module, kiln, tmp_path: Path) -> None:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "words.txt").write_text("hello\n")
    write_module(
        HEADER
        + """
@entrypoint
def pipeline():
    words = source_file("words.txt")
    upper = run_command(name="upper.txt", inputs=[words],
                        command=["sh", "-c", 'tr a-z A-Z < "$0" > "$1"', "{inputs[0]}", "{out}"])
    return run_command(name="both.txt", inputs=[words, "upper.txt"],
                       command=["sh", "-c", 'cat "$0" "$1" > "$2"',
                                "{inputs[0]}", "{inputs[1]}", "{out}"])
""",
        name="proj/build.py",
        header=False,
    )
    r = kiln("build", "proj/build.py")

    assert r.returncode == 0, r.stderr
    both = tmp_path / "kiln-out" / "genfiles" / "pipeline" / "both.txt"
    assert r.stdout.splitlines() == [str(both)]
    assert both.read_text() == "hello\nHELLO\n"
    # nothing but the outputs: no temporary files left beside them
    assert sorted(p.name for p in both.parent.iterdir()) == ["both.txt", "upper.txt"]


def test_run_command_failure_shows_stderr_tail(write_module, kiln, tmp_path: Path) -> None:
    write_module(
        HEADER
        + """
@entrypoint
def fails():
    return run_command(name="never.txt", command=[
        "sh", "-c", 'for i in $(seq 1 50); do echo "line $i" >&2; done; touch "$0"; exit 7',
        "{out}"])
""",
        header=False,
    )
    r = kiln("build", "build.py")

    assert r.returncode == 1
    assert "status 7" in r.stderr
    assert "line 50" in r.stderr and "line 45" in r.stderr
    assert "line 1\n" not in r.stderr  # only the tail
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "kiln-out" / "genfiles" / "fails" / "never.txt").exists()
    assert r.stdout == ""


def test_source_file_is_relative_to_the_build_module(write_module, kiln, tmp_path: Path) -> None:
    (tmp_path / "proj" / "data").mkdir(parents=True)
    (tmp_path / "proj" / "data" / "in.txt").write_text("from the source tree")
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "in.txt").write_text("wrong file: relative to the cwd")
    write_module(
        HEADER
        + """
@entrypoint
def copy():
    src = source_file("data/in.txt")
    return run_command(name="copy.txt", inputs=[src], command=["cp", "{inputs[0]}", "{out}"])
""",
        name="proj/build.py",
        header=False,
    )
    r = kiln("build", "proj/build.py")

    assert r.returncode == 0, r.stderr
    copied = tmp_path / "kiln-out" / "genfiles" / "copy" / "copy.txt"
    assert copied.read_text() == "from the source tree"


def test_source_file_outside_the_module_dir_can_be_named(write_module, kiln, tmp_path) -> None:
    (tmp_path / "shared").mkdir()
    (tmp_path / "shared" / "vocab.txt").write_text("shared vocab\n")
    write_module(
        HEADER
        + """
@entrypoint
def by_name():
    source_file("../shared/vocab.txt")
    return run_command(name="copy.txt", inputs=["../shared/vocab.txt"],
                       command=["cp", "{inputs[0]}", "{out}"])
""",
        name="proj/build.py",
        header=False,
    )
    r = kiln("build", "proj/build.py")

    assert r.returncode == 0, r.stderr
    copied = tmp_path / "kiln-out" / "genfiles" / "by_name" / "copy.txt"
    assert copied.read_text() == "shared vocab\n"


def test_source_file_of_an_absolute_path_is_named_by_its_base_name(
    write_module, kiln, tmp_path
) -> None:
    model = tmp_path / "models" / "squeezenet" / "light_squeezenet.onnx"
    model.parent.mkdir(parents=True)
    model.write_text("weights\n")
    write_module(
        HEADER
        + f"""
@entrypoint
def squeezenet():
    return source_file({str(model)!r})

@entrypoint
def named():
    return source_file({str(model)!r}, name="model/squeeze.onnx")
""",
        header=False,
    )
    r = kiln("list", "build.py", "--all", "--bare")

    assert r.returncode == 0, r.stderr
    listed = r.stdout.split()
    assert "squeezenet/light_squeezenet.onnx" in listed
    assert "named/model/squeeze.onnx" in listed
    assert not any("models/squeezenet" in p for p in listed), listed


def test_missing_source_file_names_it_and_the_entrypoint(write_module, kiln) -> None:
    path = write_module(
        HEADER
        + """
@entrypoint
def needs_model():
    return source_file("models/missing.onnx")
""",
        header=False,
    )
    r = kiln("build", "build.py")

    assert r.returncode == 2
    assert str(path.parent / "models" / "missing.onnx") in r.stderr
    assert "needs_model" in r.stderr
    assert f"{path}:{line_of(path, 'source_file(')}" in r.stderr
    assert "Traceback" not in r.stderr


def test_unknown_input_name_suggests_close_names(write_module, kiln) -> None:
    write_module(
        HEADER
        + """
@entrypoint
def typo():
    run_command(name="model.mlir", command=["touch", "{out}"])
    return run_command(name="model.vmfb", inputs=["modle.mlir"], command=["true"])
""",
        header=False,
    )
    r = kiln("build", "build.py")

    assert r.returncode == 2
    assert "typo/modle.mlir" in r.stderr and "typo/model.mlir" in r.stderr


# -- cl_arg ---------------------------------------------------------------------

CL_ARGS = (
    HEADER
    + """
MODEL = cl_arg("model", default="tiny", help="which model to build")

@entrypoint
def first(model=MODEL, repeat=cl_arg("repeat", default=1, type=int, help="copies"),
          loud=cl_arg("loud", action="store_true", help="shout")):
    text = (model.upper() if loud else model) * repeat
    return run_command(name="first.txt", command=["sh", "-c", f'printf {text} > "$0"', "{out}"])

@entrypoint
def second(model=MODEL):
    return run_command(name="second.txt", command=["sh", "-c", f'printf {model} > "$0"', "{out}"])
"""
)


def test_cl_args_become_options(write_module, kiln, tmp_path: Path) -> None:
    write_module(CL_ARGS, header=False)
    gen = tmp_path / "kiln-out" / "genfiles"

    r = kiln("build", "build.py")
    assert r.returncode == 0, r.stderr
    assert (gen / "first" / "first.txt").read_text() == "tiny"
    assert (gen / "second" / "second.txt").read_text() == "tiny"

    r = kiln("build", "build.py", "--model", "big", "--repeat", "2", "--loud")
    assert r.returncode == 0, r.stderr
    assert (gen / "first" / "first.txt").read_text() == "BIGBIG"
    assert (gen / "second" / "second.txt").read_text() == "big"


def test_cl_args_appear_in_help_and_are_validated(write_module, kiln) -> None:
    write_module(CL_ARGS, header=False)
    r = kiln("build", "build.py", "--help")
    assert r.returncode == 0
    for flag in ("--model", "--repeat", "--loud", "which model to build"):
        assert flag in r.stdout
    options = r.stdout[r.stdout.index("options of the build module") :]
    assert options.count("--model") == 1  # the shared option is defined once

    bad = kiln("build", "build.py", "--repeat", "many")
    assert bad.returncode == 2
    assert "--repeat" in bad.stderr and "Traceback" not in bad.stderr


def test_conflicting_cl_arg_names_both_places(write_module, kiln) -> None:
    path = write_module(
        HEADER
        + """
@entrypoint
def a(size=cl_arg("size", default=1, type=int)):
    return None

@entrypoint
def b(size=cl_arg("size", default="large")):
    return None
""",
        header=False,
    )
    r = kiln("build", "build.py")

    assert r.returncode == 2
    assert "--size" in r.stderr
    first, second = line_of(path, 'cl_arg("size"', 0), line_of(path, 'cl_arg("size"', 1)
    assert f"{path}:{first}" in r.stderr and f"{path}:{second}" in r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("name", ["output-dir", "list-all", "iree-hal-target-device"])
def test_cl_arg_clashing_with_iree_builds_options(write_module, kiln, name: str) -> None:
    path = write_module(
        HEADER
        + f"""
@entrypoint
def clash(value=cl_arg({name!r}, default="x")):
    return None
""",
        header=False,
    )
    r = kiln("build", "build.py")

    assert r.returncode == 2
    assert f"--{name}" in r.stderr
    assert f"{path}:{line_of(path, 'cl_arg(')}" in r.stderr
