"""Devices (``kiln.devices.identity``) through the CLI: ``kiln devices``, an action that
``needs`` a device, skipped where the device is absent (failed with
``--require-devices``), keyed by the device's identity, recorded in the manifest;
stand-in devices (``KILN_DEVICES``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from kiln.devices.identity import BadNeed, DeviceSet, need_for_flags, parse_need

BUILD = """
@entrypoint
def top():
    g = run_command(name="g.txt", command=["sh", "-c", "echo gpu > {out}"], needs="cuda:sm_90")
    h = run_command(name="h.txt", command=["sh", "-c", "cat {inputs[0]} > {out}"], inputs=[g])
    c = run_command(name="c.txt", command=["sh", "-c", "echo cpu > {out}"])
    return [g, h, c]
"""


def _outputs(out: Path) -> dict[str, dict[str, Any]]:
    manifest = json.loads((out / "manifest.json").read_text())
    return {Path(o["path"]).name: o for o in manifest["entrypoints"]["top"]["outputs"]}


def test_kiln_devices_lists_this_machines_cpu_and_its_stand_ins(kiln: Any) -> None:
    plain = json.loads(kiln("devices", "--json").stdout)["here"]
    (cpu,) = [d for d in plain if d["kind"] == "cpu"]
    assert cpu["id"].startswith(f"cpu:{cpu['arch']}@") and not cpu["stand_in"]
    assert cpu["model"] and cpu["driver"] == "local-task"
    env = {"KILN_DEVICES": "cuda:sm_90=H100,hip:gfx942"}
    listed = json.loads(kiln("devices", "--json", env=env).stdout)["here"]
    fake = {d["kind"]: d for d in listed if d["stand_in"]}
    assert fake["cuda"]["id"].startswith("cuda:sm_90@standin-")
    assert fake["cuda"]["model"] == "H100" and fake["hip"]["arch"] == "gfx942"
    assert [d for d in listed if not d["stand_in"]] == plain  # the real ones unchanged
    text = kiln("devices", env=env)
    assert text.returncode == 0 and "stand-in (KILN_DEVICES)" in text.stdout
    assert cpu["id"] in text.stdout
    bad = kiln("devices", env={"KILN_DEVICES": "tpu:v5"})
    assert bad.returncode == 2 and "KILN_DEVICES='tpu:v5'" in bad.stderr


def test_an_action_whose_device_is_absent_is_skipped_with_what_needs_it(
    write_module: Any, kiln: Any, tmp_path: Path
) -> None:
    write_module(BUILD)
    r = kiln("build", "build.py")
    assert r.returncode == 0, r.stderr
    assert "Running top/g.txt: skipped: no cuda:sm_90 device here" in r.stderr
    assert "Running top/h.txt: skipped: it needs top/g.txt, which was skipped" in r.stderr
    assert [Path(p).name for p in r.stdout.split()] == ["c.txt"]  # only what was built
    out = tmp_path / "kiln-out"
    assert not (out / "genfiles/top/g.txt").exists()
    assert (out / "genfiles/top/c.txt").read_text() == "cpu\n"
    entries = _outputs(out)
    assert entries["g.txt"]["status"] == "skipped" and entries["g.txt"]["built"] is False
    assert entries["g.txt"]["reason"] == "no cuda:sm_90 device here"
    assert entries["h.txt"]["status"] == "skipped" and entries["c.txt"]["status"] == "built"


def test_require_devices_fails_an_action_whose_device_is_absent(
    write_module: Any, kiln: Any, tmp_path: Path
) -> None:
    write_module(BUILD)
    assert kiln("build", "build.py").returncode == 0  # skipped: nothing to serve later
    r = kiln("build", "build.py", "--require-devices")
    assert r.returncode == 1
    assert "no cuda:sm_90 device here (--require-devices)" in r.stderr
    entries = _outputs(tmp_path / "kiln-out")
    assert entries["g.txt"]["status"] == "failed" and entries["h.txt"]["status"] == "not run"


def test_a_result_is_keyed_by_the_device_that_made_it(
    write_module: Any, kiln: Any, tmp_path: Path
) -> None:
    write_module(BUILD)
    h100 = {"KILN_DEVICES": "cuda:sm_90=H100"}
    gh200 = {"KILN_DEVICES": "cuda:sm_90=GH200"}
    first = kiln("build", "build.py", "--cache-dir", "cache", env=h100)
    assert first.returncode == 0, first.stderr
    assert (tmp_path / "kiln-out/genfiles/top/g.txt").read_text() == "gpu\n"
    assert "0 built" in kiln("build", "build.py", "--cache-dir", "cache", env=h100).stderr
    # Another device of the same need: run again, never served the H100's result.
    other = kiln("build", "build.py", "--cache-dir", "cache", "--explain", env=gh200)
    assert other.returncode == 0 and "1 built, 2 up to date" in other.stderr
    assert "Running top/g.txt: parameter  changed" in other.stderr
    fresh = kiln("build", "build.py", "--cache-dir", "cache", "--output-dir", "two", env=gh200)
    assert _outputs(tmp_path / "two")["g.txt"]["cached"] is True  # GH200's, saved above
    third = kiln("build", "build.py", "--cache-dir", "cache", "--output-dir", "three", env=h100)
    assert _outputs(tmp_path / "three")["g.txt"]["cached"] is True
    nobody = {"KILN_DEVICES": "cuda:sm_90=B200"}
    fourth = kiln("build", "build.py", "--cache-dir", "cache", "--output-dir", "four", env=nobody)
    assert fourth.returncode == 0 and fresh.returncode == 0 and third.returncode == 0
    assert _outputs(tmp_path / "four")["g.txt"]["cached"] is False


def test_a_need_that_is_no_device_is_a_definition_error(write_module: Any, kiln: Any) -> None:
    write_module("""
