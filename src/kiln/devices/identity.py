"""The devices a machine has, what an action needs of one, and which device a
build's checks run on.

``Device`` is a device's identity: its kind (``cpu``, ``cuda``, ``hip``,
``vulkan``), architecture (``x86_64``, ``sm_90``, ``gfx942``), model, memory, the
IREE runtime driver that runs modules on it, the driver's and the runtime's
versions and, for a CPU, the features the compiler targets. ``Device.id`` names it
in keys, manifests and Dask worker resources: ``cuda:sm_90@3fa9c2d1e0b4``, the
kind and architecture then a digest of every field. Two devices with one id are
the same in every field a result could depend on.

A *need* is what an action asks of a device: ``cuda:sm_90`` (a kind and an
architecture) or ``cuda`` (any device of that kind); ``need_for_flags`` derives
it from a module's compile flags. A device satisfies a need when its kind is the
need's and, when the need names one, so is its architecture.

Where the devices come from: the host CPU (``/proc/cpuinfo``), and for each GPU
driver of iree.runtime, its device enumeration (``query_available_devices``),
with ``nvidia-smi``/``rocm_agent_enumerator`` for the architecture, memory and
driver version where they are installed. ``KILN_DEVICES`` adds *stand-in*
devices (``KILN_DEVICES=cuda:sm_90=H100,hip:gfx942``): a machine, or a Dask
worker, then advertises devices it does not have, to try placement without them.
A stand-in's id says so (``cuda:sm_90@standin-...``) and differs from every real
device's; a check placed on one runs no module (its result is "skipped").

``DeviceSet`` is the devices a build's checks can run on (this machine's, or a
cluster's) and picks, for each need, the one device its checks run on
(``resolve``): the key of a check holds that device's id (``key_part``), the
cluster places the check where that device is.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from kiln.base.errors import BadNeed
from kiln.devices.details import NVIDIA_QUERY, cpu_identity, host_cpu, match_details, nvidia_rows

STAND_IN_VAR = "KILN_DEVICES"
RESOURCE_PREFIX = "kiln-device:"  # a Dask worker resource per device it has
KINDS = ("cpu", "cuda", "hip", "vulkan")
GPU_DRIVERS = ("cuda", "hip", "vulkan")
_ARCH = re.compile(r"^[A-Za-z0-9_.+-]{1,64}$")
_STAND_IN = "standin-"


@dataclass(frozen=True)
class Device:
    """One device's identity (see the module docstring); plain values throughout."""

    kind: str
    arch: str
    model: str
    driver: str  # the iree.runtime driver that runs modules on it
    memory: int | None = None  # bytes
    driver_version: str = ""
    runtime_version: str = ""
    features: str = ""  # a CPU's: what the compiler targets on it
    stand_in: bool = False

    @property
    def id(self) -> str:
        text = json.dumps(dataclasses.asdict(self), sort_keys=True)
        digest = hashlib.sha256(text.encode()).hexdigest()[:12]
        return f"{self.kind}:{self.arch}@{_STAND_IN if self.stand_in else ''}{digest}"

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["features"] = _short_features(self.features)
        return {"id": self.id, **out}


def _short_features(features: str) -> str:
    return features if len(features) <= 200 else features[:200] + "..."


def parse_need(text: str) -> tuple[str, str]:
    """``kind[:arch]`` as (kind, arch); BadNeed naming what is wrong."""
    if not isinstance(text, str):
        raise BadNeed(f"a device need is a string like 'cuda:sm_90', got {text!r}")
    kind, colon, arch = text.strip().partition(":")
    if kind not in KINDS or ((arch or colon) and _ARCH.match(arch) is None):
        raise BadNeed(
            f"unknown device need {text!r}: give kind[:arch] with kind one of "
            f"{', '.join(KINDS)} (e.g. 'cuda:sm_90', 'hip:gfx942', 'vulkan', 'cpu')"
        )
    return kind, arch


def id_satisfies(device_id: str, need: str) -> bool:
    """Whether the device named ``device_id`` satisfies ``need``."""
    kind, arch = parse_need(need)
    head = device_id.split("@", 1)[0]
    dkind, _, darch = head.partition(":")
    return dkind == kind and (not arch or darch == arch)


def is_stand_in(device_id: str) -> bool:
    return device_id.split("@", 1)[-1].startswith(_STAND_IN)


