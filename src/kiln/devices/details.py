"""What identifies a device beyond what its driver says: a CPU's model and the
instruction-set extensions the compiler targets on it, and which row of
``nvidia-smi``'s table is which device iree.runtime enumerates.

A CPU's identity (``cpu_identity``) is its model and the instruction-set
extensions among ``/proc/cpuinfo``'s flags: the names in ``X86_ISA`` and
``ARM_ISA``, the Linux spellings of the extensions LLVM's host detection reports
(what ``--iree-llvmcpu-target-cpu=host`` and ``...-cpu-features=host`` resolve to
for the llvm-cpu backend), a fixed allow-list. Every other flag is the kernel's
or the hypervisor's word about the machine, not an instruction code can use:
bugs and their mitigations (``ibrs``, ``md_clear``, ``flush_l1d``), virtualization
(``hypervisor``, ``vmx``, ``ept``), timekeeping and power (``constant_tsc``,
``hwp``), kernel-synthesized flags (``rep_good``, ``cpuid``, ``evtstrm``). They
change with the kernel, its boot options and the hypervisor, so they are not
keyed: a kernel update does not re-key every CPU check. A flag the kernel clears
because it does not enable the extension (``clearcpuid=``, a hypervisor hiding
AVX-512) does change the identity: code compiled for it cannot run there. An
extension newer than this list is not keyed; a new CPU model that brings it has
a new model name anyway.

GPUs (``match_details``): ``nvidia-smi``'s rows are matched to the devices
iree.runtime enumerates by the device's UUID (IREE's CUDA driver gives
``GPU-<uuid>`` as a device's path, as ``nvidia-smi`` does) or PCI bus id, where
both sides say one; by position only where one side says none.
"""

from __future__ import annotations

import contextlib
import functools
import re
from collections.abc import Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any


def _names(text: str) -> frozenset[str]:
    return frozenset(text.split())


# /proc/cpuinfo's x86 flags that name an instruction-set extension.
X86_ISA = _names(
    """
    fpu cx8 cmov mmx fxsr sse sse2 pni pclmulqdq ssse3 fma cx16 sse4_1 sse4_2 movbe
    popcnt aes rdrand f16c avx xsave xsaveopt xsavec xsaves avx2 bmi1 bmi2 adx rdseed
    sha_ni clflushopt clwb abm 3dnowprefetch lahf_lm sse4a xop fma4 tbm lwp lm
    avx512f avx512dq avx512ifma avx512pf avx512er avx512cd avx512bw avx512vl
    avx512vbmi avx512_vbmi2 avx512_vnni avx512_bitalg avx512_vpopcntdq avx512_bf16
    avx512_fp16 avx512_vp2intersect avx512_4vnniw avx512_4fmaps avx_vnni avx_ifma
    avx_vnni_int8 avx_ne_convert avx_vnni_int16 amx_tile amx_int8 amx_bf16 amx_fp16
    amx_complex gfni vaes vpclmulqdq pku waitpkg movdiri movdir64b serialize cldemote
    enqcmd rdpid ptwrite shstk fsgsbase invpcid wbnoinvd clzero mwaitx rdpru uintr
    hreset cmpccxadd prefetchi sha512 sm3 sm4 user_shstk
    """
)

# /proc/cpuinfo's Arm "Features" that name an instruction-set extension.
ARM_ISA = _names(
    """
    fp asimd aes pmull sha1 sha2 crc32 atomics fphp asimdhp asimdrdm jscvt fcma lrcpc
    dcpop sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm ssbs sb
    paca pacg dcpodp sve2 sveaes svepmull svebitperm svesha3 svesm4 flagm2 frint
    svei8mm svef32mm svef64mm svebf16 i8mm bf16 dgh rng bti mte mte3 sme smei16i64
    smef64f64 smei8i32 smef16f32 smeb16f32 smef32f32 smefa64 wfxt ebf16 sveebf16
    cssc rprfm sve2p1 sme2 sme2p1 smei16i32 smebi32i32 smeb16b16 smef16f16 mops hbc
    svei16i32 lse128 lrcpc3 afp rpres
    """
)

_MODEL_KEYS = ("model name", "Model", "cpu model")


