"""The ML actions through real builds: fetch_http against a local server,
onnx_import -> compile -> verify on a generated model, and the manifest."""

from __future__ import annotations

import hashlib
import json
import os
import stat
from pathlib import Path

import needs
import pytest
from httpserver import HTTPTestServer

pytestmark = pytest.mark.in_process


onnx = needs.module("onnx")
np = needs.module("numpy")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402


def _write_add_model(folder: Path) -> None:
    """y = x + c, with one reference input/output pair as .pb files."""
    const = numpy_helper.from_array(np.arange(6, dtype=np.float32).reshape(2, 3), "c")
    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "c"], ["y"])],
        "add",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])],
        initializer=[const],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, folder / "add.onnx")
    x = np.ones((2, 3), dtype=np.float32)
    (folder / "x.pb").write_bytes(numpy_helper.from_array(x, "x").SerializeToString())
    y = x + np.arange(6, dtype=np.float32).reshape(2, 3)
    (folder / "y.pb").write_bytes(numpy_helper.from_array(y, "y").SerializeToString())
    (folder / "wrong.pb").write_bytes(numpy_helper.from_array(y * 2, "y").SerializeToString())


PIPELINE = """
@entrypoint
def add(expected=cl_arg("expected", default="y.pb")):
    mlir = onnx_import(name="add.mlir", source=source_file("add.onnx"))
    modules = compile(name="add", source=mlir)
    checks = [
        verify(name=f"add_{i}.json", module=m, inputs=[source_file("x.pb")],
               expected=[source_file(expected, name="expected.pb")])
        for i, m in enumerate(modules)
    ]
    return [*modules, *checks]
"""


@pytest.fixture
def pipeline(tmp_path: Path, write_module):  # type: ignore[no-untyped-def]
    _write_add_model(tmp_path)
    return write_module(PIPELINE)


def test_import_compile_verify_for_two_targets_and_manifest(pipeline, kiln, tmp_path: Path):
    r = kiln("build", str(pipeline), "--target", "cpu", "--target", "vmvx", "-j", "2")
    assert r.returncode == 0, r.stderr
    out = tmp_path / "kiln-out"
    printed = r.stdout.split()
    assert str(out / "bin/add/add_cpu-host.vmfb") in printed
    assert str(out / "bin/add/add_vmvx.vmfb") in printed
    assert "Compiling BuildFile[gen](add/add.mlir) (for cpu-host)" in r.stderr
    result = json.loads((out / "genfiles/add/add_0.json").read_text())
    assert result["passed"] is True
    assert result["outputs"][0]["max_abs_err"] == 0.0

    manifest = json.loads((out / "manifest.json").read_text())
    entries = {e["path"]: e for e in manifest["entrypoints"]["add"]["outputs"]}
    cpu = entries["bin/add/add_cpu-host.vmfb"]
    data = (out / "bin/add/add_cpu-host.vmfb").read_bytes()
    assert cpu["sha256"] == hashlib.sha256(data).hexdigest()
    assert cpu["size"] == len(data)
    assert cpu["target"] == "cpu-host" and cpu["namespace"] == "bin"
    # "host" is spelled out as what it means on this machine (kiln.actions._host_cpu).
    host = cpu["host"]
    assert host["cpu"] and host["cpu_features"] and host["triple"]
    assert f"--iree-llvmcpu-target-cpu={host['cpu']}" in cpu["flags"]
    assert f"--iree-llvmcpu-target-triple={host['triple']}" in cpu["flags"]
    assert "--iree-llvmcpu-target-cpu=host" not in cpu["flags"]
    assert cpu["compiler_version"]
    assert cpu["verification"][0]["passed"] is True
    assert entries["bin/add/add_vmvx.vmfb"]["target"] == "vmvx"

    again = kiln("build", str(pipeline), "--target", "cpu", "--target", "vmvx")
    assert again.returncode == 0
    assert "0 built, 5 up to date" in again.stderr


def test_verify_mismatch_fails_with_a_readable_summary(pipeline, kiln, tmp_path: Path):
    r = kiln("build", str(pipeline), "--target", "cpu", "--expected", "wrong.pb")
    assert r.returncode == 1
    assert "do not match" in r.stderr and "max" in r.stderr
    assert "Traceback" not in r.stderr
    manifest = json.loads((tmp_path / "kiln-out/manifest.json").read_text())
    (module,) = [e for e in manifest["entrypoints"]["add"]["outputs"] if e.get("target")]
    assert module["status"] == "built"
    assert module["verification"][0]["passed"] is False
    assert module["verification"][0]["status"] == "failed"


def test_compile_without_a_target_names_the_option(pipeline, kiln):
    r = kiln("build", str(pipeline))
    assert r.returncode == 2
    assert "--target cpu" in r.stderr


def test_unknown_target_is_a_usage_error(pipeline, kiln):
    r = kiln("build", str(pipeline), "--target", "tpu")
    assert r.returncode == 2
    assert "unknown --target 'tpu'" in r.stderr


