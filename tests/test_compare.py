"""kiln compare through the CLI, on real builds of small MLIR modules: a module that
did not change, one slowed (other flags, and a stand-in benchmark whose samples are
larger), one deliberately wrong (its verification fails), one renamed; damaged and
foreign manifests; --fail-if; --json; the history (@-1 @0)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import needs
import pytest

pytestmark = pytest.mark.in_process

np = needs.module("numpy")
needs.module("iree.runtime")

ADD = """func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = arith.addf %x, %x : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""
MUL = ADD.replace("arith.addf", "arith.mulf")
# Wrong: x + x + x where the reference says 2x.
WRONG = """func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {
  %0 = arith.addf %x, %x : tensor<4xf32>
  %1 = arith.addf %0, %x : tensor<4xf32>
  return %1 : tensor<4xf32>
}
"""

BUILD = """
import json
from kiln.manifest import ManifestMeta

DEVICE = "cpu:test@0123456789ab"


class StandInBench(BuildAction):
    \"\"\"A benchmark result with samples about 100 us times ``factor``.\"\"\"

    def __init__(self, output, factor, **kwargs):
        super().__init__(**kwargs)
        self.output, self.factor = output, factor

    def _invoke(self):
        samples = [100.0 * self.factor * (1 + 0.003 * ((i * 7) % 10)) for i in range(10)]
        self.output.get_fs_path().write_text(json.dumps({
            "status": "measured", "device_id": DEVICE, "time_unit": "us",
            "samples": samples, "median": sorted(samples)[5]}))


def timed(module, name, factor):
    context = BuildContext.current()
    out = context.allocate_file(name)
    action = StandInBench(out, factor, desc=f"Timing {name}", executor=context.executor)
    action.deps.add(module)
    out.deps.add(action)
    ManifestMeta.get(module).benchmarks.append((action, out))
    ManifestMeta.get(out).result_of = ("benchmark", action)
    return out


@entrypoint
def zoo(after=cl_arg("after", default="0", help="1: the build after")):
    b = after == "1"
    x, y = source_file("x.npy"), source_file("y.npy")
    out = []
    (same,) = compile(name="same", source=source_file("add.mlir"), targets=["vmvx"])
    out += [same, timed(same, "same.json", 1.0)]
    flags = ["--iree-vm-emit-polyglot-zip=false"] if b else []
    (slow,) = compile(name="slowed", source=source_file("mul.mlir"), targets=["vmvx"],
                      flags=flags)
    out += [slow, timed(slow, "slowed.json", 1.3 if b else 1.0)]
    (wrong,) = compile(name="wrong", source=source_file("wrong.mlir" if b else "add.mlir"),
                       targets=["vmvx"])
    out += [wrong, verify(name="wrong_check.json", module=wrong, inputs=[x], expected=[y])]
    (moved,) = compile(name="moved_b" if b else "moved_a", source=source_file("add.mlir"),
                       targets=["vmvx"])
    out.append(moved)
    return out
"""


