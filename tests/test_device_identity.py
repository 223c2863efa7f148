"""What a device's identity holds, through ``kiln devices --json``: a CPU's model
and its instruction-set extensions only (``/proc/cpuinfo``'s other flags are the
kernel's and the hypervisor's), GPUs matched to ``nvidia-smi``'s rows by their
UUID or PCI bus id, and ``KILN_DEVICES`` naming each stand-in once.

The CPU is given by a stand-in ``/proc/cpuinfo`` bind-mounted over the real one
in a private mount namespace (``unshare``); the GPUs by a stand-in
``iree.runtime`` (its device enumeration) and a stand-in ``nvidia-smi`` that
answers whatever columns it is asked for."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

X86 = {
    "processor": "0",
    "vendor_id": "AuthenticAMD",
    "cpu family": "25",
    "model": "17",
    "model name": "AMD EPYC 9654 96-Core Processor",
    "microcode": "0xa101148",
    "flags": "fpu cx8 cmov sse sse2 pni ssse3 sse4_1 sse4_2 avx avx2 fma bmi1 bmi2 "
    "avx512f avx512bw avx512vl avx512_bf16 constant_tsc rep_good nopl cpuid",
    "bugs": "sysret_ss_attrs spectre_v1 spectre_v2",
}
ARM = {
    "processor": "0",
    "BogoMIPS": "2000.00",
    "Features": "fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics cpuid asimddp sve sve2",
    "CPU implementer": "0x41",
    "CPU part": "0xd4f",
    "CPU revision": "1",
}


def _cpuinfo(fields: dict[str, str], cores: int = 2) -> str:
    block = "".join(f"{k}\t: {v}\n" for k, v in fields.items())
    return "\n".join(block.replace("processor\t: 0", f"processor\t: {i}") for i in range(cores))


def _can_mount() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", "mount --bind /proc/version /proc/cpuinfo"],
        capture_output=True,
    )
    return probe.returncode == 0


needs_mount = pytest.mark.skipif(
    not _can_mount(), reason="needs unprivileged mount namespaces (unshare -rm)"
)


def _devices(tmp_path: Path, *, cpuinfo: str | None = None, **env: str) -> Any:
    """``kiln devices --json``'s devices here, with ``cpuinfo`` as /proc/cpuinfo."""
    argv = [sys.executable, "-m", "kiln", "devices", "--json"]
    if cpuinfo is not None:
        fake = tmp_path / f"cpuinfo-{abs(hash(cpuinfo))}"
        fake.write_text(cpuinfo)
        script = 'mount --bind "$0" /proc/cpuinfo && exec "$@"'
        argv = ["unshare", "-rm", "sh", "-c", script, str(fake), *argv]
    proc = subprocess.run(
        argv, capture_output=True, text=True, timeout=120, env={**os.environ, **env}
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)["here"]


def _cpu(tmp_path: Path, fields: dict[str, str]) -> dict[str, Any]:
    (cpu,) = [d for d in _devices(tmp_path, cpuinfo=_cpuinfo(fields)) if d["kind"] == "cpu"]
    return cpu


def _with(fields: dict[str, str], **changes: str) -> dict[str, str]:
    return {**fields, **{k.replace("_", " "): v for k, v in changes.items()}}


@needs_mount
def test_a_cpus_id_is_its_model_and_isa_not_the_kernels_flags(tmp_path: Path) -> None:
    base = _cpu(tmp_path, X86)
    assert base["model"] == X86["model name"]
    assert "avx512f" in base["features"] and "rep_good" not in base["features"]
    flags = X86["flags"]
    same = [
        # a hypervisor, mitigations a kernel update turned on, kernel-made flags
        _with(X86, flags=flags + " hypervisor md_clear ibrs ibpb stibp flush_l1d ssbd"),
        _with(X86, flags=flags.replace(" rep_good nopl", "") + " tsc_known_freq"),
        _with(X86, flags=flags + " some_flag_of_a_future_kernel"),
        _with(X86, bugs="spectre_v1 spectre_v2 retbleed srso gds"),
        _with(X86, microcode="0xa101155"),
        _with(X86, flags=" ".join(reversed(flags.split()))),  # order says nothing
    ]
    for fields in same:
        assert _cpu(tmp_path, fields)["id"] == base["id"], fields
    different = [
        _with(X86, flags=flags.replace(" avx512f", "")),  # a kernel or hypervisor hid it
        _with(X86, flags=flags + " avx512_vnni"),
        _with(X86, model_name="AMD EPYC 7763 64-Core Processor"),
    ]
    ids = {_cpu(tmp_path, fields)["id"] for fields in different}
    assert base["id"] not in ids and len(ids) == len(different)