def test_compiler_error_shows_diagnostics(kiln, write_module, tmp_path: Path):
    (tmp_path / "bad.mlir").write_text("func.func @main( -> {\n")
    module = write_module(
        """
        @entrypoint
        def bad():
            return compile(name="bad", source=source_file("bad.mlir"))
        """
    )
    r = kiln("build", str(module), "--target", "vmvx")
    assert r.returncode == 1
    assert "iree-compile failed" in r.stderr
    assert "bad.mlir" in r.stderr and "error" in r.stderr
    assert not (tmp_path / "kiln-out/bin/bad/bad_vmvx.vmfb").exists()


def test_corrupt_onnx_fails_the_import_alone(kiln, write_module, tmp_path: Path):
    _write_add_model(tmp_path)
    (tmp_path / "broken.onnx").write_bytes(b"\x08\x07not a model")
    module = write_module(
        """
        @entrypoint
        def broken():
            return onnx_import(name="broken.mlir", source=source_file("broken.onnx"))

        @entrypoint
        def good():
            return onnx_import(name="add.mlir", source=source_file("add.onnx"))
        """
    )
    r = kiln("build", str(module))
    assert r.returncode == 1
    assert "broken.onnx" in r.stderr
    assert (tmp_path / "kiln-out/genfiles/good/add.mlir").read_text().startswith("module")
    assert "1 built" in r.stderr and "1 failed" in r.stderr


FETCH = """
@entrypoint
def get(url=cl_arg("url"), sha=cl_arg("sha", default=None)):
    return fetch_http(name="blob.bin", url=url, sha256=sha, retries=1)
"""


@pytest.fixture
def server():  # type: ignore[no-untyped-def]
    with HTTPTestServer() as s:
        yield s


def test_fetch_downloads_once_and_refetches_when_the_file_changes(
    server, kiln, write_module, tmp_path: Path
):
    body = b"weights" * 1000
    url = server.serve("/m.bin", body)
    module = write_module(FETCH)
    sha = hashlib.sha256(body).hexdigest()
    assert kiln("build", str(module), "--url", url, "--sha", sha).returncode == 0
    out = tmp_path / "kiln-out/genfiles/get/blob.bin"
    assert out.read_bytes() == body
    assert kiln("build", str(module), "--url", url, "--sha", sha).returncode == 0
    assert server.count("/m.bin") == 1
    out.write_bytes(b"tampered")
    # (With the cache on, the download would come back from it: tests/test_cache.py.)
    assert kiln("build", str(module), "--url", url, "--sha", sha, "--no-cache").returncode == 0
    assert server.count("/m.bin") == 2 and out.read_bytes() == body


def test_fetch_errors_name_the_url_and_leave_no_file(server, kiln, write_module, tmp_path):
    module = write_module(FETCH)
    missing = server.status("/missing", 404)
    r = kiln("build", str(module), "--url", missing)
    assert r.returncode == 1
    assert f"HTTP 404 Not Found fetching {missing}" in r.stderr

    url = server.serve("/m.bin", b"abc")
    r = kiln("build", str(module), "--url", url, "--sha", "0" * 64)
    assert r.returncode == 1
    assert "checksum mismatch" in r.stderr and "0" * 64 in r.stderr
    assert hashlib.sha256(b"abc").hexdigest() in r.stderr
    assert not (tmp_path / "kiln-out/genfiles/get/blob.bin").exists()


def test_fetch_retries_a_500(server, kiln, write_module, tmp_path: Path):
    url = server.flaky("/f.bin", b"payload", failures=1)
    r = kiln("build", str(write_module(FETCH)), "--url", url)
    assert r.returncode == 0, r.stderr
    assert server.count("/f.bin") == 2
    assert (tmp_path / "kiln-out/genfiles/get/blob.bin").read_bytes() == b"payload"


def test_fetch_file_url(kiln, write_module, tmp_path: Path):
    (tmp_path / "local.bin").write_bytes(b"local")
    r = kiln("build", str(write_module(FETCH)), "--url", (tmp_path / "local.bin").as_uri())
    assert r.returncode == 0, r.stderr
    blob = tmp_path / "kiln-out/genfiles/get/blob.bin"
    assert blob.read_bytes() == b"local"
    # Written through temporaries, but as readable as plainly created files.
    umask = os.umask(0o022)
    os.umask(umask)
    for path in (blob, tmp_path / "kiln-out/manifest.json"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o666 & ~umask


def test_compile_keeps_its_output_in_a_log_shown_with_verbose(pipeline, kiln, tmp_path: Path):
    quiet = kiln("build", str(pipeline), "--target", "vmvx")
    assert quiet.returncode == 0, quiet.stderr
    assert "log of" not in quiet.stderr
    log = tmp_path / "kiln-out/.kiln/logs/add/add_vmvx.vmfb.log"
    assert "iree-compile" in log.read_text()

    (tmp_path / "kiln-out/bin/add/add_vmvx.vmfb").unlink()
    loud = kiln("build", str(pipeline), "--target", "vmvx", "-v", "--no-cache")
    assert loud.returncode == 0, loud.stderr
    assert f"log of Compiling BuildFile[gen](add/add.mlir) (for vmvx): {log}" in loud.stderr
