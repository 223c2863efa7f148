"""A three-step chain of subprocess actions (a.out -> b.out -> c.out) that logs
each run to ``ran.log``, for the incremental and explain tests. ``b_op`` picks
b.out's operation: ``bang``, ``upper`` or ``fail``."""

from __future__ import annotations

import textwrap
from collections.abc import Callable
from pathlib import Path

TOOL = """\
import os, sys
name, op, out, *inputs = sys.argv[1:]
# Beside this script, in the project (commands run in the output directory).
# (realpath: the command is given a link to this script, in .kiln/src)
with open(os.path.join(os.path.dirname(os.path.realpath(__file__)), "ran.log"), "a") as log:
    log.write(name + "\\n")
if op == "fail":
    sys.exit("told to fail")
text = "".join(open(i).read() for i in inputs)
open(out, "w").write({"upper": text.upper(), "bang": text + "!"}[op])
"""

CHAIN = """\
import sys
from kiln import entrypoint, run_command, source_file
from kiln.executor import BuildAction, BuildContext

def tool(name, op, *inputs):
    return run_command(name=name, inputs=list(inputs),
                       command=[sys.executable, "tool.py", name, op, "{{out}}",
                                *[f"{{{{inputs[{{i}}]}}}}" for i in range(len(inputs))]])

@entrypoint
def chain():
    a = tool("a.out", "upper", source_file("a.txt"))
    b = tool("b.out", "{b_op}", a)
    return tool("c.out", "bang", b)
"""


def chain_project(
    tmp_path: Path, write_module: Callable[..., Path], extra: str = ""
) -> Callable[[str], None]:
    """Write tool.py, a.txt and the build module (the chain, then ``extra``);
    returns a function that rewrites the module with another ``b_op``."""
    (tmp_path / "tool.py").write_text(TOOL)
    (tmp_path / "a.txt").write_text("alpha")

    def write(b_op: str = "bang") -> None:
        module = textwrap.dedent(CHAIN).format(b_op=b_op) + textwrap.dedent(extra)
        write_module(module, header=False)

    write()
    return write


def ran(tmp_path: Path) -> list[str]:
    """What ran since the last call (and forget it)."""
    log = tmp_path / "ran.log"
    lines = log.read_text().splitlines() if log.exists() else []
    log.write_text("")
    return sorted(lines)