def first_cpu(lines: Iterable[str]) -> dict[str, str]:
    """The fields of the first processor ``/proc/cpuinfo``'s ``lines`` describe, in
    their order (its first block)."""
    fields: dict[str, str] = {}
    for line in lines:
        if not line.strip():
            if fields:
                break
            continue
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    return fields


@functools.cache
def host_cpu() -> Mapping[str, str]:
    """``first_cpu`` of this machine's ``/proc/cpuinfo`` (empty where there is none),
    read once per process: the device id and the host compile target both ask."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo", errors="replace") as f:
        return MappingProxyType(first_cpu(f))
    return MappingProxyType({})


def cpu_identity(fields: Mapping[str, str]) -> tuple[str, str]:
    """(model, features) of the processor whose ``/proc/cpuinfo`` fields (``first_cpu``)
    are ``fields``: features are its instruction-set
    extensions, sorted and space-separated. An Arm CPU without a model name is named
    by its implementer and part (what LLVM's host detection reads). Empty strings
    where it says none."""
    model = next((fields[k] for k in _MODEL_KEYS if fields.get(k)), "")
    if not model and fields.get("CPU implementer"):
        model = f"implementer {fields['CPU implementer']} part {fields.get('CPU part', '?')}"
    flags = (fields.get("flags") or fields.get("Features") or "").split()
    return model, " ".join(sorted(set(isa_features(flags))))


def isa_features(flags: Iterable[str]) -> list[str]:
    """The flags among ``flags`` that name an instruction-set extension."""
    return [f for f in flags if f in X86_ISA or f in ARM_ISA]


# -- GPUs -----------------------------------------------------------------------

# ``name`` last: the one free-text column (split at the first five commas).
NVIDIA_QUERY = "uuid,pci.bus_id,memory.total,driver_version,compute_cap,name"
_UUID = re.compile(r"^GPU-[0-9a-fA-F-]{32,40}$")
_BUS_ID = re.compile(r"^([0-9a-fA-F]{1,8}):([0-9a-fA-F]{1,2}):([0-9a-fA-F]{1,2})\.([0-7])$")


def nvidia_rows(lines: Sequence[str]) -> list[dict[str, Any]]:
    """``nvidia-smi --query-gpu=NVIDIA_QUERY --format=csv,noheader,nounits``'s rows,
    each as the details of one GPU (``identity``: its UUID and PCI bus id)."""
    out = []
    for row in lines:
        parts = [p.strip() for p in row.split(",", 5)]
        if len(parts) != 6:
            continue
        uuid, bus_id, mib, driver_version, compute_cap, name = parts
        out.append(
            {
                "identity": {i for i in (identity(uuid), identity(bus_id)) if i},
                "model": name,
                "memory": int(mib) * (1 << 20) if mib.isdigit() else None,
                "driver_version": driver_version,
                "arch": "sm_" + compute_cap.replace(".", ""),
            }
        )
    return out


def identity(text: object) -> str | None:
    """A GPU's stable identity in ``text``, one spelling whoever says it: a UUID
    (``gpu-<hex>``, lower case) or a PCI bus id (``pci-<domain>:<bus>:<dev>.<fn>``,
    the domain's leading zeros dropped); None where ``text`` is neither."""
    if not isinstance(text, str):
        return None
    text = text.strip()
    if _UUID.match(text):
        return "gpu-" + text[4:].replace("-", "").lower()
    bus = _BUS_ID.match(text)
    if bus:
        domain, number, device, function = (int(x, 16) for x in bus.groups())
        return f"pci-{domain:x}:{number:02x}:{device:02x}.{function}"
    return None


def match_details(
    found: Sequence[dict[str, Any]], details: Sequence[dict[str, Any]]
) -> list[dict[str, Any]]:
    """For each device iree.runtime found (its ``path``), the row of ``details``
    that is the same device: by identity where the device's path is one and the
    rows say theirs (none, ``{}``, where no row has it: another GPU's details are
    never taken), else the row at its position."""
    named = any(row.get("identity") for row in details)
    out = []
    for i, info in enumerate(found):
        own = identity(info.get("path"))
        if own is not None and named:
            out.append(next((r for r in details if own in r.get("identity", ())), {}))
        else:
            out.append(details[i] if i < len(details) else {})
    return out