@needs_mount
def test_an_arm_cpus_id_holds_its_part_and_isa_not_the_kernels_flags(tmp_path: Path) -> None:
    base = _cpu(tmp_path, ARM)
    assert base["model"] == "implementer 0x41 part 0xd4f"
    assert "sve2" in base["features"] and "evtstrm" not in base["features"]
    features = ARM["Features"]
    no_kernel_flags = features.replace(" evtstrm", "").replace(" cpuid", "")
    assert _cpu(tmp_path, _with(ARM, Features=no_kernel_flags))["id"] == base["id"]
    assert _cpu(tmp_path, _with(ARM, CPU_revision="2"))["id"] == base["id"]
    assert _cpu(tmp_path, _with(ARM, Features=features.replace(" sve2", "")))["id"] != base["id"]
    assert _cpu(tmp_path, _with(ARM, CPU_part="0xd40"))["id"] != base["id"]


# -- GPUs ---------------------------------------------------------------------

# Two GPUs as nvidia-smi lists them (its order: PCI bus order).
SMI = [
    {
        "uuid": "GPU-aaaaaaaa-1111-2222-3333-444444444444",
        "pci.bus_id": "00000000:17:00.0",
        "name": "NVIDIA A100-SXM4-80GB",
        "memory.total": "81920",
        "driver_version": "550.54.15",
        "compute_cap": "8.0",
    },
    {
        "uuid": "GPU-bbbbbbbb-5555-6666-7777-888888888888",
        "pci.bus_id": "00000000:65:00.0",
        "name": "NVIDIA H100 80GB HBM3",
        "memory.total": "81559",
        "driver_version": "550.54.15",
        "compute_cap": "9.0",
    },
]

_FAKE_SMI = """#!{python}
import json, sys
rows = json.load(open({table!r}))
query = [a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--query-gpu=")]
if not query:
    sys.exit(1)
for row in rows:
    print(", ".join(row[c] for c in query[0].split(",")))
"""

_FAKE_RUNTIME = """
import json, os
_DEVICES = json.loads(os.environ["FAKE_IREE_DEVICES"])

def query_available_drivers():
    return ["cuda", "local-sync", "local-task"]

class _Driver:
    def __init__(self, name):
        self.name = name
    def query_available_devices(self):
        return _DEVICES.get(self.name, [])

def get_driver(name):
    return _Driver(name)
"""


def _gpus(tmp_path: Path, iree: list[dict[str, Any]], smi: list[dict[str, str]]) -> Any:
    """The cuda devices ``kiln devices --json`` lists where iree.runtime enumerates
    ``iree`` and nvidia-smi says ``smi``."""
    runtime = tmp_path / "fake" / "iree" / "runtime"
    runtime.mkdir(parents=True, exist_ok=True)
    (runtime / "__init__.py").write_text(_FAKE_RUNTIME)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    table = tmp_path / "smi.json"
    table.write_text(json.dumps(smi))
    tool = bin_dir / "nvidia-smi"
    tool.write_text(_FAKE_SMI.format(python=sys.executable, table=str(table)))
    tool.chmod(0o755)
    env = {
        "PYTHONPATH": os.pathsep.join([str(tmp_path / "fake"), os.environ.get("PYTHONPATH", "")]),
        "PATH": os.pathsep.join([str(bin_dir), os.environ["PATH"]]),
        "FAKE_IREE_DEVICES": json.dumps({"cuda": iree}),
    }
    return [d for d in _devices(tmp_path, **env) if d["kind"] == "cuda"]