@entrypoint
def top():
    return run_command(name="t.txt", command=["true"], needs="tpu:v5")
""")
    r = kiln("build", "build.py")
    assert r.returncode == 2
    assert "needs='tpu:v5'" in r.stderr and "unknown device need" in r.stderr


def test_a_modules_need_comes_from_its_compile_flags() -> None:
    assert need_for_flags(["--iree-hal-target-device=cuda", "--iree-cuda-target=sm_90"]) == (
        "cuda:sm_90"
    )
    assert need_for_flags(["--iree-hal-target-device=hip", "--iree-rocm-target=gfx942"]) == (
        "hip:gfx942"
    )
    assert need_for_flags(["--iree-hal-target-device=vulkan", "--iree-vulkan-target=rdna3"]) == (
        "vulkan"
    )
    assert need_for_flags(["--iree-hal-target-device=local"]) == "cpu"
    assert need_for_flags(["--iree-hal-target-device=llvm-cpu"]) == "cpu"
    for bad in ("", "cuda:", "cuda:sm 90", "gpu", ":sm_90", "cuda:" + "x" * 65):
        with pytest.raises(BadNeed):
            parse_need(bad)


def test_a_stand_in_never_takes_a_real_devices_place() -> None:
    real = "cuda:sm_90@0123456789ab"
    fake = "cuda:sm_90@standin-0123456789ab"
    cluster = DeviceSet.of_ids("on the cluster", [fake, real, "hip:gfx942@ffffffffffff"])
    assert cluster.resolve("cuda:sm_90") == real and cluster.resolve("cuda") == real
    assert cluster.resolve("hip:gfx90a") is None
    assert cluster.key_part("hip:gfx90a") == {
        "needs": "hip:gfx90a",
        "device": None,
        "absent": "skip",
    }
    only_fake = DeviceSet.of_ids("on the cluster", [fake], require=True)
    assert only_fake.resolve("cuda:sm_90") == fake
    assert only_fake.key_part("cuda:sm_80")["absent"] == "fail"


@pytest.mark.parametrize("model", ["X\nY  stand-in (KILN_DEVICES)", "a\rb", "\x1b]0;t\x07"])
def test_a_stand_in_model_with_a_control_character_is_refused(kiln: Any, model: str) -> None:
    # A newline in the model printed as it was: a line of its own in 'kiln devices'.
    r = kiln("devices", env={"KILN_DEVICES": f"cuda:sm_90={model}"})
    assert r.returncode == 2, r.stdout
    assert "a model name is printable text" in r.stderr
    assert "\n" not in r.stderr.rstrip("\n") and "\x1b" not in r.stderr


def test_a_device_line_shows_what_a_worker_reports_escaped() -> None:
    """A worker's report (an nvidia-smi model name, say) reaches the listing escaped,
    one line per device: a newline in it forges no line of its own."""
    from kiln.cli.devices_cmd import _line

    line = _line({"id": "cuda:sm_90@1", "model": "H100\nkiln: all good \x1b[2J"})
    assert "\n" not in line and "\x1b" not in line and "H100" in line