@pytest.fixture
def project(tmp_path: Path, write_module: Any) -> Path:
    (tmp_path / "add.mlir").write_text(ADD)
    (tmp_path / "mul.mlir").write_text(MUL)
    (tmp_path / "wrong.mlir").write_text(WRONG)
    x = np.arange(4, dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", 2 * x)
    return write_module(BUILD)


@pytest.fixture
def two_builds(project: Path, kiln: Any, tmp_path: Path) -> tuple[Path, Path]:
    first = kiln("build", str(project), "--output-dir", "a", "-j", "2")
    assert first.returncode == 0, first.stderr
    second = kiln("build", str(project), "--output-dir", "b", "--after", "1", "-j", "2")
    assert second.returncode == 1, second.stderr  # the wrong module fails its check
    return tmp_path / "a", tmp_path / "b"


def _rows(kiln: Any, *args: str) -> tuple[int, dict[str, Any], str]:
    r = kiln("compare", *args, "--json")
    return r.returncode, {row["path"]: row for row in json.loads(r.stdout)["rows"]}, r.stderr


def test_each_kind_of_change_and_why(kiln: Any, two_builds: tuple[Path, Path]) -> None:
    code, rows, _ = _rows(kiln, "a", "b")
    assert code == 0
    same = rows["bin/zoo/same_vmvx.vmfb"]
    assert same["change"] == "unchanged" and same["module"]["latency_note"] == "same artifact"
    slow = rows["bin/zoo/slowed_vmvx.vmfb"]
    assert slow["change"] == "changed" and "parameter flags" in slow["why"]
    assert "--iree-vm-emit-polyglot-zip=false" in slow["why"]
    latency = slow["module"]["latency"]
    assert latency["verdict"] == "slower" and 1.25 < latency["ratio"] < 1.35
    assert latency["low"] > 1 and "slower" in slow["flags"]
    wrong = rows["bin/zoo/wrong_vmvx.vmfb"]
    assert wrong["why"] == "input wrong.mlir was added; input add.mlir was removed" or (
        "wrong.mlir" in wrong["why"]
    )
    assert wrong["module"]["verify_a"] == "pass" and wrong["module"]["verify_b"] == "fail"
    assert wrong["module"]["output_diff"] == pytest.approx(3.0)  # x = 0..3: 3x - 2x at 3
    assert {"new-failure", "accuracy"} <= set(wrong["flags"])
    moved = rows["bin/zoo/moved_b_vmvx.vmfb"]
    assert moved["change"] == "renamed" and moved["was"] == "bin/zoo/moved_a_vmvx.vmfb"
    assert "bin/zoo/moved_a_vmvx.vmfb" not in rows


def test_the_table_puts_regressions_first_and_fits_the_terminal(
    kiln: Any, two_builds: tuple[Path, Path]
) -> None:
    r = kiln("compare", "a", "b", env={"COLUMNS": "90"})
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert all(len(line) <= 90 for line in lines), lines
    body = [ln for ln in lines[3:] if not ln.startswith(" ")]
    assert body[0].split()[1] == "changed!" and body[1].split()[1] == "changed!"
    assert any("unchanged" in ln for ln in body[2:])


@pytest.mark.parametrize(
    ("condition", "named"),
    [
        ("slower>5%", ["slowed_vmvx"]),
        ("slower>50%", []),
        ("new-failures", ["wrong_vmvx", "wrong_check"]),
        ("accuracy", ["wrong_vmvx"]),
        ("size>10%", []),
    ],
)
def test_fail_if(
    kiln: Any, two_builds: tuple[Path, Path], condition: str, named: list[str]
) -> None:
    r = kiln("compare", "a", "b", "--fail-if", condition)
    assert r.returncode == (1 if named else 0), r.stderr
    for name in named:
        assert name in r.stderr
    assert "same_vmvx" not in r.stderr


def test_fail_if_repeated_and_bad(kiln: Any, two_builds: tuple[Path, Path]) -> None:
    r = kiln("compare", "a", "b", "--fail-if", "slower>50%", "--fail-if", "accuracy,size")
    assert r.returncode == 1 and "--fail-if accuracy" in r.stderr
    bad = kiln("compare", "a", "b", "--fail-if", "faster")
    assert bad.returncode == 2 and "expected slower" in bad.stderr


def test_other_devices_compare_everything_but_latency(
    kiln: Any, two_builds: tuple[Path, Path]
) -> None:
    a, b = two_builds
    text = (b / "manifest.json").read_text().replace("cpu:test@0123456789ab", "cpu:other@ba98")
    (b.parent / "other.json").write_text(text)
    code, rows, _ = _rows(kiln, "a", "other.json")
    slow = rows["bin/zoo/slowed_vmvx.vmfb"]
    assert slow["module"]["latency"] is None and code == 0
    assert "measured on different devices" in slow["module"]["latency_note"]
    assert slow["module"]["verify_b"] == "none" and slow["why"]
    assert rows["bin/zoo/wrong_vmvx.vmfb"]["module"]["verify_b"] == "fail"


def test_history_at_minus_one(project: Path, kiln: Any, tmp_path: Path) -> None:
    assert kiln("build", str(project)).returncode == 0
    assert kiln("build", str(project)).returncode == 0  # no-op: the history keeps none
    assert not (tmp_path / "kiln-out/.kiln/manifests/1.json").exists()
    missing = kiln("compare", "@-1", "@0")
    assert missing.returncode == 2 and "no such build is kept" in missing.stderr
    kiln("build", str(project), "--after", "1")
    code, rows, _ = _rows(kiln, "@-1", "@0")
    assert (
        code == 0 and rows["bin/zoo/slowed_vmvx.vmfb"]["module"]["latency"]["verdict"] == "slower"
    )
    assert kiln("clean").returncode == 0
    assert not (tmp_path / "kiln-out/.kiln/manifests").exists()


def test_an_older_manifest_says_why_is_unknown(kiln: Any, two_builds: tuple[Path, Path]) -> None:
    a, b = two_builds
    data = json.loads((a / "manifest.json").read_text())
    for ep in data["entrypoints"].values():
        for out in ep["outputs"]:
            out.pop("key", None)
    (a.parent / "old.json").write_text(json.dumps(data))
    _, rows, _ = _rows(kiln, "old.json", "b")
    assert rows["bin/zoo/slowed_vmvx.vmfb"]["why"] == "unknown (older manifest)"


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("{not json", "not valid JSON"),
        ('{"format": "other/1"}', "not a kiln manifest"),
        ("[1, 2]", "not a kiln manifest"),
        ('{"format": "kiln-manifest/2", "entrypoints": 3}', "no entrypoints"),
        ("\x00\xff" * 10, "not valid JSON"),
    ],
)
def test_damaged_or_foreign_manifests_exit_2(
    kiln: Any, tmp_path: Path, content: str, said: str
) -> None:
    (tmp_path / "bad.json").write_text(content, errors="surrogateescape")
    r = kiln("compare", "bad.json", "bad.json")
    assert r.returncode == 2 and said in r.stderr and "Traceback" not in r.stderr


