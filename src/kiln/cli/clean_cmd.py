"""``kiln clean``: remove what kiln wrote in the output directory."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import IO

from kiln.cli.options import KilnArgumentParser
from kiln.lock import OutputLock

OWNED = ("genfiles", "params", "bin", "platform", "manifest.json")


def run(argv: list[str], out: IO[str], err: IO[str]) -> int:
    parser = KilnArgumentParser(prog="kiln clean")
    parser.add_argument("module", nargs="?", help="ignored; accepted for symmetry")
    parser.add_argument("--output-dir", type=Path, default=Path("kiln-out"))
    parser.add_argument("--no-wait", action="store_true")
    ns = parser.parse_args(argv)
    root: Path = ns.output_dir
    if not (root / ".kiln").is_dir():
        print(f"kiln: nothing to clean in {root} (not a kiln output directory)", file=err)
        return 0
    with OutputLock(root, wait=not ns.no_wait, notify=lambda m: print(m, file=err)):
        for name in OWNED:
            path = root / name
            if path.is_dir():
                shutil.rmtree(path)
            elif path.exists():
                path.unlink()
        for state in (root / ".kiln").glob("state.db*"):
            state.unlink()
    print(f"kiln: cleaned {root}", file=err)
    return 0
