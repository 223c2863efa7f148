"""The public names: ``kiln.__all__`` and what ``kiln.executor`` exports are pinned,
so that adding or losing a public name is a deliberate change."""

from __future__ import annotations

import inspect
import subprocess
import sys

import needs
import pytest

import kiln
import kiln.executor

KILN_ALL = [
    "ActionConcurrency",
    "ActionFailed",
    "ActionTimeout",
    "BuildAction",
    "BuildContext",
    "BuildDefinitionError",
    "BuildFile",
    "BuildInterrupted",
    "ClusterFailure",
    "ConfinementError",
    "DependenceException",
    "FileNamespace",
    "KilnError",
    "NotRegularFile",
    "OutputDirLocked",
    "Params",
    "RemoteError",
    "StateError",
    "ToolError",
    "ToolMissing",
    "UnchangedFailure",
    "UsageError",
    "VerificationFailed",
    "WorkerCrashed",
    "argparse",
    "args",
    "benchmark",
    "cl_arg",
    "compile",
    "compile_actions",
    "console",
    "entrypoint",
    "executor",
    "fetch_http",
    "iree_build_main",
    "kiln_main",
    "lang",
    "load_build_module",
    "main",
    "metadata",
    "net_actions",
    "onnx_actions",
    "onnx_import",
    "requested_targets",
    "run_command",
    "source_file",
    "target_machine",
    "torch_export",
    "verify",
]
# Modules, as ``from iree.build import *`` gives them.
MODULES = {
    "argparse",
    "args",
    "compile_actions",
    "console",
    "executor",
    "lang",
    "main",
    "metadata",
    "net_actions",
    "onnx_actions",
    "target_machine",
}

# Imported on first use; their modules may be missing in a partial install.
LAZY = {
    "benchmark",
    "compile",
    "fetch_http",
    "onnx_import",
    "requested_targets",
    "verify",
} | MODULES

EXECUTOR_ALL = [
    "ActionConcurrency",
    "BuildAction",
    "BuildContext",
    "BuildDependency",
    "BuildEntrypoint",
    "BuildFile",
    "BuildFileLike",
    "BuildFileMetadata",
    "BuildMeta",
    "ClArg",
    "DependenceException",
    "Entrypoint",
    "Executor",
    "FileNamespace",
    "ProgressReporter",
    "join_namespace",
]
# Not classes: type aliases and a function that build modules import from iree.build.executor.
EXECUTOR_NON_CLASSES = {"BuildFileLike", "BuildFileMetadata", "join_namespace"}


def test_kiln_all_is_pinned() -> None:
    assert sorted(kiln.__all__) == KILN_ALL
    assert len(kiln.__all__) == len(set(kiln.__all__))


def test_eager_public_names_are_callables() -> None:
    for name in sorted(set(KILN_ALL) - LAZY - MODULES):
        member = getattr(kiln, name)
        assert callable(member), name
        assert not name.startswith("_")


def test_own_action_names_are_kiln_s_executor_classes() -> None:
    # A build module writes its own actions with ``from kiln import *`` alone.
    for name in ("ActionConcurrency", "BuildAction", "BuildContext", "BuildFile", "FileNamespace"):
        assert getattr(kiln, name) is getattr(kiln.executor, name)


def test_dir_shows_the_public_names_not_the_module_s_own_imports() -> None:
    names = dir(kiln)
    for public in ("compile", "verify", "build", "BuildAction", "entrypoint", "__version__"):
        assert public in names
    for private in ("Any", "annotations", "redact"):
        assert private not in names


def test_build_is_a_python_api_not_a_build_module_name() -> None:
    # ``from kiln import *`` must not bind ``build`` in users' modules (many have one).
    assert "build" not in kiln.__all__
    assert callable(kiln.build)


def test_iree_build_main_is_kiln_main() -> None:
    assert kiln.iree_build_main is kiln.kiln_main


def test_lazy_names_are_not_imported_eagerly() -> None:
    # ``import kiln`` stays light: the ML actions' modules load on first use.
    code = (
        "import sys, kiln\n"
        "print(sorted(m for m in sys.modules if m in "
        "('kiln.actions.net', 'kiln.actions.onnx', 'kiln.actions.iree',"
        " 'kiln.actions.verify', 'kiln.actions.bench', 'rich')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_unknown_attribute_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no_such_member"):
        kiln.no_such_member  # noqa: B018


def test_executor_exports_are_pinned() -> None:
    assert sorted(kiln.executor.__all__) == EXECUTOR_ALL
    for name in sorted(set(EXECUTOR_ALL) - EXECUTOR_NON_CLASSES):
        assert inspect.isclass(getattr(kiln.executor, name)), name


def test_executor_aliases_mean_what_iree_build_means() -> None:
    ex = kiln.executor
    assert isinstance("a/path.txt", ex.BuildFileLike)
    assert not isinstance(3, ex.BuildFileLike)
    assert ex.join_namespace("", "x") == "x"
    assert ex.join_namespace("ctx", "x") == "ctx/x"


