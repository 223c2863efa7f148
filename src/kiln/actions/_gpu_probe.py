"""Checking GPU ``--target`` names against the installed compiler before any compile.

iree-compile accepts any ``--iree-cuda-target`` string and fails only deep in the
pipeline (iree-base-compiler 3.13: ``cuda:sm_90`` gives "missing GPU target"), or
aborts on an unknown name. So kiln asks the compiler itself: it compiles a
one-line program up to ``executable-configurations`` (about 0.2 s) for the
target. When that fails, it probes the architectures of ``CANDIDATES`` newest
first and suggests the first the compiler accepts. The candidates are only names
to try: what is supported is always the installed compiler's answer.
"""

from __future__ import annotations

import os

from kiln.actions._compiler import configure_probe
from kiln.base.compile_targets import parse_target, target_flags
from kiln.base.errors import UsageError
from kiln.graph import BuildDependency, BuildMeta

# Names to probe, newest first, for the suggestion after a rejected target.
CANDIDATES = {
    "cuda": ("sm_120", "sm_100", "sm_90a", "sm_90", "sm_89", "sm_87", "sm_86", "sm_80", "sm_75"),
    "hip": ("gfx950", "gfx942", "gfx90a", "gfx1201", "gfx1200", "gfx1100", "gfx908"),
    "vulkan": ("rdna4", "rdna3", "ampere", "valhall4", "adreno"),
}


class _ProbeMeta(BuildMeta):
    """Per-graph memo (on the root context) of probe answers: error text or None."""

    KEY = "kiln.target-probes"

    def __init__(self) -> None:
        super().__init__()
        self.answers: dict[tuple[str, ...], str | None] = {}


def probe(flags: list[str]) -> str | None:
    """None when the installed compiler can compile for ``flags``, else its error."""
    proc = configure_probe(flags, os.devnull, timeout=120)
    if proc.returncode == 0:
        return None
    lines = (proc.stdout + proc.stderr).splitlines()
    errors = [ln.split("error:", 1)[1].strip() for ln in lines if "error:" in ln]
    return errors[0] if errors else f"iree-compile exited with status {proc.returncode}"


def _memo_probe(flags: list[str], root: BuildDependency) -> str | None:
    answers = _ProbeMeta.get(root).answers
    key = tuple(flags)
    if key not in answers:
        answers[key] = probe(flags)
    return answers[key]


def _sm_number(arch: str) -> int | None:
    digits = arch[3:].rstrip("abf") if arch.startswith("sm_") else ""
    return int(digits) if digits.isdigit() else None


def _not_newer(kind: str, arch: str) -> tuple[str, ...]:
    """The candidates to suggest for ``arch``: for CUDA ``sm_NN`` those not newer
    than it (PTX runs on the GPUs after its architecture, never before), else all."""
    wanted = _sm_number(arch) if kind == "cuda" else None
    if wanted is None:
        return CANDIDATES[kind]
    return tuple(c for c in CANDIDATES[kind] if (_sm_number(c) or 0) <= wanted)


def check_target(spec: str, root: BuildDependency) -> None:
    """Raise UsageError when the installed compiler cannot compile for GPU target
    ``spec``, naming the reason and the newest supported architecture."""
    from kiln.actions._compiler import compiler_version

    kind, arch = parse_target(spec)
    if kind not in CANDIDATES:
        return
    error = _memo_probe(target_flags(spec), root)
    if error is None:
        return
    candidates = _not_newer(kind, arch)
    supported = next(
        (c for c in candidates if _memo_probe(target_flags(f"{kind}:{c}"), root) is None), None
    )
    if supported is None:
        hint = f"; none of {', '.join(candidates)} is supported either"
    else:
        upto = "" if candidates == CANDIDATES[kind] else f" up to {arch}"
        hint = f"; the newest {kind} architecture{upto} it supports is {supported}"
        hint += f": use --target {kind}:{supported}"
    if kind == "cuda" and supported:
        hint += " (the driver JIT-compiles its PTX for newer GPUs)"
    raise UsageError(
        f"--target {spec}: iree-base-compiler {compiler_version()} cannot compile for "
        f"{arch} ({error}){hint}"
    )
