"""Compile targets: the ``--target`` values (``cpu``, ``cpu:<cpu name>``, ``vmvx``,
``hip:<chip>``, ``vulkan:<target>``, ``cuda:<sm>``), the iree-compile flags each
one selects, its short name in output paths and the runtime driver that runs what
was compiled for it.

Pure functions of the text, no tool run: the command line checks a value with
them before anything loads, and the compile and verify actions derive their
flags and names from them. A value of no known form is a ``UsageError`` listing
the valid ones.
"""

from __future__ import annotations

import re

from kiln.base.errors import UsageError

TARGET_FORMS = "cpu, cpu:host, cpu:<cpu name>, vmvx, hip:<chip>, vulkan:<target>, cuda:<sm>"
_TARGET_ARG = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]*\Z")
_UNSAFE_NAME_CHARS = re.compile(r"[^A-Za-z0-9_.+-]+")


def parse_target(spec: str) -> tuple[str, str]:
    """Split a ``--target`` value into (kind, argument), rejecting unknown forms."""
    kind, colon, arg = spec.strip().partition(":")
    kind = kind.lower()
    if kind == "cpu" and not colon:
        arg = "host"
    valid = kind in ("cpu", "hip", "vulkan", "cuda") and _TARGET_ARG.match(arg) is not None
    if valid or (kind == "vmvx" and not arg):
        return kind, arg
    raise UsageError(f"unknown --target {spec!r}; valid forms: {TARGET_FORMS}")


def target_flags(spec: str) -> list[str]:
    """Return the iree-compile flags selecting the device named by a ``--target`` value."""
    kind, arg = parse_target(spec)
    if kind == "cpu":
        return [
            "--iree-hal-target-device=local",
            "--iree-hal-local-target-device-backends=llvm-cpu",
            f"--iree-llvmcpu-target-cpu={arg}",
        ]
    if kind == "vmvx":
        return ["--iree-hal-target-device=local", "--iree-hal-local-target-device-backends=vmvx"]
    option = {"hip": "--iree-rocm-target", "vulkan": "--iree-vulkan-target"}.get(
        kind, "--iree-cuda-target"
    )
    return [f"--iree-hal-target-device={kind}", f"{option}={arg}"]


def target_name(spec: str) -> str:
    """Return the name a target gives its compiled modules (``<name>_<target>.vmfb``),
    spelled as iree.build spells its target machines: ``cpu-host``, ``cpu-znver4``,
    ``hip-gfx942``, ``vmvx``; ``vulkan-rdna3`` and ``cuda-sm_80`` by the same rule."""
    kind, arg = parse_target(spec)
    if kind == "vmvx":
        return kind
    return _UNSAFE_NAME_CHARS.sub("_", f"{kind}-{arg}")


def target_driver(spec: str) -> str:
    """Return the iree.runtime driver that runs modules compiled for a target."""
    kind, _ = parse_target(spec)
    return "local-task" if kind in ("cpu", "vmvx") else kind
