"""``compile``: IREE, one artifact per target device (``verify`` and ``benchmark``
of the artifacts are in their own modules)."""

from __future__ import annotations

import functools
import shlex
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kiln.actions._compiler import compile_module, compiler_version
from kiln.actions._devices import MACHINE_POOL, driver_for_flags
from kiln.actions._gpu_probe import check_target
from kiln.actions._host_cpu import depends_on_host, explicit_flags, resolve
from kiln.actions._host_cpu import save as save_host_answers
from kiln.actions.params import program_archives
from kiln.base.compile_targets import target_flags, target_name
from kiln.base.errors import BuildDefinitionError, ToolError, UsageError
from kiln.graph import (
    ActionConcurrency,
    BuildAction,
    BuildContext,
    BuildFile,
    BuildMeta,
    DefinitionSite,
    FileNamespace,
)
from kiln.graph.args import current_args_namespace
from kiln.graph.manifest_meta import ManifestMeta


class CompileSourceMeta(BuildMeta):
    """The ``--iree-input-type`` a file compiles with (set by importers)."""

    KEY = "iree.compile.source"

    def __init__(self) -> None:
        super().__init__()
        self.input_type = "auto"

    def __repr__(self) -> str:
        return f"CompileSourceMeta(input_type={self.input_type})"


@dataclass(frozen=True)
class CompileTarget:
    """One device to compile for: ``name`` goes into the artifact's file name."""

    name: str
    flags: tuple[str, ...]

    @property
    def driver(self) -> str:
        """The iree.runtime driver that runs modules compiled for this target."""
        return driver_for_flags(self.flags)


NO_TARGET_HELP = (
    "compile needs a target device: pass --target cpu (or vmvx, hip:CHIP, "
    "vulkan:TARGET, cuda:SM; --kiln-target when the build module has a --target of "
    "its own), or --iree-hal-target-device=..."
)


def requested_targets(default: Sequence[str] = ()) -> list[str]:
    """The compile targets the command line asks for, as ``--target`` specs (``cpu``,
    ``vmvx``, ``cuda:sm_89``; iree.build's ``--iree-hal-target-device`` spelled so), or
    ``default`` when it asks for none. Call it in an entrypoint and pass it to
    ``compile(targets=...)``: the module then takes kiln's targets, with its own as
    the default (a ``compile(targets=[...])`` of fixed targets ignores them, and a
    ``--target`` that no compile of the build uses is an error)."""
    BuildContext.current()  # only in an entrypoint is the command line parsed
    ns = current_args_namespace()
    given = list(getattr(ns, "kiln_targets", None) or [])
    for device in getattr(ns, "iree_hal_target_device", None) or []:
        given.append(_device_spec(device, ns))
    if given:
        return given
    for spec in default:
        try:
            target_name(spec)
        except UsageError as e:
            where = DefinitionSite.capture()
            raise BuildDefinitionError(f"requested_targets(default=...) at {where}: {e}") from None
    return [str(spec) for spec in default]


def _device_spec(device: str, ns: Any) -> str:
    """iree.build's ``--iree-hal-target-device`` value as a ``--target`` spec."""
    target = hal_device_target(device, ns)
    if device == "vmvx":
        return "vmvx"
    cpu_features = getattr(ns, "iree_llvmcpu_target_cpu_features", None)
    if device in ("llvm-cpu", "cpu") and not cpu_features:
        return "cpu:" + (getattr(ns, "iree_llvmcpu_target_cpu", None) or "generic")
    if device == "hip":
        return f"hip:{getattr(ns, 'iree_hip_target', '')}"
    raise UsageError(
        f"--iree-hal-target-device={device}: the build module takes --target specs "
        f"(requested_targets), and {target.name} has none; give --target "
        "cpu[:CPU], vmvx, hip:CHIP, vulkan:TARGET or cuda:SM instead"
    )


