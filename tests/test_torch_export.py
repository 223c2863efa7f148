"""``torch_export`` through the CLI, on small real PyTorch modules: exported by
iree-turbine in a worker, compiled, checked against eager PyTorch, benchmarked; new
weights rerun the export (and, with params, only the archive changes); kiln's own
process never imports torch. These tests need the ``torch`` extra, which
``scripts/test`` installs: in CI (``CI`` set) they fail without it, never skip."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import needs
import pytest

pytestmark = pytest.mark.slow


needs.installed("torch", "iree.turbine")  # the torch extra; found, not imported

NET = """
def make_net(*checkpoints):
    import torch

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.l1 = torch.nn.Linear(16, 32)
            self.bn = torch.nn.BatchNorm1d(32)
            self.l2 = torch.nn.Linear(32, 4)

        def forward(self, x):
            return self.l2(torch.relu(self.bn(self.l1(x))))

    net = Net()
    for path in checkpoints:
        net.load_state_dict(torch.load(path))
    return net
"""

BUILD = (
    NET
    + """
@entrypoint
def net():
    mlir = torch_export(name="net.mlir", model=MODEL, args=[((2, 16), "float32")],
                        params=True, weights=WEIGHTS)
    (vmfb,) = compile(name="net", source=mlir)
    return [
        vmfb,
        verify(name="net.verify.json", module=vmfb, reference="torch"),
        benchmark(name="net.bench.json", module=vmfb, repetitions=1, min_time_s=0.001),
    ]
"""
)


def _events(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        event = json.loads(line)
        if event["event"] in ("up_to_date", "cached", "finished", "failed", "not_run"):
            out[event["desc"]] = event["event"]
    return out


def _kind(events: dict[str, str], prefix: str) -> list[str]:
    return [what for desc, what in events.items() if desc.startswith(prefix)]


def _build(kiln, tmp_path: Path, *extra: str):  # type: ignore[no-untyped-def]
    events = tmp_path / "events.jsonl"
    result = kiln(
        "build", "build.py", "--target", "cpu", "--no-cache", "--events", str(events), *extra
    )
    return result, _events(events) if events.exists() else {}


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _save_checkpoint(path: Path, seed: int) -> None:
    """A state dict for NET with other weights (seeded), as a fine-tune would give."""
    code = NET + textwrap.dedent(
        f"""
        import torch
        torch.manual_seed({seed})
        net = make_net()
        for p in net.parameters():
            torch.nn.init.normal_(p, std=0.2)
        torch.save(net.state_dict(), {str(path)!r})
        """
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_export_verify_against_torch_and_new_weights(kiln, write_module, tmp_path: Path) -> None:
    _save_checkpoint(tmp_path / "ckpt.pt", 1)
    write_module(BUILD.replace("MODEL", "make_net").replace("WEIGHTS", '[source_file("ckpt.pt")]'))
    result, events = _build(kiln, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    out = tmp_path / "kiln-out"
    mlir, archive = out / "genfiles/net/net.mlir", out / "params/net/net.irpa"
    assert '#flow.parameter.named<"model"::"l1.weight">' in mlir.read_text()
    check = json.loads((out / "genfiles/net/net.verify.json").read_text())
    assert check["passed"] is True
    assert check["references"]["torch"]["outputs"][0]["max_abs_err"] < 1e-4
    assert json.loads((out / "genfiles/net/net.bench.json").read_text())["status"] == "measured"
    manifest = json.loads((out / "manifest.json").read_text())
    module = manifest["entrypoints"]["net"]["outputs"][0]
    assert module["parameters"][0]["sha256"] == _sha(archive)
    first_mlir, first_archive = _sha(mlir), _sha(archive)

    _save_checkpoint(tmp_path / "ckpt.pt", 2)  # a new checkpoint of the same architecture
    result, events = _build(kiln, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert _kind(events, "Digesting") == ["finished"]
    assert _kind(events, "Exporting PyTorch") == ["finished"]
    assert _kind(events, "Compiling") == ["up_to_date"]  # the program is the same
    assert _kind(events, "Verifying") == ["finished"]
    assert _sha(mlir) == first_mlir and _sha(archive) != first_archive
    check = json.loads((out / "genfiles/net/net.verify.json").read_text())
    assert check["passed"] is True  # against the new weights, loaded from the new archive


def test_a_no_op_build_neither_runs_nor_imports_torch_and_bytes_do_not_move(
    kiln, write_module, tmp_path: Path
) -> None:
    write_module(BUILD.replace("MODEL", "make_net").replace("WEIGHTS", "()"))
    result, _ = _build(kiln, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    code = (
        "import sys\nfrom kiln.cli.main import main\n"
        "try:\n    code = main(['build', 'build.py', '--target', 'cpu', '--no-cache'])\n"
        "except SystemExit as e:\n    code = e.code\n"
        "print('exit', code)\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120
    )
    assert "exit 0" in proc.stdout, proc.stdout + proc.stderr
    assert "torch imported: False" in proc.stdout
    assert "0 built, 6 up to date" in proc.stdout + proc.stderr
    # Same key, same bytes: another output directory exports the same program and archive
    # (the export alone: the compile and the checks have nothing to say about them).
    result, events = _build(kiln, tmp_path, "--output-dir", "other", "net/net.mlir")
    assert result.returncode == 0, result.stdout + result.stderr
    assert _kind(events, "Exporting PyTorch") == ["finished"]
    assert _kind(events, "Compiling") == [] and _kind(events, "Verifying") == []
    for path in ("genfiles/net/net.mlir", "params/net/net.irpa", "genfiles/net/net.weights.json"):
        assert _sha(tmp_path / "kiln-out" / path) == _sha(tmp_path / "other" / path)


def test_factory_spec_is_keyed_by_its_source_with_a_dynamic_batch(
    kiln, write_module, tmp_path: Path
) -> None:
    (tmp_path / "mynets.py").write_text(NET)
    dynamic = 'args=[((2, 16), "float32")], dynamic_shapes=[{0: "batch"}],'
    write_module(
        BUILD.replace("MODEL", '"mynets:make_net"')
        .replace("WEIGHTS", "()")
        .replace('args=[((2, 16), "float32")],', dynamic)
    )
    result, _ = _build(kiln, tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    (tmp_path / "mynets.py").write_text(NET.replace("Linear(32, 4)", "Linear(32, 5)"))
    result, events = _build(kiln, tmp_path, "net/net_cpu-host.vmfb")  # what the key moves
    assert result.returncode == 0, result.stdout + result.stderr
    assert _kind(events, "Exporting PyTorch") == ["finished"]
    assert _kind(events, "Compiling") == ["finished"]
    assert "!torch.vtensor<[?,5],f32>" in (tmp_path / "kiln-out/genfiles/net/net.mlir").read_text()


def test_a_factory_with_other_weights_on_every_call_fails(
    kiln, write_module, tmp_path: Path
) -> None:
    write_module(
        NET
        + """
