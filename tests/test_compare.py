"""kiln compare through the CLI, on real builds of small MLIR modules: a module that
did not change, one slowed (other flags, and a stand-in benchmark whose samples are
larger), one deliberately wrong (its verification fails), one renamed; damaged and
foreign manifests; --fail-if; --json; the history (@-1 @0)."""

from __future__ import annotations

import json
import os
import re
import shutil
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
# An output of 1,000 elements: more than a check keeps as a list of values.
WIDE = ADD.replace("4xf32", "1000xf32")
WIDE_WRONG = WRONG.replace("4xf32", "1000xf32")

BUILD = """
import json
from kiln.graph.manifest_meta import ManifestMeta

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
    (wide,) = compile(name="wide", source=source_file("wide_wrong.mlir" if b else "wide.mlir"),
                      targets=["vmvx"])
    out += [wide, verify(name="wide_check.json", module=wide, inputs=[source_file("xw.npy")],
                         expected=[source_file("yw.npy")])]
    (moved,) = compile(name="moved_b" if b else "moved_a", source=source_file("add.mlir"),
                       targets=["vmvx"])
    out.append(moved)
    return out
"""


def write_project(folder: Path) -> Path:
    """The build module and its sources in ``folder``; the module's path."""
    from conftest import HEADER

    (folder / "add.mlir").write_text(ADD)
    (folder / "mul.mlir").write_text(MUL)
    (folder / "wrong.mlir").write_text(WRONG)
    x = np.arange(4, dtype=np.float32)
    np.save(folder / "x.npy", x)
    np.save(folder / "y.npy", 2 * x)
    (folder / "wide.mlir").write_text(WIDE)
    (folder / "wide_wrong.mlir").write_text(WIDE_WRONG)
    np.save(folder / "xw.npy", np.arange(1000, dtype=np.float32))
    np.save(folder / "yw.npy", 2 * np.arange(1000, dtype=np.float32))
    module = folder / "build.py"
    module.write_text(HEADER + BUILD)
    return module


def in_dir(folder: Path, *args: str) -> int:
    """``kiln ARGS`` in this process, in ``folder``; its exit status."""
    import io

    from kiln.cli.main import run_cli

    with pytest.MonkeyPatch.context() as m:
        m.chdir(folder)
        m.setenv("NO_COLOR", "1")
        return run_cli(list(args), stdout=io.StringIO(), stderr=io.StringIO())


