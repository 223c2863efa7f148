"""What tests and scripts written for iree.build rely on, in kiln's own words:
``kiln.actions.thunks``, ``load_build_module`` and ``iree_build_main`` with its
streams, the command line without a command word, listing a graph that has no
compile target, the hidden testing flags, and the console texts they look for
(``ERROR: Building``, ``Root causes:``, ``Waiting for long running actions:``,
``Fetching URL:``)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import needs
import pytest
from httpserver import HTTPTestServer

PROCESS_MODULE = """\
import os
from pathlib import Path

from kiln import *
from kiln.executor import BuildContext
from kiln.actions.thunks import ExecuteOutOfProcessThunkAction


def record_pid(path: Path, parent: str) -> None:
    path.write_text(f"{parent} {os.getpid()}")


def fail_loudly() -> None:
    raise ValueError("the thunk gave up")


def sleep_then_record(path: Path) -> None:
    import time

    time.sleep(0.5)
    path.write_text("slept")


def _thunk_output(name, thunk, args, desc):
    context = BuildContext.current()
    out = context.allocate_file(name)
    out.deps.add(ExecuteOutOfProcessThunkAction(
        thunk, args=[out.get_fs_path(), *args], desc=desc, executor=context.executor))
    return out


@entrypoint
def pid():
    return _thunk_output("pid.txt", record_pid, [str(os.getpid())], "Recording the pid")


@entrypoint
def failing():
    context = BuildContext.current()
    out = context.allocate_file("never.txt")
    out.deps.add(ExecuteOutOfProcessThunkAction(
        fail_loudly, args=[], desc="Giving up on purpose", executor=context.executor))
    return out


@entrypoint
def slow():
    return _thunk_output("slow.txt", sleep_then_record, [], "Sleeping a while")


if __name__ == "__main__":
    iree_build_main()
"""


def python(
    cwd: Path, *argv: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "NO_COLOR": "1", **(env or {})},
    )


@pytest.fixture
def process_module(tmp_path: Path) -> Path:
    path = tmp_path / "thunks.py"
    path.write_text(PROCESS_MODULE)
    return path


def worker_pid(out_dir: Path) -> int:
    """The pid the thunk ran in, checked to differ from the build's own."""
    parent, child = (out_dir / "genfiles" / "pid" / "pid.txt").read_text().split()
    assert parent != child
    return int(child)


# -- kiln.actions.thunks ------------------------------------------------------------


def test_thunk_runs_in_a_worker_process_from_a_module_loaded_by_path(process_module, tmp_path):
    r = python(tmp_path, "-m", "kiln", "thunks.py", "pid", "--output-dir", "out")

    assert r.returncode == 0, r.stderr
    assert worker_pid(tmp_path / "out") > 0
    assert r.stdout.splitlines() == ["out/genfiles/pid/pid.txt"]  # as given: relative


def test_thunk_defined_in_the_script_run_as_main(process_module, tmp_path):
    # ``python thunks.py``: the thunk lives in ``__main__``, which cloudpickle sends by value.
    r = python(tmp_path, "thunks.py", "pid", "--output-dir", "out")

    assert r.returncode == 0, r.stderr
    assert worker_pid(tmp_path / "out") > 0


def test_thunk_action_has_no_key_and_runs_on_every_build(process_module, tmp_path):
    first = python(tmp_path, "-m", "kiln", "thunks.py", "pid", "--output-dir", "out")
    again = python(tmp_path, "-m", "kiln", "thunks.py", "pid", "--output-dir", "out")

    assert first.returncode == 0 and again.returncode == 0, again.stderr
    assert "1 built, 0 up to date" in again.stderr


def test_failing_thunk_is_reported_with_iree_build_texts(process_module, tmp_path):
    r = python(tmp_path, "-m", "kiln", "thunks.py", "failing", "--output-dir", "out")

    assert r.returncode == 1
    assert "ERROR: Building 'Giving up on purpose' failed:" in r.stderr
    assert "ValueError: the thunk gave up" in r.stderr
    assert "Root causes:\n  * Giving up on purpose\n" in r.stderr
    assert r.stderr.rstrip().splitlines()[-1].startswith("kiln: FAILED: 0 built")


