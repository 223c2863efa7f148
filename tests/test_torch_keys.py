"""How ``torch_export`` keys its model factory, without torch: a
``"package.module:factory"`` spec by the source of the code that holds it, found
on ``sys.path`` without importing it, once per declaration."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kiln.actions import torch_export as te
from kiln.base.errors import BuildDefinitionError
from kiln.planning.code_key import package_version

FACTORY = "def make():\n    return None\n"


pytestmark = pytest.mark.in_process


def test_a_namespace_package_is_keyed_by_the_code_below_it_that_holds_the_spec(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "ns" has no __init__.py: it may be a whole checkout. Only ns/sub/nets (a
    # regular package, through the namespace ns/sub) holds the spec's module.
    nets = tmp_path / "ns" / "sub" / "nets"
    nets.mkdir(parents=True)
    (nets / "__init__.py").write_text("")
    (nets / "mod.py").write_text(FACTORY)
    (tmp_path / "ns" / "elsewhere.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    spec = "ns.sub.nets.mod:make"
    before = te.factory_key(spec)
    (tmp_path / "ns" / "elsewhere.py").write_text("X = 2\n")
    (tmp_path / "ns" / "sub" / "other.py").write_text("Y = 1\n")
    assert te.factory_key(spec) == before
    (nets / "mod.py").write_text(FACTORY.replace("None", "1"))
    edited = te.factory_key(spec)
    assert edited != before
    (nets / "helper.py").write_text("Z = 1\n")  # beside the module, in its package
    assert te.factory_key(spec) != edited


def test_a_namespace_package_as_the_spec_module_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ns" / "sub").mkdir(parents=True)
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(BuildDefinitionError, match="ns.sub is a namespace package"):
        te.factory_key("ns.sub:make")


def test_the_factory_is_keyed_once_per_declaration(
    kiln, write_module, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mynets.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(tmp_path))
    calls: list[object] = []
    real = te.factory_key
    monkeypatch.setattr(te, "factory_key", lambda f: calls.append(f) or real(f))
    write_module(
        """
        @entrypoint
        def net():
            return torch_export(name="net.mlir", model="mynets:make", args=[((2,), "float32")])
        """
    )
    result = kiln("build", "build.py", "--dry-run")
    assert result.returncode == 0, result.stdout + result.stderr
    assert calls == ["mynets:make"]


def test_user_code_is_told_from_installed_code_by_kilns_rule_not_the_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A checkout under a folder named site-packages is still the user's code.
    where = tmp_path / "site-packages"
    (where / "mynets").mkdir(parents=True)
    (where / "mynets" / "__init__.py").write_text(FACTORY)
    monkeypatch.syspath_prepend(str(where))
    before = te.factory_key("mynets:make")
    assert "source" in before
    (where / "mynets" / "__init__.py").write_text(FACTORY.replace("None", "1"))
    assert te.factory_key("mynets:make") != before
    installed = te.factory_key("numpy:zeros")
    assert installed == {"spec": "numpy:zeros", "installed": package_version("numpy")}


def test_a_fifo_in_the_factorys_package_is_a_definition_error_not_a_hang(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "mynets").mkdir()
    (tmp_path / "mynets" / "__init__.py").write_text(FACTORY)
    os.mkfifo(tmp_path / "mynets" / "pipe.py")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(BuildDefinitionError, match="cannot read its source.*pipe.py.*FIFO"):
        te.factory_key("mynets:make")


@pytest.mark.parametrize("spec", ["no_such_nets:make", "ns.no_such:make"])
def test_a_spec_that_cannot_be_found_is_a_definition_error(
    kiln, write_module, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, spec: str
) -> None:
    (tmp_path / "ns").mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    write_module(
        f"""
        @entrypoint
        def net():
            return torch_export(name="net.mlir", model={spec!r}, args=[((2,), "float32")])
        """
    )
    result = kiln("build", "build.py", "--dry-run")
    assert result.returncode == 2, result.stdout + result.stderr
    module = spec.split(":")[0]
    assert f"model {spec!r}: no module {module} on sys.path [" in result.stderr
    assert repr(str(tmp_path)) in result.stderr
