"""A small build for the cache tests: ``run_command`` actions whose runs are counted.

``write_tool(dir)`` writes ``tool.py``: ``python tool.py OUT NAME SIZE COUNTER
[INPUT ...]`` writes SIZE deterministic bytes (from NAME and the inputs' bytes) to
OUT and appends NAME to COUNTER, so a test sees which actions ran.
``module_text(tool, counter, names)`` is a build module with one entrypoint per
name ``n``: ``n.bin`` from the tool, then ``n.sum`` from ``n.bin``.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

TOOL = """\
import hashlib, sys
out, name, size, counter, *inputs = sys.argv[1:]
seed = name.encode() + b"".join(open(p, "rb").read() for p in inputs)
data, block = b"", hashlib.sha256(seed).digest()
while len(data) < int(size):
    data += block
    block = hashlib.sha256(block).digest()
open(out, "wb").write(data[: int(size)])
with open(counter, "a") as f:
    f.write(name + "\\n")
"""


def write_tool(directory: Path) -> Path:
    path = directory / "tool.py"
    path.write_text(TOOL)
    return path


def module_text(tool: Path, counter: Path, names: list[str], size: int = 3000) -> str:
    lines = ["import sys", f"TOOL, COUNTER = {str(tool)!r}, {str(counter)!r}", ""]
    for n in names:
        lines += [
            "@entrypoint",
            f"def {n}():",
            f"    b = run_command(name='{n}.bin', namespace=FileNamespace.BIN, command=[",
            f"        sys.executable, TOOL, '{{out}}', '{n}', '{size}', COUNTER])",
            f"    s = run_command(name='{n}.sum', inputs=[b], command=[",
            f"        sys.executable, TOOL, '{{out}}', '{n}-sum', '64', COUNTER, '{{inputs[0]}}'])",
            "    return [b, s]",
            "",
        ]
    return "\n".join(lines)


def runs(counter: Path) -> list[str]:
    return counter.read_text().split() if counter.exists() else []


def tree(root: Path) -> dict[str, bytes]:
    """Every output file under ``root`` (state and manifest aside), by relative path."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".kiln" not in p.parts and p.name != "manifest.json"
    }


def blob(cache: Path, data: bytes) -> Path:
    digest = hashlib.sha256(data).hexdigest()
    return cache / "v1" / "cas" / digest[:2] / digest
