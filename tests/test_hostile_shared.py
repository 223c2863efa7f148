"""The command line around the shared surfaces (docs/reliability.md, "Trust model"):
kiln resolves the paths it owns before the build module runs and takes the output
directory's lock before it opens any of them; a FIFO named by an option never
blocks; threads left by a build module do not keep kiln from exiting; odd module
names end with a message; ``verify`` refuses tolerances and references that could
not check anything. Each through the CLI, in a process of its own where a hang or
a leaked thread would show."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import needs
import pytest

Kiln = Callable[..., Any]

SLOW = """
import sys, time
@entrypoint
def slow():
    code = "import time, sys; time.sleep(3); open(sys.argv[1], 'w').write('s')"
    return run_command(name="s.txt", command=[sys.executable, "-c", code, "{out}"])
"""


def test_a_module_that_changes_directory_moves_none_of_kilns_paths(
    tmp_path: Path, write_module: Callable[..., Path], kiln_subprocess: Kiln
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    write_module(f"""
import os
os.chdir({str(elsewhere)!r})

@entrypoint
def e():
    return run_command(name="x.txt", command=["sh", "-c", "echo x > $0", "{{out}}"])
""")
    r = kiln_subprocess(
        "build",
        "build.py",
        "--output-dir",
        "out",
        "--events",
        "ev.jsonl",
        "--profile",
        "trace.json",
        "--cache-dir",
        "cache",
    )
    assert r.returncode == 0, r.stderr
    assert list(elsewhere.iterdir()) == []  # nothing landed where the module went
    for name in ("out/genfiles/e/x.txt", "ev.jsonl", "trace.json", "cache/.kiln/format"):
        assert (tmp_path / name).is_file(), name
    assert r.stdout.strip() == "out/genfiles/e/x.txt"  # under --output-dir as given
    assert kiln_subprocess("report", "--output-dir", "out").returncode == 0
    assert kiln_subprocess("clean", "--output-dir", "out").returncode == 0
    assert not (tmp_path / "out/genfiles").exists()


def test_a_second_build_truncates_none_of_the_first_builds_files(
    tmp_path: Path, write_module: Callable[..., Path], kiln_subprocess: Kiln
) -> None:
    write_module(SLOW)
    env = {**os.environ, "NO_COLOR": "1"}
    first = subprocess.Popen(
        [sys.executable, "-m", "kiln", "build", "build.py", "--events", "ev.jsonl"],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    events = tmp_path / "ev.jsonl"
    deadline = time.monotonic() + 30
    while b'"started"' not in (events.read_bytes() if events.exists() else b""):
        assert time.monotonic() < deadline and first.poll() is None
        time.sleep(0.05)
    second = kiln_subprocess("build", "build.py", "--events", "ev.jsonl", "--no-wait")
    assert second.returncode == 2 and "pid" in second.stderr, second.stderr
    _, err = first.communicate(timeout=60)
    assert first.returncode == 0, err
    data = events.read_bytes()
    assert b"\0" not in data  # no hole where the second build truncated it
    kinds = [json.loads(line)["event"] for line in data.splitlines()]
    assert kinds[0] == "build_started" and kinds[-1] == "build_finished"


def test_a_fifo_named_by_an_option_never_blocks(
    tmp_path: Path, write_module: Callable[..., Path], kiln_subprocess: Kiln
) -> None:
    write_module(SLOW.replace("time.sleep(3)", "time.sleep(0)"))
    os.mkfifo(tmp_path / "ev.fifo")
    started = time.monotonic()
    r = kiln_subprocess("build", "build.py", "--events", "ev.fifo", timeout=60)
    assert r.returncode == 2 and "is a FIFO: kiln writes only a regular file" in r.stderr, r.stderr
    assert "--events" in r.stderr and "Traceback" not in r.stderr
    assert time.monotonic() - started < 30
    assert not (tmp_path / "kiln-out/genfiles").exists()


def test_threads_left_by_the_build_module_do_not_keep_kiln_running(
    tmp_path: Path, write_module: Callable[..., Path], kiln_subprocess: Kiln
) -> None:
    write_module("""
import threading, time
threading.Thread(target=time.sleep, args=(600,), name="poller").start()

@entrypoint
def e():
    threading.Thread(target=time.sleep, args=(600,), name="uploader").start()
    return run_command(name="x.txt", command=["sh", "-c", "echo x > $0", "{out}"])
""")
    started = time.monotonic()
    r = kiln_subprocess("build", "build.py", timeout=60)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - started < 30
    assert r.stdout.strip().endswith("e/x.txt")
    assert "2 thread(s)" in r.stderr and "poller" in r.stderr and "uploader" in r.stderr


@pytest.mark.parametrize(
    "name, expected",
    [
        (".relative", "not a module name"),
        ("..up.mod", "not a module name"),
        ("a..b", "not a module name"),
        ("pkg.", "not a module name"),
        ("pkg-x", "not a module name"),
        ("nosuch.mod", "not found on the Python path"),
        ("broken.mod", "broken/__init__.py:1"),
    ],
)
def test_odd_module_names_are_messages(
    name: str, expected: str, tmp_path: Path, kiln_subprocess: Kiln
) -> None:
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "__init__.py").write_text("raise RuntimeError('broken package')\n")
    path = os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])
    r = kiln_subprocess("build", "-m", name, env={"PYTHONPATH": path})
    assert r.returncode == 2 and expected in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


PROCESS_MODULE = """
import functools, sys
from kiln import *
from kiln.executor import *


def write(path):
    open(path, "w").write("from a process")


