"""What a compile for the host CPU means on this machine.

``--target cpu`` (``cpu:host``) asks iree-compile for code specialised to the
CPU it runs on (``--iree-llvmcpu-target-cpu=host``), and an llvm-cpu target
without a target triple compiles for the machine's architecture. Such flags mean
different code on different machines, so they cannot be a key: kiln asks the
installed compiler what they resolve to here (its CPU name, CPU features and
target triple, read from the executable target it configures for a one-line
program, about half a second) and compiles with those values spelled out. The
key, the manifest and a Dask worker then all see the same explicit target: a
cache hit never hands code for another CPU, and a worker with another CPU
compiles for this one.

The answers are kept in ``.kiln/host-targets.json`` in the output directory, by
compiler version, by a fingerprint of this machine's CPU (``/proc/cpuinfo``'s
identity and feature flags) and by the flags asked about, so a build asks the
compiler once per target, not every time.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import platform
import re
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kiln.actions._compiler import configure_probe
from kiln.base.errors import ToolError
from kiln.devices.details import host_cpu
from kiln.output_dir.layout import HOST_MEMO as _MEMO

_CPU = "--iree-llvmcpu-target-cpu="
_FEATURES = "--iree-llvmcpu-target-cpu-features="
_TRIPLE = "--iree-llvmcpu-target-triple="
_MEMO_MAX = 1 << 20
_TARGET = re.compile(r'#hal\.executable\.target<"llvm-cpu",\s*"[^"]*",\s*\{(?P<attrs>[^}]*)\}>')
_ATTR = re.compile(r'(\w+)\s*=\s*"([^"]*)"')
# The lines of /proc/cpuinfo that say which CPU this is (x86, then Arm).
_CPUINFO_FIELDS = frozenset(
    {"vendor_id", "cpu family", "model", "model name", "stepping", "flags"}
    | {"Features", "CPU implementer", "CPU architecture", "CPU variant", "CPU part"}
)
_LOCK = threading.Lock()
_SEEN: dict[str, dict[str, str]] = {}  # answers of this process, by memo key
_SAVED: dict[str, set[str]] = {}  # the memo keys known to be in each memo file


def is_llvm_cpu(flags: Sequence[str]) -> bool:
    """Whether ``flags`` compile for IREE's llvm-cpu backend."""
    return any(
        f
        in ("--iree-hal-target-device=llvm-cpu", "--iree-hal-local-target-device-backends=llvm-cpu")
        or f.startswith("--iree-hal-target-device=llvm-cpu")
        for f in flags
    )


def depends_on_host(flags: Sequence[str]) -> bool:
    """Whether an llvm-cpu compile with ``flags`` makes code that depends on this
    machine: a ``host`` CPU, or no target triple (the machine's architecture)."""
    if not is_llvm_cpu(flags):
        return False
    cpu = _last(flags, _CPU)
    return cpu == "host" or _last(flags, _TRIPLE) is None


def resolve(
    flags: Sequence[str], compiler: str, kiln_dir: Path | None, write: bool
) -> dict[str, str]:
    """What the host-dependent parts of ``flags`` mean here: ``cpu``, ``cpu_features``
    and ``triple`` as the installed compiler (version ``compiler``) configures them,
    from the memo in ``kiln_dir`` when it has them, else by asking the compiler (and,
    with ``write``, adding the answer to the memo)."""
    target = [f for f in flags if f.startswith(("--iree-hal-", "--iree-llvmcpu-"))]
    key = hashlib.sha256(json.dumps([compiler, _fingerprint(), target]).encode()).hexdigest()
    with _LOCK:
        found = _SEEN.get(key) or _read_memo(kiln_dir).get(key)
        if not _valid(found):
            found = _probe(target)
        assert isinstance(found, dict)
        _SEEN[key] = found
    if write:
        save(kiln_dir)
    return found


def save(kiln_dir: Path | None) -> None:
    """Add the answers the compiler gave to the memo in ``kiln_dir``, when that is
    kiln's already (a build keys its actions before it claims a new output
    directory: the compile that runs saves them; the commands that must write
    nothing never save)."""
    from kiln.output_dir.ownership import MARKER
    from kiln.output_dir.writing import atomic_write

    if kiln_dir is None or not (kiln_dir / MARKER).is_file() or kiln_dir.is_symlink():
        return
    with _LOCK:
        saved = _SAVED.setdefault(str(kiln_dir), set())
        if saved.issuperset(_SEEN):
            return
        entries = _read_memo(kiln_dir)
        saved.update(entries)
        if saved.issuperset(_SEEN):
            return
        entries.update(_SEEN)
        with contextlib.suppress(OSError), atomic_write(kiln_dir / _MEMO, "w") as f:
            json.dump({"format": 1, "entries": entries}, f, sort_keys=True)
        saved.update(entries)


def explicit_flags(flags: Sequence[str], host: dict[str, str]) -> list[str]:
    """``flags`` with the host spelled out: the CPU name and features in place of
    ``host``, and the target triple when none was given."""
    out = list(flags)
    if _last(flags, _CPU) == "host":
        out = [f for f in out if not f.startswith((_CPU, _FEATURES))]
        out += [_CPU + host["cpu"], _FEATURES + host["cpu_features"]]
    if _last(flags, _TRIPLE) is None and host.get("triple"):
        out.append(_TRIPLE + host["triple"])
    return out


def _last(flags: Sequence[str], prefix: str) -> str | None:
    values = [f[len(prefix) :] for f in flags if f.startswith(prefix)]
    return values[-1] if values else None


def _valid(found: Any) -> bool:
    return isinstance(found, dict) and all(
        isinstance(found.get(k), str) for k in ("cpu", "cpu_features", "triple")
    )


def _fingerprint() -> str:
    """This machine's CPU as the compiler's host detection sees it: its identity and
    feature flags (the first processor of ``/proc/cpuinfo``) and architecture."""
    fields = [platform.machine()]
    fields += [f"{k}={v}" for k, v in host_cpu().items() if k in _CPUINFO_FIELDS]
    return hashlib.sha256("\n".join(fields).encode()).hexdigest()


def _probe(target: list[str]) -> dict[str, str]:
    """Ask iree-compile which llvm-cpu target ``target`` configures here."""
    proc = configure_probe(target, "-", timeout=300)
    match = _TARGET.search(proc.stdout)
    if proc.returncode != 0 or match is None:
        lines = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
        why = lines[0].split("error:", 1)[1].strip() if lines else f"status {proc.returncode}"
        raise ToolError(f"iree-compile cannot say what the host CPU target is here: {why}")
    attrs = dict(_ATTR.findall(match["attrs"]))
    return {
        "cpu": attrs.get("cpu", ""),
        "cpu_features": attrs.get("cpu_features", ""),
        "triple": attrs.get("target_triple", ""),
    }


def _read_memo(kiln_dir: Path | None) -> dict[str, Any]:
    if kiln_dir is None:
        return {}
    from kiln.output_dir.ownership import read_regular

    try:
        data = json.loads(read_regular(kiln_dir / _MEMO, _MEMO_MAX))
    except (OSError, ValueError):
        return {}
    entries = data.get("entries") if isinstance(data, dict) else None
    return entries if isinstance(entries, dict) else {}
