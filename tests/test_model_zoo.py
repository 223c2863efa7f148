"""The README's main job, examples/model_zoo.py, on a few of its models."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("onnx")
ZOO = Path(__file__).resolve().parents[1] / "examples" / "model_zoo.py"


def test_the_zoo_has_every_category(kiln):
    r = kiln("list", str(ZOO))
    assert r.returncode == 0, r.stderr
    names = [line.split()[0] for line in r.stdout.splitlines()]
    assert len(names) > 100
    for category in ("pytorch-converted__", "pytorch-operator__", "simple__"):
        assert any(n.startswith(category) for n in names)


def test_one_model_through_every_stage_with_the_table(tmp_path: Path):
    model = "pytorch-converted__test_AvgPool1d"
    proc = subprocess.run(
        [sys.executable, str(ZOO), model, "--output-dir", str(tmp_path / "out"), "-j", "2"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    row = next(line for line in proc.stdout.splitlines() if line.startswith(model))
    assert row.split("\t")[1:] == ["ok"] * 5
    assert "1 verified on every target" in proc.stdout
    manifest = json.loads((tmp_path / "out/manifest.json").read_text())
    outputs = manifest["entrypoints"][model]["outputs"]
    assert [o.get("target") for o in outputs if o.get("target")] == ["cpu", "vmvx"]
    assert all(v["passed"] for o in outputs for v in o.get("verification", []))
    assert "models: 1;" in proc.stdout  # models not asked for are left out of the table
