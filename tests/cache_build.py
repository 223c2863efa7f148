"""A small build for the cache tests: ``run_command`` actions whose runs are counted.

``write_tool(dir)`` writes ``tool.py``: ``python tool.py OUT NAME SIZE COUNTER
[INPUT ...]`` writes SIZE deterministic bytes (from NAME and the inputs' bytes) to
OUT and appends NAME to COUNTER, so a test sees which actions ran.
``module_text(tool, counter, names)`` is a build module with one entrypoint per
name ``n``: ``n.bin`` from the tool, then ``n.sum`` from ``n.bin``.
"""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Callable
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


def index_path(cache: Path) -> Path:
    return cache / "v1" / "index.db"


def entries(cache: Path) -> dict[str, bytes]:
    """The action-cache entries in the cache's index (``kiln.cache.index``), by name."""
    path = index_path(cache)
    if not path.exists():
        return {}
    db = sqlite3.connect(path)
    try:
        return {name: data for name, data in db.execute("SELECT name, data FROM entries")}
    finally:
        db.close()


def rewrite_entries(cache: Path, change: Callable[[bytes], bytes]) -> int:
    """Replace every entry of the index by ``change`` of it (a tamperer); how many."""
    db = sqlite3.connect(index_path(cache))
    try:
        found = list(db.execute("SELECT name, data FROM entries"))
        with db:
            db.executemany(
                "UPDATE entries SET data = ? WHERE name = ?", [(change(d), n) for n, d in found]
            )
        return len(found)
    finally:
        db.close()


def to_entry_files(cache: Path) -> list[Path]:
    """Turn the cache into what an older kiln left: each entry of the index a file
    ``v1/ac/<n[:2]>/<n>``, and no index; the files."""
    made = []
    for name, data in entries(cache).items():
        path = cache / "v1" / "ac" / name[:2] / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        path.chmod(0o444)
        made.append(path)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{index_path(cache)}{suffix}").unlink(missing_ok=True)
    return made