def targets_from_options(explicit: Sequence[str] | None = None) -> list[CompileTarget]:
    """The targets of ``explicit`` specs, else of the command line (``--target``,
    ``--iree-hal-target-device``); possibly none."""
    ns = current_args_namespace()
    specs = list(explicit) if explicit is not None else list(getattr(ns, "kiln_targets", []))
    root = BuildContext.current().registry.get_context("")
    for spec in specs:
        check_target(spec, root)
    found = [CompileTarget(target_name(s), tuple(target_flags(s))) for s in specs]
    if explicit is None:
        for device in getattr(ns, "iree_hal_target_device", None) or []:
            found.append(hal_device_target(device, ns))
    return found


def hal_device_target(device: str, ns: Any) -> CompileTarget:
    """iree.build's ``--iree-hal-target-device`` spelling of a target, named as
    iree.build names it: ``cpu-<cpu or generic>``, ``hip-<chip>``, else the device."""
    if device in ("llvm-cpu", "cpu"):
        cpu = getattr(ns, "iree_llvmcpu_target_cpu", None)
        features = getattr(ns, "iree_llvmcpu_target_cpu_features", None)
        flags = [
            "--iree-hal-target-device=local",
            "--iree-hal-local-target-device-backends=llvm-cpu",
        ]
        flags += [f"--iree-llvmcpu-target-cpu={cpu}"] if cpu else []
        flags += [f"--iree-llvmcpu-target-cpu-features={features}"] if features else []
        return CompileTarget(f"cpu-{cpu or 'generic'}", tuple(flags))
    if device == "hip":
        chip = getattr(ns, "iree_hip_target", None)
        if not chip:
            raise UsageError("--iree-hal-target-device=hip needs --iree-rocm-target=gfx...")
        return CompileTarget(
            f"hip-{chip}", ("--iree-hal-target-device=hip", f"--iree-rocm-target={chip}")
        )
    return CompileTarget(device.replace("/", "_"), (f"--iree-hal-target-device={device}",))


class CompileAction(BuildAction):
    """Runs iree-compile in a worker process; warnings go to a log file beside the
    output, diagnostics into the failure."""

    pool = MACHINE_POOL
    # Whose version the key holds (``compiler_version``): a Dask worker must have the same.
    keyed_tools = ("iree-base-compiler",)

    def __init__(
        self,
        *,
        input_file: BuildFile,
        output_file: BuildFile,
        target: CompileTarget | None,
        flags: list[str],
        fixed: bool = False,
        **kwargs: Any,
    ):
        super().__init__(concurrency=ActionConcurrency.PROCESS, **kwargs)
        self.input_file = input_file
        self.output_file = output_file
        # None: no target device was given. The graph can still be listed; a
        # build that would run this compile stops before it starts.
        self.missing_target = target is None
        # Whether the module chose this target itself (``targets=``, or
        # ``target_default=False``) rather than taking the command line's.
        self.fixed_target = fixed
        target = target if target is not None else CompileTarget("", ())
        self.target = target
        self.flags = [*target.flags, *flags]
        self.deps.add(input_file)
        output_file.deps.add(self)
        # What the host-dependent flags mean here (``kiln.actions._host_cpu``), once asked.
        self._host: dict[str, str] | None = None

    @property
    def log_path(self) -> str:
        return self.run_context.log_path(self.output_file)

    def check_runnable(self) -> None:
        if self.missing_target:
            raise BuildDefinitionError(
                f"{NO_TARGET_HELP} (to run '{self}', defined at {self.def_site})"
            )

    def params(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "target": self.target.name,
            "flags": self.flags,
            "input_type": CompileSourceMeta.get(self.input_file).input_type,
            "compiler_version": compiler_version(),
        }
        host = self.host_target()
        if host is not None:
            out["host"] = host
        return out

    def host_target(self) -> dict[str, str] | None:
        """What this compile's host-dependent flags (a ``host`` CPU, no target triple)
        mean on this machine, or None when it has none; the manifest shows it."""
        if self._host is None and depends_on_host(self.flags):
            self._host = resolve(
                self.flags,
                compiler_version(),
                self.run_context.layout.kiln_dir,
                write=not self.executor.read_only,
            )
            ManifestMeta.get(self.output_file).fields.update(
                flags=self.compile_flags(), host=self._host
            )
        return self._host

    def compile_flags(self) -> list[str]:
        """The flags iree-compile is given: ``flags``, the host spelled out."""
        host = self.host_target()
        return explicit_flags(self.flags, host) if host is not None else self.flags

    def _remotable_thunk(self) -> Callable[[], None]:
        if self._host is not None:
            save_host_answers(self.run_context.layout.kiln_dir)
        return self._thunk(lambda f: f.action_path, self.log_path)

    def sandbox_thunk(self, path: Callable[[BuildFile], str]) -> Callable[[], None]:
        """The thunk with its files at ``path(file)`` in a remote sandbox; its
        warnings log stays there (the failure carries the diagnostics)."""
        return self._thunk(path, path(self.output_file) + ".log")

    def _thunk(self, path: Callable[[BuildFile], str], log: str) -> Callable[[], None]:
        return functools.partial(
            compile_module,
            path(self.input_file),
            path(self.output_file),
            CompileSourceMeta.get(self.input_file).input_type,
            self.compile_flags(),
            log,
        )


