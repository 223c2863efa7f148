"""A ``torch_export`` model factory that reads a checkpoint it was not given in
``weights=``: the file is recorded with the weights' digest and the export, a new
checkpoint there reruns both (``kiln explain`` names it), and nothing built from
it comes from the cache; a factory called where nothing records what it reads
fails naming the file. Needs the torch extra, as ``tests/test_torch_export.py``."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
from test_torch_export import NET, _build, _events, _kind, _save_checkpoint, _sha

pytestmark = pytest.mark.slow

HIDDEN = (
    NET
    + """
import os

CHECKPOINT = os.path.abspath("ckpt.pt")


def hidden():
    import torch

    net = make_net()
    with open(CHECKPOINT, "rb") as f:
        net.load_state_dict(torch.load(f))
    return net


@entrypoint
def net():
    return torch_export(name="net.mlir", model=hidden, args=[((2, 16), "float32")], params=True)
"""
)


def test_a_checkpoint_the_factory_was_not_given_is_recorded_and_checked(
    kiln: Any, write_module: Any, tmp_path: Path
) -> None:
    _save_checkpoint(tmp_path / "ckpt.pt", 1)
    write_module(HIDDEN)
    result, events = _build(kiln, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    archive = tmp_path / "kiln-out/params/net/net.irpa"
    first = _sha(archive)
    result, events = _build(kiln, tmp_path)
    assert _kind(events, "Digesting") == ["up_to_date"]
    assert _kind(events, "Exporting PyTorch") == ["up_to_date"]

    _save_checkpoint(tmp_path / "ckpt.pt", 2)
    explained = kiln("explain", "build.py", "--target", "cpu")
    assert "ckpt.pt, which it read while it ran, changed" in explained.stdout, (
        explained.stdout + explained.stderr
    )
    result, events = _build(kiln, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _kind(events, "Digesting") == ["finished"]
    assert _kind(events, "Exporting PyTorch") == ["finished"]
    second = _sha(archive)
    assert second != first

    # Another output directory, with the cache on: the new weights, never the cache's.
    _save_checkpoint(tmp_path / "ckpt.pt", 1)
    result = kiln("build", "build.py", "--output-dir", "other")
    assert result.returncode == 0, result.stdout + result.stderr
    assert _sha(tmp_path / "other/params/net/net.irpa") == first
    _save_checkpoint(tmp_path / "ckpt.pt", 2)
    result = kiln("build", "build.py", "--output-dir", "third")
    assert result.returncode == 0, result.stdout + result.stderr
    assert _sha(tmp_path / "third/params/net/net.irpa") == second


def test_a_factory_outside_a_recorded_run_fails_naming_the_file(tmp_path: Path) -> None:
    """Called where nothing records what it reads (not in kiln's worker), a factory
    that reads a file it was not given fails, naming it and what to declare."""
    _save_checkpoint(tmp_path / "ckpt.pt", 1)
    checkpoint = str(tmp_path / "ckpt.pt")
    code = NET + textwrap.dedent(
        f"""
        def hidden():
            import torch

            net = make_net()
            net.load_state_dict(torch.load({checkpoint!r}))
            return net

        from kiln.actions._torch_worker import make_model
        from kiln.base.errors import ToolError

        make_model(make_net, [{checkpoint!r}])  # given: fine
        try:
            make_model(hidden, [])
        except ToolError as e:
            print("refused:", e)
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"refused: the model factory hidden read {tmp_path / 'ckpt.pt'}" in proc.stdout
    assert "weights=[...]" in proc.stdout


def test_a_spec_factorys_own_package_is_keyed_not_recorded(
    kiln: Any, write_module: Any, tmp_path: Path
) -> None:
    """A ``"package.module:factory"`` spec's module, digested into the key, is not a
    run-time dependency: its export is still shared through the cache. A project
    module the factory imports at run time besides is recorded."""
    (tmp_path / "mynets.py").write_text(NET)
    write_module(
        """
@entrypoint
def net():
    return torch_export(name="net.mlir", model="mynets:make_net", args=[((2, 16), "float32")])
"""
    )
    events = tmp_path / "events.jsonl"
    result = kiln("build", "build.py")
    assert result.returncode == 0, result.stdout + result.stderr
    result = kiln("build", "build.py", "--output-dir", "other", "--events", str(events))
    assert result.returncode == 0, result.stdout + result.stderr
    assert _kind(_events(events), "Exporting PyTorch") == ["cached"]

    (tmp_path / "mynets.py").write_text(NET.replace("import torch\n", "import torch, widths\n"))
    (tmp_path / "widths.py").write_text("HIDDEN = 32\n")
    result = kiln("build", "build.py")
    assert result.returncode == 0, result.stdout + result.stderr
    (tmp_path / "widths.py").write_text("HIDDEN = 32  # the same\n")
    explained = kiln("explain", "build.py")
    assert "widths.py, which it imported while it ran, changed" in explained.stdout, (
        explained.stdout
    )
    assert "mynets.py" not in explained.stdout