@pytest.fixture(scope="module")
def built_pair(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A build before (``a``) and one after (``b``) of one project, made once."""
    folder = tmp_path_factory.mktemp("pair")
    module = write_project(folder)
    assert in_dir(folder, "build", str(module), "--output-dir", "a", "-j", "2") == 0
    # The wrong module fails its check in b.
    assert in_dir(folder, "build", str(module), "--output-dir", "b", "--after", "1") == 1
    return folder


@pytest.fixture
def project(tmp_path: Path) -> Path:
    return write_project(tmp_path)


@pytest.fixture
def two_builds(built_pair: Path, tmp_path: Path) -> tuple[Path, Path]:
    for name in ("a", "b"):
        shutil.copytree(built_pair / name, tmp_path / name, symlinks=True)
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
    # 1,000 outputs each side, kept as their bytes: the difference is still exact
    wide = rows["bin/zoo/wide_vmvx.vmfb"]["module"]
    assert wide["output_diff"] == pytest.approx(999.0) and not wide["output_note"]
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


def test_kiln_report_compares_the_last_build_with_the_one_before_in_chromium(
    project: Path, kiln: Any, tmp_path: Path
) -> None:
    """``kiln report``'s page of the last build has a section comparing it with the
    build before (``@-1 @0``): each module's latency ratio on a log scale; a page of
    the first build, or of a build before the last, has none."""
    from test_report import run_chromium

    assert kiln("build", str(project)).returncode == 0
    first = kiln("report")
    assert first.returncode == 0, first.stderr
    assert "id='comparison'" not in (tmp_path / "kiln-out/report.html").read_text()
    kiln("build", str(project), "--after", "1")
    r = kiln("report")
    assert r.returncode == 0, r.stderr
    page = tmp_path / "kiln-out/report.html"
    dom = run_chromium(["--dump-dom", page.as_uri()], tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    section = html[html.index('<section id="comparison">') :]
    assert "Compared with the build before" in section
    assert re.search(r'id="latency-chart" data-modules="1"', section), section[:2000]
    (group,) = re.findall(r'<g class="ratio"[^>]*>', section)
    assert 'data-verdict="slower"' in group and "slowed_vmvx" in group
    assert kiln("report", "--build", "1").returncode == 0
    assert "id='comparison'" not in (tmp_path / "kiln-out/report-1.html").read_text()
    # A damaged earlier manifest: the report is written, and says why it compares nothing.
    (tmp_path / "kiln-out/.kiln/manifests/1.json").write_text("{")
    again = kiln("report")
    assert again.returncode == 0, again.stderr
    written = (tmp_path / "kiln-out/report.html").read_text()
    assert "id='comparison'" in written and "latency-chart" not in written


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
    evil = "bin/\x1b]0;owned\x07<script>x</script>.vmfb"
    out = {"path": evil, "status": "built", "built": True, "sha256": "a" * 64, "size": 1}
    doc = {"format": "kiln-manifest/2", "entrypoints": {"e\x1b[2J": {"outputs": [out]}}}
    (tmp_path / "evil.json").write_text(json.dumps(doc))
    (tmp_path / "empty.json").write_text('{"format": "kiln-manifest/2", "entrypoints": {}}')
    r = kiln("compare", "empty.json", "evil.json", "--html", "page.html", env={"COLUMNS": "200"})
    assert r.returncode == 0 and "\x1b" not in r.stdout and "\\x1b" in r.stdout
    page = (tmp_path / "page.html").read_text()
    # the page is HTML, escaped as HTML: the path's markup is text, never an element
    assert "<script" not in page and "&lt;script&gt;x&lt;/script&gt;" in page


def test_measure_runs_only_changed_modules_interleaved(
    kiln: Any, two_builds: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    from kiln.actions import bench

    calls: list[str] = []
    real = bench._measure

    def counted(b: Any, *args: Any) -> Any:
        calls.append(b.module)
        return real(b, *args)

    monkeypatch.setattr(bench, "_measure", counted)
    r = kiln("compare", "a", "b", "--measure", "--budget", "30", "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert calls, doc["notes"]
    assert not any("same_vmvx" in c or "moved_" in c for c in calls)  # same digest: no run
    slowed = [c for c in calls if "slowed_vmvx" in c]
    assert slowed and len(slowed) % 2 == 0
    # A and B interleaved: A B, then B A.
    sides = [Path(c).parts[-4] for c in slowed]  # a/bin/zoo/slowed_vmvx.vmfb
    assert sides[:4] == ["a", "b", "b", "a"][: len(sides[:4])]
    assert any(f"{len(calls)} benchmark run(s)" in n for n in doc["notes"])


def test_the_page_draws_each_ratio_on_a_log_scale_in_chromium(
    kiln: Any, two_builds: tuple[Path, Path], tmp_path: Path
) -> None:
    from test_report import run_chromium

    r = kiln("compare", "a", "b", "--html", "compare.html")
    assert r.returncode == 0, r.stderr
    page = (tmp_path / "compare.html").read_text()
    assert "http://" not in page.replace("http://www.w3.org/2000/svg", "")
    dom = run_chromium(["--dump-dom", (tmp_path / "compare.html").as_uri()], tmp_path)
    assert dom.returncode == 0, dom.stderr[-2000:]
    html = dom.stdout
    assert re.search(r'id="latency-chart" data-modules="1"', html), html[:2000]
    (group,) = re.findall(r'<g class="ratio"[^>]*>', html)
    assert 'data-verdict="slower"' in group and "slowed_vmvx" in group
    assert re.search(r"<circle [^>]*cx=", html) and 'data-change="unchanged"' in html


SECRET_ACTION = """
class Stamp(BuildAction):
    def __init__(self, out, token, **kwargs):
        super().__init__(**kwargs)
        self.out, self.token = out, token
    def _invoke(self):
        self.out.get_fs_path().write_text(str(sum(map(ord, self.token))))

@entrypoint
def stamp(token=cl_arg("token", default="s3cret-one", help="a secret")):
    context = BuildContext.current()
    out = context.allocate_file("stamp.txt")
    out.deps.add(Stamp(out, token + "x" * 5, desc="stamp", executor=context.executor))
    return [out]
"""


def test_a_user_actions_parameters_reach_the_manifest_as_digests_only(
    kiln: Any, tmp_path: Path
) -> None:
    """A user's action may hold a token: manifest.json (often published with the
    artifacts) shows each of its parameters by digest, and kiln compare still says
    which one changed."""
    from conftest import HEADER

    (tmp_path / "build.py").write_text(HEADER + SECRET_ACTION)
    assert kiln("build", "build.py").returncode == 0
    assert kiln("build", "build.py", "--token", "s3cret-two").returncode == 0
    manifest = (tmp_path / "kiln-out/manifest.json").read_text()
    kept = (tmp_path / "kiln-out/.kiln/manifests/1.json").read_text()
    assert "s3cret" not in manifest and "s3cret" not in kept
    (row,) = json.loads(manifest)["entrypoints"]["stamp"]["outputs"]
    assert row["key"]["params"]["token"].startswith("sha256:")
    code, rows, _ = _rows(kiln, "@-1", "@0")
    assert code == 0
    changed = rows["genfiles/stamp/stamp.txt"]
    assert changed["change"] == "changed" and "token" in changed["why"], changed


def test_a_hand_edited_key_is_not_carried_into_the_next_manifest(kiln: Any, tmp_path: Path) -> None:
    """A no-op build takes an up-to-date output's key parts from the manifest it
    replaces: only as kiln writes them (a plain value put among a user's action's
    digests, or a field kiln never writes, is made again from the build state)."""
    from conftest import HEADER

    (tmp_path / "build.py").write_text(HEADER + SECRET_ACTION)
    assert kiln("build", "build.py").returncode == 0
    path = tmp_path / "kiln-out/manifest.json"
    doc = json.loads(path.read_text())
    (row,) = doc["entrypoints"]["stamp"]["outputs"]
    shown = row["key"]["params"]["token"]
    row["key"]["params"]["token"] = "s3cret-plain\x1b[31m"
    row["key"]["extra"] = "x" * 1000
    path.write_text(json.dumps(doc))
    r = kiln("build", "build.py")
    assert r.returncode == 0 and "0 built, 1 up to date" in r.stderr, r.stderr
    again = json.loads(path.read_text())
    (row,) = again["entrypoints"]["stamp"]["outputs"]
    assert row["key"]["params"]["token"] == shown and "extra" not in row["key"], row["key"]


ONNX_BENCH = """
@entrypoint
def add(after=cl_arg("after", default="0", help="1: the build after")):
    mlir = onnx_import(name="add.mlir", source=source_file("add.onnx"))
    flags = ["--iree-vm-emit-polyglot-zip=false"] if after == "1" else []
    (given,) = compile(name="given", source=mlir, targets=["vmvx"], flags=flags)
    (made,) = compile(name="made", source=mlir, targets=["cpu"], flags=flags)
    return [
        given, benchmark(name="given.json", module=given, inputs=[source_file("x.pb")],
                         repetitions=2, min_time_s=0.001),
        made, benchmark(name="made.json", module=made, repetitions=2, min_time_s=0.001,
                        shapes={"N": 2}),
    ]