def compile(  # noqa: A001 - iree.build's public name
    *,
    name: str,
    source: BuildFile | str,
    targets: Sequence[str] | None = None,
    flags: Sequence[str] = (),
    target_default: bool = True,
) -> list[BuildFile]:
    """Declare one compile of ``source`` per target device, each producing
    ``bin/<context>/<name>_<target>.vmfb``; returns those files.

    ``targets`` (``--target`` specs) overrides the command line's targets (pass
    ``requested_targets(default=[...])`` to take them, with a default of the
    module's); ``target_default=False`` compiles once with only ``flags``.
    """
    context = BuildContext.current()
    input_file = context.file(source)
    ns = current_args_namespace()
    extra = [*flags, *shlex.split(getattr(ns, "iree_compile_extra_args", "") or "")]
    if targets is not None and not targets:
        raise BuildDefinitionError(
            f"compile of {input_file.path}: targets=[] names no target; "
            "give one, or leave targets out to take the command line's"
        )
    chosen: list[CompileTarget | None] = (
        [*targets_from_options(targets)] if target_default else [CompileTarget("", ())]
    )
    if not chosen:
        chosen = [None]  # listed without a target; building it is an error
    outputs = []
    for target in chosen:
        stem = f"{name}_{target.name}" if target is not None and target.name else name
        output = context.allocate_file(f"{stem}.vmfb", FileNamespace.BIN)
        action = CompileAction(
            input_file=input_file,
            output_file=output,
            target=target,
            flags=extra,
            fixed=targets is not None or not target_default,
            desc=_compile_desc(name, input_file, target, target_default),
            executor=context.executor,
        )
        meta = ManifestMeta.get(output)
        meta.fields.update(
            target=action.target.name,
            flags=action.flags,
            compiler_version=_compiler_version_or_none(),
        )
        meta.archives = program_archives(input_file)
        outputs.append(output)
    return outputs


def _compile_desc(
    name: str, input_file: BuildFile, target: CompileTarget | None, target_default: bool
) -> str:
    """iree.build's description of a compile (``Compiling BuildFile[gen](x.mlir) (for
    cpu-host)``; ``Compiling NAME`` without targets), which its users' scripts see."""
    if not target_default:
        return f"Compiling {name}"
    return f"Compiling {input_file} (for {target.name if target else 'no target device given'})"


def _compiler_version_or_none() -> str | None:
    try:
        return compiler_version()
    except ToolError:
        return None