# -- iree_build_main and load_build_module in-process -----------------------------

IN_PROCESS = """\
import io, json, sys
from pathlib import Path
from kiln import iree_build_main, load_build_module

mod = load_build_module(Path("thunks.py"))
results = {}
for name, args in [("list", ["--list"]), ("list_all", ["--list-all"]),
                   ("build", ["pid", "--output-dir", "out"]),
                   ("fail", ["failing", "--output-dir", "out"])]:
    out, err = io.StringIO(), io.StringIO()
    try:
        iree_build_main(mod, args=args, stdout=out, stderr=err)
        code = 0
    except SystemExit as e:
        code = e.code
    results[name] = [code, out.getvalue(), err.getvalue()]
json.dump(results, sys.__stdout__)
"""


def test_iree_build_main_with_a_loaded_module_and_streams(process_module, tmp_path):
    r = python(tmp_path, "-c", IN_PROCESS)

    assert r.returncode == 0, r.stderr
    assert r.stderr == ""  # everything went to the streams given
    got = json.loads(r.stdout)
    assert got["list"] == [0, "pid\nfailing\nslow\n", ""]
    code, out, err = got["list_all"]
    assert code == 0 and set(out.split()) == {
        "pid",
        "pid/pid.txt",
        "failing",
        "failing/never.txt",
        "slow",
        "slow/slow.txt",
    }
    code, out, err = got["build"]
    assert code == 0 and out == "out/genfiles/pid/pid.txt\n"
    assert "kiln: done: 1 built" in err
    code, out, err = got["fail"]
    assert code == 1 and out == "" and "Root causes:\n  * Giving up on purpose\n" in err


def test_iree_build_main_takes_a_module_name(tmp_path, process_module):
    script = textwrap.dedent("""\
        import io, sys
        sys.path.insert(0, ".")
        from kiln import iree_build_main
        out = io.StringIO()
        iree_build_main("thunks", args=["--list"], stdout=out)
        print(out.getvalue().split())
        """)
    r = python(tmp_path, "-c", script)

    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "['pid', 'failing', 'slow']"


def test_load_build_module_of_a_missing_file_is_a_usage_error(tmp_path):
    from kiln import load_build_module
    from kiln.base.errors import UsageError

    with pytest.raises(UsageError, match="nope.py does not exist"):
        load_build_module(tmp_path / "nope.py")


# -- the command line without a command word --------------------------------------


def test_module_first_means_build(process_module, tmp_path):
    r = python(tmp_path, "-m", "kiln", "thunks.py", "pid", "--build", "--output-dir", "o")

    assert r.returncode == 0, r.stderr
    assert worker_pid(tmp_path / "o") > 0


def test_dash_m_module_first(process_module, tmp_path):
    env = {"PYTHONPATH": _path(tmp_path)}
    listed = python(tmp_path, "-m", "kiln", "-m", "thunks", "--list", env=env)
    built = python(tmp_path, "-m", "kiln", "-m", "thunks", "pid", "--output-dir", "o", env=env)

    assert listed.returncode == 0, listed.stderr
    assert listed.stdout.split() == ["pid", "failing", "slow"]
    assert built.returncode == 0, built.stderr
    assert worker_pid(tmp_path / "o") > 0


def _path(first: Path) -> str:
    return os.pathsep.join([str(first), os.environ.get("PYTHONPATH", "")])


def test_list_flags_exclude_each_other(process_module, tmp_path):
    r = python(tmp_path, "-m", "kiln", "thunks.py", "--list", "--list-all")

    assert r.returncode == 2
    assert "--list and --list-all exclude each other" in r.stderr


def test_unknown_first_word_is_still_a_usage_error(tmp_path):
    r = python(tmp_path, "-m", "kiln", "frobnicate", "--list")

    assert r.returncode == 2 and "usage: kiln" in r.stderr
    assert "unknown command 'frobnicate'" in r.stderr and "-m frobnicate" in r.stderr