class Proc(BuildAction):
    def __init__(self, out, **kw):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kw)
        self.out = out
        out.deps.add(self)

    def _remotable_thunk(self):
        return functools.partial(write, str(self.out.get_fs_path()))


@entrypoint
def e():
    ctx = BuildContext.current()
    out = ctx.allocate_file("p.txt")
    Proc(out, desc="a process action", executor=ctx.executor)
    cmd = run_command(name="c.txt", command=[sys.executable, "-c",
                      "import sys; open(sys.argv[1], 'w').write('c')", "{out}"])
    return [out, cmd]
"""


def test_a_build_module_named_kiln_does_not_stand_in_for_kiln(
    tmp_path: Path, kiln_subprocess: Kiln
) -> None:
    (tmp_path / "proj").mkdir()
    (tmp_path / "proj" / "kiln.py").write_text(PROCESS_MODULE)
    r = kiln_subprocess("build", "proj/kiln.py")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert (tmp_path / "kiln-out/genfiles/e/p.txt").read_text() == "from a process"
    assert (tmp_path / "kiln-out/genfiles/e/c.txt").read_text() == "c"


# -- verify ---------------------------------------------------------------------------

np = needs.module("numpy")


@pytest.mark.parametrize(
    "arguments, expected",
    [
        ("rtol=float('nan'), atol=float('nan')", "rtol must be a finite number >= 0, got nan"),
        ("atol=float('inf')", "atol must be a finite number >= 0, got inf"),
        ("rtol=-1e-3", "rtol must be a finite number >= 0, got -0.001"),
        ("rtol='1e-3'", "rtol must be a number"),
        ("tolerances={'float32': (float('nan'), 0)}", "tolerances['float32'] must be a finite"),
        ("tolerances={'f32': (1e-3, 1e-3)}", "unknown dtype 'f32'; known: float64, float32"),
        ("tolerances={'float32': 1e-3}", "must be (rtol, atol)"),
        ("tolerances={'float32': (1e-3,)}", "must be (rtol, atol)"),
    ],
)
def test_tolerances_that_check_nothing_are_definition_errors(
    arguments: str,
    expected: str,
    write_module: Callable[..., Path],
    kiln_in_process: Kiln,
    tmp_path: Path,
) -> None:
    (tmp_path / "m.vmfb").write_bytes(b"not built: nothing runs")
    (tmp_path / "x.npy").write_bytes(b"")
    write_module(f"""
@entrypoint
def check():
    return verify(name="v.json", module=source_file("m.vmfb"), inputs=[source_file("x.npy")],
                  expected=[source_file("x.npy", name="y.npy")], {arguments})
""")
    r = kiln_in_process("build", "build.py")
    assert r.returncode == 2 and "verify of" in r.stderr and expected in r.stderr, r.stderr
    assert not (tmp_path / "kiln-out/genfiles/check/v.json").exists()


def test_comparisons_name_nan_inf_and_dtypes_of_another_kind() -> None:
    from kiln.actions import _tensors

    f32 = np.array([1.0, 2.0, 3.0], np.float32)
    for reference in (np.array([True, True, False]), np.array([1, 2, 3], np.int32)):
        record = _tensors.compare(0, f32, reference, {})
        assert not record["passed"]
        line = _tensors.describe(record)
        assert "float32" in line and str(reference.dtype) in line, line
    got = np.array([np.nan, np.inf, 3.0], np.float32)
    record = _tensors.compare(0, got, f32, {})
    assert not record["passed"] and record["nan"] == 1 and record["inf"] == 1
    assert record["nonfinite_mismatches"] == 2
    line = _tensors.describe(record)
    assert "NaN" in line and "inf" in line and "max abs err 0" not in line, line
    same = _tensors.compare_all([got], [got.copy()], {})
    assert same["passed"] and "1 NaN, 1 inf, as the reference does" in same["summary"]
    with pytest.raises(Exception, match="not a finite number"):
        _tensors.compare(0, f32, f32, {"*": (float("nan"), 0.0)})


@pytest.mark.parametrize("case", ["bool reference", "int32 reference", "nan output"])
def test_verify_fails_a_check_that_could_not_compare(
    case: str, write_module: Callable[..., Path], kiln_in_process: Kiln, tmp_path: Path
) -> None:
    onnx = needs.module("onnx")
    needs.module("iree.runtime")
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Log", ["x"], ["y"])],
        "log",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, tmp_path / "log.onnx")
    # Outputs equal, as numbers, to a reference of another kind: only its dtype is wrong.
    e = float(np.e)
    x, expected = {
        "bool reference": ([1.0, e, e], np.array([False, True, True])),
        "int32 reference": ([1.0, e, e * e], np.array([0, 1, 2], np.int32)),
        "nan output": ([1.0, -1.0, 2.0], np.array([0.0, 0.0, np.log(2.0)], np.float32)),
    }[case]
    np.save(tmp_path / "x.npy", np.array(x, np.float32))
    np.save(tmp_path / "y.npy", expected)
    write_module("""
@entrypoint
def check():
    mlir = onnx_import(name="log.mlir", source=source_file("log.onnx"))
    (m,) = compile(name="log", source=mlir, targets=["vmvx"])
    return verify(name="v.json", module=m, inputs=[source_file("x.npy")],
                  expected=[source_file("y.npy")])
""")
    r = kiln_in_process("build", "build.py")
    assert r.returncode == 1, r.stderr
    if case == "nan output":
        assert "NaN or inf where the reference differs" in r.stderr, r.stderr
        assert "1 NaN" in r.stderr
    else:
        assert f"the output is float32, the reference {expected.dtype}" in r.stderr, r.stderr