def _iree(uuid: str, name: str, device_id: int) -> dict[str, Any]:
    return {"device_id": device_id, "path": uuid, "name": name}


def test_gpus_are_matched_to_nvidia_smi_by_uuid_not_position(tmp_path: Path) -> None:
    a, b = SMI
    # iree.runtime enumerates in CUDA's order (fastest first), not the PCI order.
    found = _gpus(tmp_path, [_iree(b["uuid"], "H100", 1), _iree(a["uuid"], "A100", 2)], [a, b])
    by_arch = {d["arch"]: d for d in found}
    assert set(by_arch) == {"sm_90", "sm_80"}
    assert by_arch["sm_90"]["model"] == "NVIDIA H100 80GB HBM3"
    assert by_arch["sm_90"]["memory"] == 81559 << 20
    assert by_arch["sm_80"]["model"] == "NVIDIA A100-SXM4-80GB"
    # CUDA_VISIBLE_DEVICES: iree.runtime sees one GPU, nvidia-smi lists them all.
    (only,) = _gpus(tmp_path, [_iree(b["uuid"].upper(), "H100", 1)], [a, b])
    assert only["arch"] == "sm_90" and only["model"] == "NVIDIA H100 80GB HBM3"


def test_a_gpu_nvidia_smi_does_not_list_takes_no_other_gpus_details(tmp_path: Path) -> None:
    a, _ = SMI
    lone = "GPU-cccccccc-0000-0000-0000-000000000000"
    (gpu,) = _gpus(tmp_path, [_iree(lone, "NVIDIA L4", 1)], [a])
    assert gpu["arch"] == "" and gpu["model"] == "NVIDIA L4" and gpu["memory"] is None


def test_gpus_match_by_pci_bus_id_and_by_position_without_identity(tmp_path: Path) -> None:
    a, b = SMI
    (gpu,) = _gpus(tmp_path, [_iree("0000:65:00.0", "H100", 1)], [a, b])
    assert gpu["arch"] == "sm_90"
    # Neither side names the device: the rows are taken in order, as before.
    no_ids = [{**row, "uuid": "[N/A]", "pci.bus_id": "[N/A]"} for row in (a, b)]
    found = _gpus(tmp_path, [_iree("", "first", 1), _iree("", "second", 2)], no_ids)
    assert [d["arch"] for d in found] == ["sm_80", "sm_90"]


def test_a_gpu_name_with_a_comma_keeps_its_row(tmp_path: Path) -> None:
    a, _ = SMI
    named = {**a, "name": "NVIDIA A100, PCIe"}
    (gpu,) = _gpus(tmp_path, [_iree(a["uuid"], "A100", 1)], [named])
    assert gpu["arch"] == "sm_80" and gpu["model"] == "NVIDIA A100, PCIe"


# -- stand-ins ----------------------------------------------------------------


@pytest.mark.parametrize(
    "given, twice",
    [
        ("cuda:sm_90=H100,cuda:sm_90=H100", "cuda:sm_90=H100"),
        ("hip:gfx942, cuda:sm_90 ,hip:gfx942", "hip:gfx942"),
        ("cuda:sm_90,cuda:sm_90=stand-in", "cuda:sm_90=stand-in"),  # one id, two spellings
    ],
)
def test_a_stand_in_named_twice_is_refused_naming_it(kiln: Any, given: str, twice: str) -> None:
    r = kiln("devices", env={"KILN_DEVICES": given})
    assert r.returncode == 2 and f"{twice!r} declares the same device" in r.stderr
    assert "Traceback" not in r.stderr


def test_stand_ins_of_one_kind_and_different_models_are_two_devices(kiln: Any) -> None:
    r = kiln("devices", "--json", env={"KILN_DEVICES": "cuda:sm_90=H100,cuda:sm_90=GH200"})
    listed = [d for d in json.loads(r.stdout)["here"] if d["stand_in"]]
    assert sorted(d["model"] for d in listed) == ["GH200", "H100"]
    assert len({d["id"] for d in listed}) == 2