"""


def test_measure_runs_an_imported_onnx_module_on_the_inputs_its_benchmark_recorded(
    kiln: Any, kiln_subprocess: Any, tmp_path: Path
) -> None:
    """A module imported from ONNX declares no argument types for the runtime to
    read: --measure runs it on what its build's benchmark ran it on, the given
    file read again below the output directory, or the inputs generated from the
    model made again."""
    from conftest import HEADER
    from test_verify_bench import _write_models

    _write_models(tmp_path)
    (tmp_path / "build.py").write_text(HEADER + ONNX_BENCH)
    assert kiln("build", "build.py", "--output-dir", "a").returncode == 0
    assert kiln("build", "build.py", "--output-dir", "b", "--after", "1").returncode == 0
    # in a process of its own: what it prints at exit is seen
    r = kiln_subprocess("compare", "a", "b", "--measure", "--budget", "20", "--json")
    assert r.returncode == 0, r.stderr
    # the runtime loaded in kiln's process leaves no report of "leaked" objects at exit
    assert "leaked" not in r.stderr, r.stderr
    notes = json.loads(r.stdout)["notes"]
    assert not any("not measured" in n for n in notes), notes
    runs = [n for n in notes if "benchmark run(s)" in n]
    assert runs and "given_vmvx.vmfb" in runs[0] and "made_cpu" in runs[0], notes


def test_measure_never_blocks_on_a_fifo_where_a_recorded_input_was(
    kiln: Any, kiln_subprocess: Any, tmp_path: Path
) -> None:
    """A build's recorded input replaced by a FIFO (an output directory from someone
    else): --measure does not open it; A and B run on the other build's record of the
    same inputs, and with a FIFO in both the module is not measured, and says why."""
    from conftest import HEADER
    from test_verify_bench import _write_models

    _write_models(tmp_path)
    (tmp_path / "build.py").write_text(HEADER + ONNX_BENCH)
    assert kiln("build", "build.py", "--output-dir", "a").returncode == 0
    assert kiln("build", "build.py", "--output-dir", "b", "--after", "1").returncode == 0
    args = ("compare", "a", "b", "--measure", "--budget", "20", "--json")
    for side in ("b", "a"):
        link = tmp_path / side / ".kiln/src/x.pb"
        link.unlink()
        os.mkfifo(link)
        r = kiln_subprocess(*args, env={"COLUMNS": "400"})
        assert r.returncode == 0, r.stderr
        notes = json.loads(r.stdout)["notes"]
        measured = "given_vmvx.vmfb not measured: its benchmark recorded no inputs"
        assert any(measured in n for n in notes) == (side == "a"), notes


def test_html_never_goes_over_kilns_own_files(kiln: Any, two_builds: tuple[Path, Path]) -> None:
    """--html goes through the check every file-writing option takes: a page over a
    build's manifest (or its kept history) is refused before anything is written."""
    a, _ = two_builds
    before = (a / "manifest.json").read_bytes()
    r = kiln("compare", "a", "b", "--html", "a/manifest.json")
    assert r.returncode == 2 and "--html" in r.stderr, r.stderr
    assert (a / "manifest.json").read_bytes() == before
    kept = a / ".kiln" / "manifests" / "1.json"
    kept.parent.mkdir(parents=True, exist_ok=True)
    kept.write_bytes(before)
    r = kiln("compare", "@-1", "@0", "--output-dir", "a", "--html", "a/.kiln/manifests/1.json")
    assert r.returncode == 2 and "--html" in r.stderr, r.stderr
    assert kept.read_bytes() == before


