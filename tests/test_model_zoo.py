"""The README's main job, examples/model_zoo.py, on a few of its models."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
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

    # On a terminal: a table that fits its width, every result whole (a narrow one
    # cuts model names, never a latency or a mark); one too narrow gets the plain rows.
    for columns in (100, 80):
        shown = _table_on_tty(tmp_path / "out", columns)
        lines = shown.splitlines()
        table = lines[: next(i for i, line in enumerate(lines) if "ok (of 2)" in line) + 1]
        assert max(len(line.rstrip()) for line in table) <= columns, shown
        ok_row = next(line for line in lines if "AvgPool1d" in line).split()
        assert ok_row[1:5] == ["ok", "ok/ok", "ok/ok", "ok/ok"], shown
        assert re.fullmatch(r"[\d.]+(us|ms|s)/[\d.]+(us|ms|s)", ok_row[5]), shown
        bad_row = next(line for line in lines if "sequence_mo" in line).split()
        assert bad_row[3:5] == ["FAIL/FAIL", "FAIL/FAIL"], shown
    narrow = _table_on_tty(tmp_path / "out", 50)
    assert narrow.splitlines()[0].startswith("model\timport\tcompile cpu"), narrow


def _table_on_tty(out: Path, columns: int) -> str:
    """What the zoo's table prints on a terminal ``columns`` wide (escapes removed)."""
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    code = "import sys, pathlib, model_zoo; model_zoo.print_table(pathlib.Path(sys.argv[1]))"
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "NO_COLOR")}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(out)],
        cwd=ROOT / "examples",
        stdout=slave,
        stderr=subprocess.PIPE,
        env={**env, "TERM": "xterm-256color"},
    )
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 65536)
        except OSError:  # EIO: the child's side is closed
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=60) == 0, proc.stderr.read() if proc.stderr else ""
    text = b"".join(chunks).decode(errors="replace").replace("\r\n", "\n")
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", text)