def test_kiln_list_keeps_its_own_format_and_has_bare(process_module, tmp_path):
    full = python(tmp_path, "-m", "kiln", "list", "thunks.py", "--all")
    bare = python(tmp_path, "-m", "kiln", "list", "thunks.py", "--all", "--bare")

    assert ["file", "pid/pid.txt"] in [line.split() for line in full.stdout.splitlines()]
    assert "pid/pid.txt" in bare.stdout.splitlines()
    assert all(len(line.split()) == 1 for line in bare.stdout.splitlines())


# -- a compile without a target ---------------------------------------------------

NO_TARGET = """\
from kiln import *

@entrypoint(description="fetch, import, compile")
def model(url=cl_arg("model-url", default="http://127.0.0.1:9/none.onnx")):
    fetch_http(name="model.onnx", url=url)
    onnx_import(name="model.mlir", source="model.onnx")
    return compile(name="model", source="model.mlir")
"""


def test_graph_with_an_untargeted_compile_lists(tmp_path):
    (tmp_path / "m.py").write_text(NO_TARGET)

    listed = python(tmp_path, "-m", "kiln", "m.py", "--list")
    everything = python(tmp_path, "-m", "kiln", "m.py", "--list-all")

    assert listed.returncode == 0 and listed.stdout == "model\n", listed.stderr
    assert everything.returncode == 0, everything.stderr
    assert {"model", "model/model.onnx", "model/model.mlir"} <= set(everything.stdout.split())
    assert not (tmp_path / "kiln-out").exists()  # listing creates nothing


def test_building_an_untargeted_compile_is_an_error_before_anything_runs(tmp_path):
    (tmp_path / "m.py").write_text(NO_TARGET)
    with HTTPTestServer() as server:
        url = server.serve("/m.onnx", b"not really onnx")
        r = python(tmp_path, "-m", "kiln", "m.py", "--model-url", url)
        fetched = server.count("/m.onnx")

    assert r.returncode == 2
    assert "compile needs a target device: pass --target cpu" in r.stderr
    assert f"defined at {tmp_path / 'm.py'}:7" in r.stderr
    assert fetched == 0
    assert not (tmp_path / "kiln-out").exists()


def test_a_file_before_the_untargeted_compile_builds(tmp_path):
    (tmp_path / "m.py").write_text(NO_TARGET)
    with HTTPTestServer() as server:
        url = server.serve("/m.onnx", b"model bytes")
        r = python(tmp_path, "-m", "kiln", "m.py", "model/model.onnx", "--model-url", url)

    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).read_bytes() == b"model bytes"


# -- hidden testing flags ---------------------------------------------------------


def test_force_console_draws_live_off_a_terminal(process_module, tmp_path):
    live = python(
        tmp_path, "-m", "kiln", "thunks.py", "pid", "--output-dir", "a", "--test-force-console"
    )
    plain = python(tmp_path, "-m", "kiln", "thunks.py", "pid", "--output-dir", "b")

    assert live.returncode == 0 and plain.returncode == 0, live.stderr
    assert "\x1b[A" in live.stderr  # the display took its lines back
    assert "\x1b" not in plain.stderr
    assert "kiln: done: 1 built" in live.stderr and "kiln: done: 1 built" in plain.stderr
    assert "Waiting for long running actions:" not in live.stderr  # 5 s by default


def test_long_running_threshold(process_module, tmp_path):
    r = python(
        tmp_path,
        "-m",
        "kiln",
        "thunks.py",
        "slow",
        "--test-force-console",
        "--test-long-display-time-threshold=0.1",
    )

    assert r.returncode == 0, r.stderr
    assert "Waiting for long running actions:" in r.stderr
    assert "Sleeping a while" in r.stderr


def test_testing_flags_are_hidden(process_module, tmp_path):
    r = python(tmp_path, "-m", "kiln", "build", "thunks.py", "--help")

    assert r.returncode == 0
    assert "--test-" not in r.stdout and "--output-dir" in r.stdout


# -- Fetching URL -----------------------------------------------------------------

FETCH = """\
import os
from kiln import *

@entrypoint
def get():
    return fetch_http(name="got.txt", url=os.environ["FETCH_URL"])
"""