def need_for_flags(flags: Sequence[str]) -> str:
    """The need of a module compiled with ``flags``: its HAL device's kind and,
    for CUDA and HIP, the architecture compiled for; ``cpu`` for local modules."""
    kind = "cpu"
    arch = ""
    for flag in flags:
        name, _, value = flag.partition("=")
        if name == "--iree-hal-target-device":
            device = value.split("[", 1)[0].split(":", 1)[0]
            kind = device if device in GPU_DRIVERS else "cpu"
        elif name in ("--iree-cuda-target", "--iree-rocm-target", "--iree-hip-target"):
            arch = value
    return f"{kind}:{arch}" if kind in ("cuda", "hip") and arch else kind


def need_for_driver(driver: str) -> str:
    """The need of a run on iree.runtime driver ``driver`` (``local-task``: ``cpu``)."""
    return driver if driver in GPU_DRIVERS else "cpu"


# -- this machine's devices ---------------------------------------------------


def _runtime_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("iree-base-runtime")
    except PackageNotFoundError:
        return ""


@functools.cache
def cpu_device() -> Device:
    """The host CPU: its model and the instruction-set extensions the compiler
    targets on it (``kiln.devices.details.cpu_identity``, from ``/proc/cpuinfo``)."""
    model, features = cpu_identity(host_cpu())
    return Device(
        kind="cpu",
        arch=platform.machine() or "unknown",
        model=model or platform.processor() or "unknown",
        driver="local-task",
        runtime_version=_runtime_version(),
        features=features,
    )


def _tool_lines(argv: list[str]) -> list[str]:
    if shutil.which(argv[0]) is None:
        return []
    try:
        proc = subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.SubprocessError):
        return []
    return proc.stdout.splitlines() if proc.returncode == 0 else []


def _nvidia_details() -> list[dict[str, Any]]:
    query = ["nvidia-smi", f"--query-gpu={NVIDIA_QUERY}", "--format=csv,noheader,nounits"]
    return nvidia_rows(_tool_lines(query))


def _hip_details() -> list[dict[str, Any]]:
    archs = [a.strip() for a in _tool_lines(["rocm_agent_enumerator"])]
    return [{"arch": a} for a in archs if a.startswith("gfx") and a != "gfx000"]


# Run in a child process: iree.runtime takes seconds to import and prints
# reference-leak reports at exit.
_ENUMERATE = """
import json, sys
import iree.runtime as rt
out = {}
for name in sys.argv[1:]:
    try:
        if name in rt.query_available_drivers():
            out[name] = list(rt.get_driver(name).query_available_devices())
    except Exception:
        pass
print(json.dumps(out, default=str))
"""


@functools.cache
def _iree_enumeration() -> dict[str, list[dict[str, Any]]]:
    """iree.runtime's devices of each GPU driver here; none of a driver whose
    library or device is missing (or without iree-base-runtime)."""
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _ENUMERATE, *GPU_DRIVERS],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=120,
        )
        found = json.loads(proc.stdout.strip().splitlines()[-1]) if proc.returncode == 0 else {}
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {}
    return found if isinstance(found, dict) else {}


def _iree_devices(driver: str) -> list[dict[str, Any]]:
    devices = _iree_enumeration().get(driver)
    return [d for d in devices if isinstance(d, dict)] if isinstance(devices, list) else []


@functools.cache
def gpu_devices(driver: str) -> tuple[Device, ...]:
    """The devices of GPU driver ``driver`` on this machine, as iree.runtime finds them."""
    found = _iree_devices(driver)
    if not found:
        return ()
    details = {"cuda": _nvidia_details, "hip": _hip_details}.get(driver, list)()
    out = []
    for info, more in zip(found, match_details(found, details), strict=True):
        out.append(
            Device(
                kind=driver,
                arch=str(more.get("arch", "")),
                model=str(more.get("model") or info.get("name") or "unknown"),
                driver=driver,
                memory=more.get("memory"),
                driver_version=str(more.get("driver_version", "")),
                runtime_version=_runtime_version(),
            )
        )
    return tuple(out)


