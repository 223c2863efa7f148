"""kiln.build: a build from Python returns its result and never exits."""

from __future__ import annotations

import io
import sys
import textwrap
from pathlib import Path

import pytest

import kiln
from kiln import BuildDefinitionError, UsageError

MODULE = """
from kiln import *


@entrypoint
def hello():
    return run_command(name="hello.txt", command=["sh", "-c", 'echo hello > "$0"', "{out}"])


@entrypoint
def broken():
    return run_command(name="broken.txt", command=["sh", "-c", "echo went wrong >&2; exit 3"])
"""


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "build.py").write_text(textwrap.dedent(MODULE))
    return tmp_path


def test_a_build_returns_its_result_and_prints_no_paths(project: Path, capsys) -> None:
    err = io.StringIO()
    result = kiln.build("build.py", targets=["hello"], output_dir=project / "out", stderr=err)
    assert result.ok
    assert [a.desc for a in result.built] == ["Running hello/hello.txt"]
    assert (project / "out/genfiles/hello/hello.txt").read_text() == "hello\n"
    assert "kiln: done: 1 built" in err.getvalue()
    assert capsys.readouterr().out == ""

    again = kiln.build(
        project / "build.py", targets=["hello"], output_dir=project / "out", stderr=io.StringIO()
    )
    assert again.ok and again.built == [] and len(again.skipped) == 1


def test_a_failed_action_is_in_the_result_not_an_exit(project: Path) -> None:
    result = kiln.build("build.py", targets=["broken"], output_dir="out", stderr=io.StringIO())
    assert not result.ok
    (failed,) = result.failed
    assert failed.desc == "Running broken/broken.txt"
    assert "went wrong" in str(result.errors[failed])


def test_definition_and_usage_errors_raise(project: Path) -> None:
    with pytest.raises(BuildDefinitionError, match="no_such_target"):
        kiln.build("build.py", targets=["no_such_target"], stderr=io.StringIO())
    with pytest.raises(UsageError, match="--jbos"):
        kiln.build("build.py", args=["--jbos", "2"], stderr=io.StringIO())
    assert not (project / "kiln-out").exists()


def test_a_module_object_or_a_module_name(project: Path, monkeypatch) -> None:
    (project / "zoo_pkg").mkdir()
    (project / "zoo_pkg/__init__.py").write_text("")
    (project / "zoo_pkg/models.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(project))
    by_name = kiln.build("zoo_pkg.models", targets=["hello"], output_dir="a", stderr=io.StringIO())
    assert by_name.ok and (project / "a/genfiles/hello/hello.txt").exists()

    import zoo_pkg.models

    by_object = kiln.build(zoo_pkg.models, targets=["hello"], output_dir="b", stderr=io.StringIO())
    assert by_object.ok and (project / "b/genfiles/hello/hello.txt").exists()
    sys.modules.pop("zoo_pkg.models", None)
    sys.modules.pop("zoo_pkg", None)


def test_an_edited_module_is_loaded_again(project: Path) -> None:
    assert kiln.build("build.py", targets=["hello"], stderr=io.StringIO()).ok
    (project / "build.py").write_text(textwrap.dedent(MODULE).replace("echo hello", "echo again"))
    result = kiln.build("build.py", targets=["hello"], stderr=io.StringIO())
    assert result.ok and len(result.built) == 1
    assert (project / "kiln-out/genfiles/hello/hello.txt").read_text() == "again\n"