def test_fetching_url_line_only_when_downloading(tmp_path):
    (tmp_path / "f.py").write_text(FETCH)
    out = tmp_path / "kiln-out" / "genfiles" / "get" / "got.txt"
    with HTTPTestServer() as server:
        one, two = server.serve("/one", b"1"), server.serve("/two", b"2")

        def fetch(url: str, *args: str) -> str:
            r = python(tmp_path, "-m", "kiln", "f.py", *args, env={"FETCH_URL": url})
            assert r.returncode == 0, r.stderr
            return r.stderr

        assert f"Fetching URL: {one} -> {out}\n" in fetch(one)
        assert "Fetching URL:" not in fetch(one)  # up to date
        assert f"Fetching URL: {two} -> {out}" in fetch(two)  # another URL
        out.unlink()
        # Output gone: (without the shared cache, which would serve it) downloaded again.
        assert f"Fetching URL: {two} -> {out}" in fetch(two, "--no-cache")
        assert out.read_bytes() == b"2"


def test_fetching_url_line_hides_credentials_and_query(tmp_path):
    (tmp_path / "f.py").write_text(FETCH)
    with HTTPTestServer() as server:
        server.serve("/model", b"m")
        secret = f"http://alice:hunter2@127.0.0.1:{server.port}/model?token=s3cr3t#frag"
        r = python(tmp_path, "-m", "kiln", "f.py", env={"FETCH_URL": secret})

    # (Whether the download itself succeeds is not this test's matter.)
    line = next(x for x in r.stderr.splitlines() if x.startswith("Fetching URL:"))
    assert line.startswith(f"Fetching URL: http://***@127.0.0.1:{server.port}/model?***#*** -> ")
    assert "hunter2" not in line and "alice" not in line and "s3cr3t" not in line


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("https://example.com/a/b.onnx", "https://example.com/a/b.onnx"),
        ("https://u:p@example.com:8443/x", "https://***@example.com:8443/x"),
        ("https://example.com/x?sig=abc&exp=1", "https://example.com/x?***"),
        ("file:///data/model.onnx", "file:///data/model.onnx"),
    ],
)
def test_redact_url(url: str, shown: str) -> None:
    from kiln.actions.net import redact_url

    assert redact_url(url) == shown


# -- names that real build modules import -------------------------------------------


def test_builder_style_imports(tmp_path):
    module = tmp_path / "builder.py"
    module.write_text(
        textwrap.dedent("""\
        from kiln import *
        from kiln.executor import (
            BuildAction, BuildContext, BuildFile, BuildFileLike, FileNamespace,
        )

        def as_file(f: BuildFileLike) -> BuildFile:
            return BuildContext.current().file(f)

        @entrypoint
        def copy():
            src = source_file("in.txt")
            return run_command(name="out.txt", inputs=[as_file(src)],
                               command=["cp", "{inputs[0]}", "{out}"])
        """)
    )
    (tmp_path / "in.txt").write_text("payload")
    r = python(tmp_path, "-m", "kiln", "builder.py")

    assert r.returncode == 0, r.stderr
    assert Path(r.stdout.strip()).read_text() == "payload"


# -- scripts/compat_upstream.py, on a suite of kiln's own in upstream's layout ---------

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "compat_upstream.py"
FAKE_SUITE = {
    "basic_test.py": """\
        import unittest
        from iree.build import *

        class Basic(unittest.TestCase):
            def test_kiln_is_what_was_imported(self):
                self.assertEqual(iree_build_main.__module__, "kiln.cli.main")

            def test_that_fails(self):
                self.assertEqual(1, 2, "meant to fail")

        if __name__ == "__main__":
            unittest.main()
        """,
    "net_test.py": """\
        import unittest, urllib.request

        class Net(unittest.TestCase):
            def test_served_over_local_https(self):
                url = "https://example.org/some/file.txt"
                self.assertTrue(url.startswith("https://127.0.0.1:"))
                body = urllib.request.urlopen(url).read().decode()
                self.assertIn("example.org/some/file.txt", body)

            def test_absent_url_is_404(self):
                with self.assertRaises(OSError):
                    urllib.request.urlopen("https://github.com/iree-org/doesnotexist")

        if __name__ == "__main__":
            unittest.main()
        """,
    "mnist_builder_test.py": """\
        import sys
        sys.exit(3)
        import unittest

        class Never(unittest.TestCase):
            def test_never_runs(self):
                pass
        """,
    "mnist_builder.py": "from iree.build import *\n",
}