def stand_ins(text: str | None) -> list[Device]:
    """The stand-in devices ``KILN_DEVICES`` declares: ``kind[:arch][=model]``,
    comma-separated; BadNeed for an entry that is not, and for two entries that
    declare one device (one id: a worker advertises a device once, whatever the
    count; the same model named twice is one device, not two)."""
    out: list[Device] = []
    seen: dict[str, str] = {}
    for entry in (text or "").split(","):
        if not entry.strip():
            continue
        need, _, model = entry.strip().partition("=")
        try:
            kind, arch = parse_need(need)
        except BadNeed as e:
            raise BadNeed(f"{STAND_IN_VAR}={text!r}: {e}") from None
        if not model.isprintable():  # a newline in it forged a line of the listing
            raise BadNeed(f"{STAND_IN_VAR}={text!r}: a model name is printable text")
        driver = kind if kind in GPU_DRIVERS else "local-task"
        device = Device(kind, arch, model or "stand-in", driver, stand_in=True)
        if device.id in seen:
            raise BadNeed(
                f"{STAND_IN_VAR}={text!r}: {entry.strip()!r} declares the same device as "
                f"{seen[device.id]!r}; name each stand-in device once"
            )
        seen[device.id] = entry.strip()
        out.append(device)
    return out


def local_devices(kinds: Iterable[str] = KINDS) -> list[Device]:
    """This machine's devices of ``kinds``: the CPU, each GPU driver's, the stand-ins."""
    wanted = set(kinds)
    out = [cpu_device()] if "cpu" in wanted else []
    for driver in GPU_DRIVERS:
        if driver in wanted:
            out += gpu_devices(driver)
    out += [d for d in stand_ins(os.environ.get(STAND_IN_VAR)) if d.kind in wanted]
    return out


def resources(devices: Iterable[Device], slots: int = 1) -> dict[str, float]:
    """The Dask worker resources that advertise ``devices``: one per device id
    (``slots`` of a CPU, one of any other: a GPU runs one check at a time)."""
    return {RESOURCE_PREFIX + d.id: float(slots if d.kind == "cpu" else 1) for d in devices}


# -- the devices of a build ---------------------------------------------------


class DeviceSet:
    """The devices a build's checks can run on, ``where`` (``here``, ``on the
    cluster``), and for each need the one they run on.

    Invariant: ``resolve`` answers the same for a need for the life of the set
    (the smallest id that satisfies it, among the ids ``ids_of(kind)`` gave when
    first asked): a check's key and its placement name the same device.
    ``require``: a check whose device is absent fails instead of being skipped.
    An ``undecided`` set (``UNDECIDED``) answers no ``resolve`` (it raises).
    """

    def __init__(
        self,
        where: str,
        ids_of: Callable[[str], Iterable[str]] | None,
        require: bool = False,
    ):
        self.where = where
        self.require = require
        self.decided = ids_of is not None
        self._ids_of = ids_of
        self._lock = threading.Lock()
        self._memo: dict[str, str | None] = {}

    @classmethod
    def local(cls, require: bool = False) -> DeviceSet:
        return cls("here", lambda kind: [d.id for d in local_devices([kind])], require)

    @classmethod
    def of_ids(cls, where: str, ids: Iterable[str], require: bool = False) -> DeviceSet:
        known = sorted(set(ids))
        return cls(where, lambda kind: [i for i in known if i.split(":", 1)[0] == kind], require)

    def resolve(self, need: str) -> str | None:
        """The id of the device ``need``'s checks run on; None: there is none."""
        with self._lock:
            if need not in self._memo:
                kind, _ = parse_need(need)
                if self._ids_of is None:
                    raise RuntimeError(f"which device {need!r} names is not decided yet")
                matching = sorted(i for i in self._ids_of(kind) if id_satisfies(i, need))
                self._memo[need] = matching[0] if matching else None
            return self._memo[need]

    def absent_reason(self, need: str) -> str:
        return f"no {need} device {self.where}"

    def key_part(self, need: str) -> dict[str, Any]:
        """What the key of an action that needs ``need`` holds: the device's id, or
        that there is none and what happens then (skipped, or failed)."""
        if not self.decided:  # the need is checked; the build keys it again (KeyMaker)
            parse_need(need)
            return {"needs": need, "device": "(undecided)"}
        device = self.resolve(need)
        part: dict[str, Any] = {"needs": need, "device": device}
        if device is None:
            part["absent"] = "fail" if self.require else "skip"
        return part


# The devices of a plan checked before its build has chosen where its checks run
# (``kiln build`` connects to its cluster after checking the plan): keying with it
# enumerates no device, and no key made with it is used (``PlanChecker.keys``).
UNDECIDED = DeviceSet("(not decided yet)", None)

_LOCAL: DeviceSet | None = None


def local_set() -> DeviceSet:
    """This process's devices (one set per process: its answers never change)."""
    global _LOCAL
    if _LOCAL is None:
        _LOCAL = DeviceSet.local()
    return _LOCAL
