"""``kiln report [--output-dir DIR] [-o FILE]``: an HTML page of the last build.

Reads what the last build kept in ``DIR/.kiln/`` and ``DIR/manifest.json``;
needs no build module. Prints the page's path on stdout. A page written inside
the output directory is recorded in its state as kiln's (``kiln clean`` removes
it, as it removes what builds wrote); one written elsewhere is the user's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

from kiln.cli.options import KilnArgumentParser
from kiln.errors import StateError, UsageError
from kiln.outputs import atomic_output, output_dir_state
from kiln.report_data import load_report
from kiln.report_html import render


def run(argv: list[str], out: IO[str], err: IO[str]) -> int:
    parser = KilnArgumentParser(prog="kiln report", description=__doc__)
    parser.add_argument("module", nargs="?", help="ignored; accepted for symmetry")
    parser.add_argument(
        "--output-dir",
        type=Path,
        default=Path("kiln-out"),
        help="the build's output directory (default: ./kiln-out)",
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        metavar="FILE",
        help="where to write the page (default: OUTPUT_DIR/report.html)",
    )
    ns = parser.parse_args(argv)
    report = load_report(ns.output_dir)
    target: Path = ns.output if ns.output is not None else ns.output_dir / "report.html"
    if not target.parent.is_dir():
        raise UsageError(f"-o {target}: no directory {target.parent} to write it in")
    page = render(report, ns.output_dir.absolute())
    _claim(ns.output_dir.absolute(), target.absolute(), err)
    try:
        with atomic_output(target) as tmp:
            tmp.write_text(page, encoding="utf-8")
    except OSError as e:
        raise UsageError(f"-o {target}: cannot write it: {e.strerror}") from e
    print(target, file=out)
    print(f"kiln: report of the last build in {ns.output_dir} written to {target}", file=err)
    return 0


def _claim(root: Path, target: Path, err: IO[str]) -> None:
    """Record ``target`` as kiln's in ``root``'s state when it lies inside ``root``
    (before writing it: a report killed half-way is kiln's to clean up too)."""
    rel = os.path.relpath(target, root)
    if rel == ".." or rel.startswith(".." + os.sep):
        return
    from kiln.state import StateStore

    try:
        if output_dir_state(root) != "kiln":
            return
    except (UsageError, StateError):
        return
    try:
        store = StateStore(root, warn=lambda m: print(m, file=err))
        try:
            store.claim_outputs([rel.replace(os.sep, "/")])
        finally:
            store.close()
    except StateError as e:
        print(f"kiln: warning: {e}; kiln clean will keep {target}", file=err)