def test_measure_refuses_a_module_path_that_leaves_the_output_directory(
    kiln: Any, two_builds: tuple[Path, Path], tmp_path: Path
) -> None:
    """A foreign manifest naming a module outside its output directory: --measure
    reads nothing there; the module is not measured, and says why."""
    outside = tmp_path / "outside.vmfb"
    outside.write_bytes(b"not a module")
    for build in two_builds:
        text = (build / "manifest.json").read_text()
        text = text.replace('"bin/zoo/slowed_vmvx.vmfb"', '"../outside.vmfb"')
        (build / "manifest.json").write_text(text)
    r = kiln("compare", "a", "b", "--measure", "--budget", "5", "--json")
    assert r.returncode == 0, r.stderr
    notes = json.loads(r.stdout)["notes"]
    assert any("'../outside.vmfb' is not a path below its output directory" in n for n in notes), (
        notes
    )


TOLERANCE_BUILD = """
@entrypoint
def zoo(expected=cl_arg("expected", default="y.npy", help="the reference outputs")):
    (m,) = compile(name="m", source=source_file("add.mlir"), targets=["vmvx"])
    return [m, verify(name="m_check.json", module=m, inputs=[source_file("x.npy")],
                      expected=[source_file(expected)], atol=1e-4, rtol=1e-3)]
"""