def test_compat_upstream_script_counts_results(tmp_path):
    needs.program("openssl")
    suite = tmp_path / "upstream"
    suite.mkdir()
    for name, text in FAKE_SUITE.items():
        (suite / name).write_text(textwrap.dedent(text))
    r = python(tmp_path, str(SCRIPT), str(suite))

    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert "PASS     basic_test.py::test_kiln_is_what_was_imported" in lines
    assert any(x.startswith("FAIL     basic_test.py::test_that_fails  -- Assertion") for x in lines)
    assert "PASS     net_test.py::test_served_over_local_https" in lines
    assert "PASS     net_test.py::test_absent_url_is_404" in lines
    assert "NOT RUN  mnist_builder_test.py::test_never_runs  -- exit 3: no output" in lines
    assert lines[-1] == "kiln: 3 of 5 upstream tests pass"


# -- iree.build's command line, compared with iree.build's own --------------------

TARGETS_MODULE = """\
from pathlib import Path
from iree.build import *

@entrypoint
def ep():
    ctx = executor.BuildContext.current()
    source = ctx.allocate_file(str(Path(__file__).resolve().parent / "add.mlir"))
    return compile(name="add", source=source)
"""


@pytest.mark.parametrize(
    "devices",
    [
        ["--iree-hal-target-device", "llvm-cpu", "vmvx", "--iree-llvmcpu-target-cpu=host"],
        ["--iree-hal-target-device=hip", "--iree-rocm-target=gfx942"],
        ["--iree-hal-target-device=cpu"],
        ["--iree-hal-target-device", "cuda", "--iree-compile-out-of-process"],
    ],
    ids=["several-per-flag", "hip", "cpu-generic", "other-device"],
)
def test_target_devices_name_the_modules_as_iree_build_does(tmp_path, devices):
    (tmp_path / "targets.py").write_text(TARGETS_MODULE)
    (tmp_path / "add.mlir").write_text("module {}\n")
    args = ["targets.py", "--list-all", *devices]
    ours = python(tmp_path, "-m", "kiln", *args)
    theirs = python(tmp_path, "-m", "iree.build", *args)
    assert ours.returncode == 0 and theirs.returncode == 0, (ours.stderr, theirs.stderr)
    assert ours.stdout == theirs.stdout
    assert "ep/add_" in ours.stdout


def test_several_target_device_flags_add_up(tmp_path):
    (tmp_path / "targets.py").write_text(TARGETS_MODULE)
    (tmp_path / "add.mlir").write_text("module {}\n")
    devices = ["--iree-hal-target-device=vmvx", "--iree-hal-target-device", "llvm-cpu"]
    r = python(tmp_path, "-m", "kiln", "targets.py", "--list-all", *devices)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines()[-2:] == ["ep/add_vmvx.vmfb", "ep/add_cpu-generic.vmfb"]


@pytest.mark.parametrize(("value", "code"), [("fork", 0), ("spawn", 0), ("threads", 2)])
def test_iree_build_mp_context_is_a_start_method(process_module, tmp_path, value, code):
    r = python(tmp_path, "-m", "kiln", "thunks.py", "pid", env={"IREE_BUILD_MP_CONTEXT": value})
    assert r.returncode == code, r.stderr
    if code:
        assert "IREE_BUILD_MP_CONTEXT='threads' is not a start method: use fork" in r.stderr


def test_kiln_list_takes_its_options_before_the_module(process_module, tmp_path):
    before = python(tmp_path, "-m", "kiln", "list", "--all", "--bare", "thunks.py")
    after = python(tmp_path, "-m", "kiln", "list", "thunks.py", "--all", "--bare")
    assert before.returncode == 0, before.stderr
    assert before.stdout == after.stdout and "pid/pid.txt" in before.stdout
