"""Where compiled modules run: the runtime driver of a compile target, the
runtime's tools and version, and the machine a benchmark measured (which device a
check runs on, and its identity in keys, is ``kiln.devices.identity``).

``MACHINE_POOL`` is the resource pool of kiln's computing actions (import,
compile, onnxruntime reference, verify, benchmark). A benchmark takes the pool
exclusively, so it never runs beside another benchmark or a compile; the others
share it (``--pool machine=N`` bounds them to N at once).
"""

from __future__ import annotations

import functools
import importlib.util
import os
import platform
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kiln.base.errors import ToolMissing
from kiln.devices.details import cpu_identity, host_cpu
from kiln.planning.code_key import distribution_version

MACHINE_POOL = "machine"
LOCAL_DRIVERS = ("local-task", "local-sync")


def driver_for_flags(flags: Sequence[str]) -> str:
    """The iree.runtime driver for a module compiled with ``flags``: ``local-task``
    for CPU and VMVX modules, else the HAL device (``cuda``, ``hip``, ``vulkan``)."""
    device = "local"
    for flag in flags:
        if flag.startswith("--iree-hal-target-device="):
            device = flag.split("=", 1)[1].split("[", 1)[0].split(":", 1)[0]
    return "local-task" if device in ("local", "llvm-cpu", "vmvx") else device


def runtime_tool(name: str) -> str:
    """The path of an iree-base-runtime executable (``iree-benchmark-module``, ...)."""
    spec = importlib.util.find_spec("iree._runtime_libs")
    if spec is None or spec.origin is None:
        raise ToolMissing("iree-base-runtime is not installed (pip install 'kiln[iree]')")
    exe = Path(spec.origin).parent / name
    if not exe.is_file():
        raise ToolMissing(f"iree-base-runtime has no {name} at {exe}")
    return str(exe)


@functools.cache
def runtime_version() -> str:
    """The installed iree-base-runtime's version (part of verify and benchmark keys),
    read once per process, as ``compiler_version``: every such action asks."""
    version = distribution_version("iree-base-runtime")
    if version is None:
        raise ToolMissing("iree-base-runtime is not installed (pip install 'kiln[iree]')")
    return version


def list_devices(driver: str) -> list[str]:
    """The devices of ``driver`` on this machine (``cuda://...`` lines), none when the
    driver's library or device is missing."""
    if driver in LOCAL_DRIVERS:
        return [f"{driver}://"]
    proc = subprocess.run(
        [runtime_tool("iree-run-module"), f"--list_devices={driver}"],
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        errors="replace",
        timeout=60,
    )
    if proc.returncode != 0:
        return []
    return [line.strip() for line in proc.stdout.splitlines() if "://" in line]


@functools.cache
def cpu_model() -> str:
    """The machine's CPU model name, as /proc/cpuinfo says (else platform's guess);
    read once per process (``kiln.devices.details.host_cpu``): every benchmark's key
    asks."""
    found = cpu_identity(host_cpu())[0]  # as the device id names it
    return found or platform.processor() or platform.machine() or "unknown"


def machine() -> dict[str, Any]:
    """What identifies this machine in a benchmark's key and result."""
    return {"cpu": cpu_model(), "cpus": os.cpu_count() or 1, "arch": platform.machine()}
