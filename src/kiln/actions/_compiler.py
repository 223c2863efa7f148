"""Running ``iree-compile``: the installed compiler's version (part of every
compile's key, read once per process) and one compile of MLIR to a ``.vmfb``,
run inside a worker process with its output streamed to the action's log."""

from __future__ import annotations

import functools
import os
import subprocess
import tempfile
from collections.abc import Sequence

from kiln.actions._logs import open_log, read_tail, short_diagnostic, shown_path
from kiln.base.errors import ToolError, ToolMissing
from kiln.base.redact import redact_urls
from kiln.execution.process.template import template_modules
from kiln.output_dir.writing import atomic_output
from kiln.planning.code_key import distribution_version

DIAGNOSTIC_TAIL_LINES = 40
# The least program that makes iree-compile configure an executable for a target.
_PROBE_PROGRAM = """func.func @probe(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = arith.addf %a, %a : tensor<4xf32>
  return %0 : tensor<4xf32>
}
"""


@functools.cache
def compiler_version() -> str:
    """Return the installed iree-base-compiler version (part of compile action keys)."""
    version = distribution_version("iree-base-compiler")
    if version is None:
        raise ToolMissing("iree-base-compiler is not installed (pip install 'kiln[iree]')")
    return version


@template_modules("iree.compiler.tools.binaries")  # find_tool: imported once, by the template
def compile_module(
    source: str, output: str, input_type: str, flags: list[str], log_path: str
) -> None:
    """Compile MLIR to a .vmfb at `output` by running the iree-compile executable.

    A child process isolates kiln from compiler crashes (LLVM aborts the whole
    process).  Its output streams to `log_path` (never held in memory); on
    failure a bounded tail of it is also the ToolError's message.
    """
    from iree.compiler.tools.binaries import find_tool

    try:
        exe = os.path.normpath(find_tool("iree-compile"))
    except ValueError as e:
        raise ToolMissing(f"cannot find iree-compile: {short_diagnostic(e)}") from e
    with atomic_output(output, create=False) as tmp:
        cmd = [exe, source, f"--iree-input-type={input_type}"]
        cmd += ["--mlir-print-op-on-diagnostic=false", *flags, "-o", str(tmp)]
        header = f"$ {redact_urls(subprocess.list2cmdline(cmd))}\n"
        fd = open_log(log_path, header)
        try:
            returncode = subprocess.run(
                cmd, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd
            ).returncode
        finally:
            os.close(fd)
        if returncode != 0:
            status = f"exit code {returncode}"
            if returncode < 0:
                status = f"killed by signal {-returncode}"
            tail = read_tail(log_path, max_lines=DIAGNOSTIC_TAIL_LINES)
            where = shown_path(source)
            raise ToolError(
                f"iree-compile failed on {where} ({status}):\n{tail}\n(full log: {log_path})",
                returncode,
            )
        if not os.path.lexists(tmp):
            raise ToolError(
                f"iree-compile finished without writing its output {shown_path(output)}"
            )


def configure_probe(
    flags: Sequence[str], output: str, timeout: float
) -> subprocess.CompletedProcess[str]:
    """Compile a one-line program with ``flags`` up to ``executable-configurations``
    (what the installed iree-compile makes of a target, in well under a second),
    writing that to ``output`` (``-``: its stdout). The finished process is returned
    whatever its status; ToolMissing when there is no iree-compile."""
    from iree.compiler.tools.binaries import find_tool

    try:
        exe = find_tool("iree-compile")
    except ValueError as e:
        raise ToolMissing(f"cannot find iree-compile: {e}") from e
    with tempfile.TemporaryDirectory(prefix="kiln-probe-") as tmp:
        source = os.path.join(tmp, "probe.mlir")
        with open(source, "w", encoding="utf-8") as f:
            f.write(_PROBE_PROGRAM)
        cmd = [exe, source, *flags, "--compile-to=executable-configurations", "-o", output]
        return subprocess.run(
            cmd,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout,
        )