def test_test_actions_exports() -> None:
    import kiln.actions.thunks

    assert kiln.actions.thunks.__all__ == ["ExecuteOutOfProcessThunkAction"]
    assert issubclass(kiln.actions.thunks.ExecuteOutOfProcessThunkAction, kiln.executor.BuildAction)


def test_executor_class_relations() -> None:
    ex = kiln.executor
    for cls in (ex.BuildAction, ex.BuildContext, ex.BuildFile):
        assert issubclass(cls, ex.BuildDependency)
    assert issubclass(ex.BuildEntrypoint, ex.BuildContext)
    assert issubclass(ex.DependenceException, Exception)
    assert {m.name for m in ex.FileNamespace} == {"GEN", "PARAMS", "BIN", "PLATFORM_BIN"}
    assert {m.name for m in ex.ActionConcurrency} == {"THREAD", "PROCESS", "NONE"}


def test_star_import_of_executor_gives_exactly_its_exports() -> None:
    namespace: dict[str, object] = {}
    exec("from kiln.executor import *", namespace)
    assert sorted(k for k in namespace if k != "__builtins__") == EXECUTOR_ALL


ERRORS = {
    "ActionFailed",
    "ActionTimeout",
    "BuildDefinitionError",
    "BuildInterrupted",
    "ClusterFailure",
    "ConfinementError",
    "DependenceException",
    "KilnError",
    "NotRegularFile",
    "OutputDirLocked",
    "RemoteError",
    "StateError",
    "ToolError",
    "ToolMissing",
    "UnchangedFailure",
    "UsageError",
    "VerificationFailed",
    "WorkerCrashed",
}
# The exit status the command line gives for each public error.
EXIT_CODES = {
    "ActionFailed": 1,
    "ActionTimeout": 1,
    "ClusterFailure": 1,
    "ConfinementError": 1,
    "DependenceException": 1,
    "KilnError": 1,
    "NotRegularFile": 1,
    "RemoteError": 1,
    "ToolError": 1,
    "ToolMissing": 1,
    "UnchangedFailure": 1,
    "VerificationFailed": 1,
    "WorkerCrashed": 1,
    "BuildDefinitionError": 2,
    "OutputDirLocked": 2,
    "StateError": 2,
    "UsageError": 2,
}


def test_every_public_error_is_exported_from_kiln_and_lives_in_errors() -> None:
    import kiln.base.errors

    for name in ERRORS:
        cls = getattr(kiln, name)
        assert cls is getattr(kiln.base.errors, name)
        assert cls.__module__ == "kiln.base.errors", name
        assert name in kiln.base.errors.__doc__, f"{name} is not drawn in the errors tree"


def test_each_error_carries_its_exit_code() -> None:
    for name, code in EXIT_CODES.items():
        assert getattr(kiln, name).exit_code == code, name
    assert kiln.BuildInterrupted(15).exit_code == 143
    assert kiln.BuildInterrupted(2).exit_code == 130


def test_no_exception_class_is_defined_outside_errors() -> None:
    # Private control-flow signals (a cache miss, a retryable download) stay where
    # they are used; every exception kiln shows a user lives in kiln.base.errors.
    import pathlib
    import re

    src = pathlib.Path(kiln.__file__).parent
    pattern = re.compile(
        r"^class (\w+)\((?:\w+\.)?\w*(?:Error|Exception|Failed|Interrupt)\w*\)", re.M
    )
    found = {
        f"{path.relative_to(src)}:{name}"
        for path in src.rglob("*.py")
        if path.name != "errors.py"
        for name in pattern.findall(path.read_text())
        if not name.startswith("_")
    }
    assert found == set()


def _star(module: str, shim: bool = False) -> dict[str, str]:
    """``from MODULE import *`` in a fresh interpreter: each name and the kind of its
    value (``module``, ``function``, ``type``...); with ``shim``, while kiln's
    iree.build shim is active."""
    body = f"from {module} import *"
    if shim:
        body = f"from kiln.base.iree_shim import activated\nwith activated(True):\n    {body}"
    code = (
        f"{body}\n"
        "print('\\n'.join(sorted(f'{k} {type(v).__name__}' for k, v in dict(globals()).items()"
        " if not k.startswith('__') and k != 'activated')))"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return dict(line.split() for line in proc.stdout.splitlines())


def test_star_import_of_kiln_gives_what_iree_builds_gives() -> None:
    needs.module("iree.build")
    upstream = _star("iree.build")
    ours = _star("kiln")
    assert upstream, "iree.build's star import gave nothing"
    assert {name: ours.get(name) for name in upstream} == upstream
    assert {n for n, kind in upstream.items() if kind == "module"} == MODULES


def test_star_import_of_iree_build_under_the_shim_gives_the_same_names() -> None:
    needs.module("iree.build")
    assert _star("iree.build", shim=True) == _star("iree.build")
