"""``iree.build.target_machine``: the target machines a compile is made for."""

from __future__ import annotations

from kiln.actions.iree import targets_from_options

__all__ = ["TargetMachine", "compute_target_machines_from_flags"]


class TargetMachine:
    """One machine to compile for: ``target_spec`` names its modules
    (``<name>_<target_spec>.vmfb``), ``flag_list`` selects it in iree-compile."""

    def __init__(
        self,
        target_spec: str,
        *,
        iree_compile_device_type: str | None = None,
        extra_flags: list[str] | None = None,
    ) -> None:
        self.target_spec = target_spec
        self.iree_compile_device_type = iree_compile_device_type
        self.extra_flags = extra_flags

    @property
    def flag_list(self) -> list[str]:
        flags = []
        if self.iree_compile_device_type is not None:
            flags.append(f"--iree-hal-target-device={self.iree_compile_device_type}")
        return flags + list(self.extra_flags or ())

    def __repr__(self) -> str:
        return f"TargetMachine({self.target_spec}, extra_flags={self.extra_flags})"


def compute_target_machines_from_flags() -> list[TargetMachine]:
    """The machines the command line names (``--target``, ``--iree-hal-target-device``),
    inside an entrypoint being analysed; none is an error, as in iree.build."""
    machines = [TargetMachine(t.name, extra_flags=list(t.flags)) for t in targets_from_options()]
    if not machines:
        raise RuntimeError(
            "iree-compile target information is required but none was provided. "
            "See flags: --iree-hal-target-device"
        )
    return machines