def test_missing_fifo_symlink_and_directory_without_manifest(kiln: Any, tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "fifo.json")
    (tmp_path / "real.json").write_text('{"format": "kiln-manifest/2", "entrypoints": {}}')
    (tmp_path / "link.json").symlink_to("real.json")
    (tmp_path / "empty").mkdir()
    for name, said in (
        ("fifo.json", "not a regular file"),
        ("link.json", "symbolic link"),
        ("nowhere.json", "no manifest at"),
        ("empty", "no manifest at"),
        ("@-99", "@0 (the last)"),
    ):
        r = kiln("compare", name, "real.json", timeout=20)
        assert r.returncode == 2 and said in r.stderr, (name, r.stderr)
        assert "Traceback" not in r.stderr


def test_strings_from_manifests_are_escaped(kiln: Any, tmp_path: Path) -> None:
    evil = "bin/\x1b]0;owned\x07x.vmfb"
    out = {"path": evil, "status": "built", "built": True, "sha256": "a" * 64, "size": 1}
    doc = {"format": "kiln-manifest/2", "entrypoints": {"e\x1b[2J": {"outputs": [out]}}}
    (tmp_path / "evil.json").write_text(json.dumps(doc))
    (tmp_path / "empty.json").write_text('{"format": "kiln-manifest/2", "entrypoints": {}}')
    r = kiln("compare", "empty.json", "evil.json", "--html", "page.html", env={"COLUMNS": "200"})
    assert r.returncode == 0 and "\x1b" not in r.stdout and "\\x1b" in r.stdout
    page = (tmp_path / "page.html").read_text()
    assert "\x1b" not in page.replace("\x1b]0;owned", "") or "<script" not in page
