"""Whether the command line's compile targets reach a compile.

A build module may fix a compile's targets (``compile(targets=[...])``, as the
model zoo does, or ``target_default=False``); a ``--target`` (or
``--iree-hal-target-device``) given to such a build would then be ignored, and
the build would report success for a device nothing was compiled for. So a
target that no compile of the requested entrypoints compiles for stops the
command with a ``UsageError`` naming the compiles that fix their targets, by
file and line. A request that reaches no compile at all (building the
``.onnx`` a compile would read) is not an error: no compile ignores it.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from kiln.actions.iree import CompileAction, hal_device_target
from kiln.base.compile_targets import target_name
from kiln.base.errors import UsageError
from kiln.graph import BuildAction
from kiln.graph.args import current_args_namespace

_SITES_SHOWN = 5


def check_compile_targets_used(
    actions: Iterable[BuildAction], target_flag: str = "--target"
) -> str | None:
    """Raise UsageError when a target the command line asks for is compiled by none
    of the compiles among ``actions`` (the actions of the requested targets); when
    each is used but some compiles fix targets that leave one out, return a warning
    naming them. ``target_flag`` is how kiln's ``--target`` is spelled here."""
    asked = _asked(current_args_namespace(), target_flag)
    compiles = [a for a in actions if isinstance(a, CompileAction)]
    if not asked or not compiles:
        return None
    built_for = {c.target.name for c in compiles if not c.missing_target}
    unused = [shown for shown, name in asked if name not in built_for]
    names = {name for _, name in asked}
    ignoring = [c for c in compiles if c.fixed_target and c.target.name not in names]
    sites = _sites(ignoring if not unused else [c for c in compiles if c.fixed_target])
    if not unused:
        if not sites:
            return None
        return (
            f"warning: {' and '.join(shown for shown, _ in asked)}: these compiles fix "
            "their own targets and do not take the command line's:\n" + sites
        )
    raise UsageError(
        f"{' and '.join(unused)}: no compile of the requested entrypoints compiles for "
        f"{'it' if len(unused) == 1 else 'them'}; the build module fixes its compiles' "
        "targets (compile(targets=[...]) or target_default=False):\n"
        + sites
        + "\nBuild without it, or make the module take kiln's targets: "
        "compile(..., targets=requested_targets(default=[...])) "
        "(docs/actions.md, 'Compile targets')"
    )


def _sites(compiles: list[CompileAction]) -> str:
    """The compiles by the line that defined them, with their targets, a line each."""
    sites: dict[str, tuple[list[str], int]] = {}
    for c in compiles:
        names, count = sites.get(str(c.def_site), ([], 0))
        name = c.target.name or "no target device: its flags alone"
        sites[str(c.def_site)] = (names if name in names else [*names, name], count + 1)
    lines = [
        f"  {site}: {', '.join(names)}" + (f" ({count} compiles)" if count > 1 else "")
        for site, (names, count) in list(sites.items())[:_SITES_SHOWN]
    ]
    if len(sites) > _SITES_SHOWN:
        lines.append(f"  ... and {len(sites) - _SITES_SHOWN} more")
    return "\n".join(lines)


def _asked(ns: Any, target_flag: str) -> list[tuple[str, str]]:
    """The targets the command line asks for: (as the user wrote it, target name)."""
    asked = [(f"{target_flag} {spec}", target_name(spec)) for spec in _values(ns, "kiln_targets")]
    for device in _values(ns, "iree_hal_target_device"):
        shown = f"--iree-hal-target-device={device}"
        asked.append((shown, hal_device_target(device, ns).name))
    return asked


def _values(ns: Any, name: str) -> list[str]:
    return list(getattr(ns, name, None) or [])