def restless():
    import os, torch
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    return make_net()

@entrypoint
def net():
    return torch_export(name="net.mlir", model=restless, args=[((2, 16), "float32")])
"""
    )
    result, events = _build(kiln, tmp_path)
    assert result.returncode == 1
    assert _kind(events, "Exporting PyTorch") == ["failed"]
    assert "gave other weights than when kiln keyed them" in result.stdout + result.stderr


@pytest.mark.parametrize(
    ("call", "message"),
    [
        ('model="no_colon", args=[((1,), "float32")]', "model must be a callable"),
        ('model=make_net, args=[(1, "float32")]', "give each example input as (shape, dtype)"),
        ('model=make_net, args=[((1,), "complex7")]', "give each example input"),
        (
            'model=make_net, args=[((2, 16), "float32")], dynamic_shapes=[{0: 3}]',
            "dynamic_shapes entry",
        ),
    ],
)
def test_bad_arguments_are_definition_errors(
    kiln, write_module, tmp_path: Path, call: str, message: str
) -> None:
    write_module(
        NET
        + f"""
@entrypoint
def net():
    return torch_export(name="net.mlir", {call})
"""
    )
    result, _ = _build(kiln, tmp_path)
    assert result.returncode == 2
    assert message in result.stderr


TURBINE_MODULE = """
import torch
from iree.build import *
from iree.turbine.aot import ExportOutput, export
from iree.turbine.aot.build_actions import turbine_generate


class Small(torch.nn.Module):
    def forward(self, x):
        return torch.relu(x) * 2.0


def generate() -> ExportOutput:
    return export(Small(), args=(torch.zeros(3, 4),))


@entrypoint
def small():
    mlir = turbine_generate(generate, name="small")
    return compile(name="small", source=mlir[0])


if __name__ == "__main__":
    iree_build_main()
"""


def test_iree_turbine_build_actions_run_unchanged(kiln, tmp_path: Path) -> None:
    (tmp_path / "turbine_build.py").write_text(TURBINE_MODULE)
    result = kiln("build", "turbine_build.py", "--target", "cpu", "--no-cache")
    assert result.returncode == 0, result.stdout + result.stderr
    vmfb = tmp_path / "kiln-out/bin/small/small_cpu-host.vmfb"
    assert vmfb.stat().st_size > 0
    import numpy as np

    from kiln.actions._runtime import run_module

    _, (out,) = run_module(str(vmfb), [np.full((3, 4), -1.5, np.float32)])
    assert (out == 0).all()
