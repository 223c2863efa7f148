"""The README's main job, examples/model_zoo.py, on a few of its models."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import needs
import pytest

needs.module("onnx")
ROOT = Path(__file__).resolve().parents[1]
ZOO = ROOT / "examples" / "model_zoo.py"


def test_the_zoo_has_every_category(kiln):
    r = kiln("list", str(ZOO))
    assert r.returncode == 0, r.stderr
    names = [line.split()[0] for line in r.stdout.splitlines()]
    assert len(names) > 100
    for category in ("pytorch-converted__", "pytorch-operator__", "simple__"):
        assert any(n.startswith(category) for n in names)


def readme_line() -> str:
    """The README's command that runs the zoo on two models."""
    readme = (ROOT / "README.md").read_text().splitlines()
    (line,) = [ln for ln in readme if ln.startswith(".venv/bin/python examples/model_zoo.py ")]
    return line


@pytest.mark.slow
def test_the_readmes_two_models_through_every_stage(tmp_path: Path):
    # The README's line, as written, in a checkout laid out as the repository is
    # (its examples and venv linked), so that its kiln-out lands in tmp_path.
    model, wrong = "pytorch-converted__test_AvgPool1d", "simple__test_sequence_model8"
    line = readme_line()
    assert line.split()[2:] == [model, wrong]
    (tmp_path / "examples").symlink_to(ROOT / "examples")
    (tmp_path / ".venv").symlink_to(Path(sys.executable).parent.parent)
    proc = subprocess.run(
        ["bash", "-c", line], capture_output=True, text=True, cwd=tmp_path, timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    # The script's last line is its verdict, and agrees with its exit status; kiln's
    # stderr names each failed stage once, in its summary, with no details before.
    last = proc.stdout.splitlines()[-1]
    assert last.startswith("zoo: 2 models, 2 compiled for every target, 1 through every stage")
    assert "exit 0: failures are results (--strict exits 1 on them)" in last
    assert "ERROR: Building" not in proc.stderr
    assert proc.stderr.count("  * Verifying simple__test_sequence_model8/model_vmvx.vmfb") == 2
    (tmp_path / "out").symlink_to(tmp_path / "kiln-out")
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("model\t")  # the table, not the outputs' paths, comes first
    header = lines[0]
    assert header.split("\t")[1:] == [
        "import",
        "compile cpu",
        "compile vmvx",
        "verify cpu",
        "verify vmvx",
        "ort cpu",
        "ort vmvx",
        "bench cpu",
        "bench vmvx",
    ]
    row = next(line for line in lines if line.startswith(model)).split("\t")[1:]
    # A latency, as the zoo prints it (us, or ms when a loaded machine is slow).
    assert row[:7] == ["ok"] * 7 and all(re.fullmatch(r"[\d.]+(us|ms|s)", c) for c in row[7:])
    bad = next(line for line in lines if line.startswith(wrong)).split("\t")[1:]
    assert bad[3:7] == ["FAILED"] * 4  # wrong against the shipped outputs and onnxruntime
    assert "1 verified on every target" in proc.stdout
    assert "models: 2;" in proc.stdout  # models not asked for are left out of the table
    assert "IREE and onnxruntime disagree on 2 module(s):" in proc.stdout
    assert f"{wrong} (cpu): against onnxruntime: output 0 (len)" in proc.stdout
    manifest = json.loads((tmp_path / "out/manifest.json").read_text())
    outputs = manifest["entrypoints"][model]["outputs"]
    modules = [o for o in outputs if o.get("target")]
    assert [o["target"] for o in modules] == ["cpu-host", "vmvx"]
    for module in modules:
        shipped, ort = module["verification"]
        assert shipped["passed"] and set(shipped["references"]) == {"shipped"}
        assert ort["passed"] and set(ort["references"]) == {"onnxruntime"}
        (bench,) = module["benchmark"]
        assert bench["status"] == "measured" and bench["median"] > 0

    strict = subprocess.run(
        ["bash", "-c", f"{line} --strict"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=300,
    )
    assert strict.returncode == 1
    assert strict.stdout.splitlines()[-1].endswith("exit 1: --strict, and a stage failed")