def test_accuracy_weighs_an_error_by_its_tolerance(kiln: Any, tmp_path: Path) -> None:
    """Against references a little off: an error that grows by 1% of its tolerance is
    no regression (the old rule flagged any growth); one that grows by half of it is,
    though both still pass."""
    from conftest import HEADER

    (tmp_path / "add.mlir").write_text(ADD)
    (tmp_path / "build.py").write_text(HEADER + TOLERANCE_BUILD)
    x = np.arange(4, dtype=np.float32)
    np.save(tmp_path / "x.npy", x)
    np.save(tmp_path / "y.npy", 2 * x)
    for name, off in (("y_close.npy", 1e-6), ("y_far.npy", 5e-5)):
        np.save(tmp_path / name, (2 * x.astype(np.float64) + off).astype(np.float32))
    for out, expected in (("a", "y.npy"), ("close", "y_close.npy"), ("far", "y_far.npy")):
        r = kiln("build", "build.py", "--output-dir", out, "--expected", expected)
        assert r.returncode == 0, r.stderr
    path = "bin/zoo/m_vmvx.vmfb"
    code, rows, _ = _rows(kiln, "a", "close", "--fail-if", "accuracy")
    close = rows[path]["module"]
    assert code == 0 and "accuracy" not in rows[path]["flags"]
    assert close["err_b"] > close["err_a"] == 0.0
    assert 0 < close["tolerance_used_b"] < 0.05 and close["verify_b"] == "pass"
    code, rows, _ = _rows(kiln, "a", "far", "--fail-if", "accuracy")
    far = rows[path]["module"]
    assert code == 1 and "accuracy" in rows[path]["flags"]
    assert 0.3 < far["tolerance_used_b"] < 1 and far["verify_b"] == "pass"
    r = kiln("compare", "a", "far")
    assert "tolerance used: A 0%, B 5" in r.stdout, r.stdout


def test_tolerance_used_is_the_worst_elements_share() -> None:
    """Logits of both signs and one value near zero: the share of its tolerance each
    element used, not max_abs_err/atol (the largest error, at a large value, over the
    smallest tolerance), which read 195 times the tolerance here and flagged noise."""
    from kiln.actions._tensors import compare

    rng = np.random.default_rng(0)
    expected = rng.normal(0, 50, 1000).astype(np.float32)
    expected[0] = 1e-6
    actual = (expected.astype(np.float64) * (1 + 2e-7)).astype(np.float32)
    actual[0] = 1.5e-6  # half a millionth off: well inside atol, but 50% relative error
    record = compare(0, actual, expected, {})
    assert record["passed"]
    e = expected.astype(np.float64)
    share = np.abs(actual - e) / (record["atol"] + record["rtol"] * np.abs(e))
    assert record["tolerance_used"] == pytest.approx(share.max())
    bound = min(record["max_abs_err"] / record["atol"], record["max_rel_err"] / record["rtol"])
    assert record["tolerance_used"] < 0.2 and bound > 1


def test_outputs_pair_on_the_same_input_data_not_the_same_names(kiln: Any, tmp_path: Path) -> None:
    """x.npy edited between the builds: the two checks ran the module on other data,
    so their outputs are not compared (they were, by the file's name)."""
    from conftest import HEADER

    (tmp_path / "add.mlir").write_text(ADD)
    (tmp_path / "build.py").write_text(HEADER + TOLERANCE_BUILD)
    x = np.arange(4, dtype=np.float32)
    for out, scale in (("a", 1), ("b", 3)):
        np.save(tmp_path / "x.npy", scale * x)
        np.save(tmp_path / "y.npy", 2 * scale * x)
        assert kiln("build", "build.py", "--output-dir", out).returncode == 0
    _, rows, _ = _rows(kiln, "a", "b")
    module = rows["bin/zoo/m_vmvx.vmfb"]["module"]
    assert module["output_diff"] is None
    assert module["output_note"] == "no check on the same inputs in both"
