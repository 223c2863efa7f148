"""``kiln report [--output-dir DIR] [-o FILE] [--build N | --list]``: an HTML page of
the last build, or of one of the builds before it that ``.kiln/`` keeps.

Reads what the last build kept in ``DIR/.kiln/`` and ``DIR/manifest.json``;
needs no build module. Prints the page's path on stdout. A page written inside
the output directory is recorded in its state as kiln's (``kiln clean`` removes
it, as it removes what builds wrote); one written elsewhere is the user's. A page
never goes over one of kiln's own files (``kiln.cli.destinations``).
"""

from __future__ import annotations

import html
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO

from kiln.base.errors import KilnError, StateError, UsageError
from kiln.base.terminal import printable
from kiln.cache.config import default_cache_dir
from kiln.cli import project_config
from kiln.cli.destinations import check_destinations, write_page
from kiln.cli.plain_parsers import report_parser
from kiln.observe.report_data import kept_builds, load_report
from kiln.observe.report_html import render
from kiln.output_dir.ownership import output_dir_state


def run(argv: list[str], out: IO[str], err: IO[str]) -> int:
    ns = project_config.parse(report_parser(), argv, os.getcwd())
    if ns.json and not ns.list:
        raise UsageError("kiln report: --json goes with --list (the page is HTML)")
    if ns.list:
        return _list(ns.output_dir, out, ns.json)
    report = load_report(ns.output_dir, ns.build)
    default = "report.html" if not ns.build else f"report-{ns.build}.html"
    target: Path = ns.output if ns.output is not None else ns.output_dir / default
    if not target.parent.is_dir():
        raise UsageError(f"-o {target}: no directory {target.parent} to write it in")
    # Refused before anything is written: never one of kiln's own files.
    (written,) = check_destinations(
        [("-o", target)],
        ns.output_dir,
        cache_dir=default_cache_dir(),
        inputs=lambda: [p for p in (ns.module, ns.project_file) if p],
        warn=_printer(err),
    )
    comparison = "" if ns.build else _comparison(ns.output_dir)
    page = render(report, ns.output_dir.absolute(), comparison)
    _claim(ns.output_dir.absolute(), written, err)
    write_page("-o", target, page)
    print(target, file=out)
    which = "the last build" if not ns.build else f"build {ns.build} before the last"
    print(f"kiln: report of {which} in {ns.output_dir} written to {target}", file=err)
    return 0


def _comparison(output_dir: Path) -> str:
    """The last build compared with the one before it (``kiln compare @-1 @0``), as a
    section of the page; nothing when no earlier build is kept, a line saying why
    when the two cannot be compared (the report is written all the same)."""
    from kiln.compare.builds import load_build
    from kiln.compare.diff import Pools, compare_builds
    from kiln.compare.page import report_section
    from kiln.observe.manifest_history import kept_manifest

    head = "<section id='comparison'><h2>Compared with the build before</h2>"
    try:
        os.lstat(kept_manifest(output_dir, 1))
    except OSError:
        return ""
    except KilnError as e:  # the history is there as a link: not read
        return f"{head}<p>{html.escape(str(e), quote=True)}</p></section>"
    try:
        a, b = load_build("@-1", output_dir), load_build("@0", output_dir)
        rows = compare_builds(a, b, Pools([a, b]))
    except KilnError as e:
        return f"{head}<p>{html.escape(str(e), quote=True)}</p></section>"
    except (ValueError, TypeError, KeyError, AttributeError, ArithmeticError) as e:
        # A kept manifest shaped as no kiln writes it: the page is written all the same.
        why = f"cannot compare the two builds' manifests ({type(e).__name__})"
        return f"{head}<p>{why}</p></section>"
    return report_section(a, b, rows, [])


def _list(output_dir: Path, out: IO[str], as_json: bool = False) -> int:
    """``--list``: one line per kept build, newest first (``--json``: one document)."""
    kept = kept_builds(output_dir)
    if not kept:
        raise StateError(f"no build recorded in {output_dir}; run 'kiln build' first")
    if as_json:
        rows = [
            {
                "build": k.n,
                "started": k.started,
                "status": k.status,
                "wall_s": k.wall_s,
                "counts": k.counts,
            }
            for k in kept
        ]
        print(json.dumps({"builds": rows}, indent=2), file=out)
        return 0
    for k in kept:
        wall = f"{k.wall_s:.2f}s" if k.wall_s is not None else "?"
        print(
            printable(f"{k.n}\t{k.started_text}\t{k.status}\t{wall}\t{k.counts_text}"),
            file=out,
        )
    return 0


def _printer(err: IO[str]) -> Callable[[str], None]:
    return lambda text: print(text, file=err)


def _claim(root: Path, target: Path, err: IO[str]) -> None:
    """Record ``target`` (where the page is written, its directory's links resolved)
    as kiln's in ``root``'s state when it lies inside ``root`` (before writing it: a
    report killed half-way is kiln's to clean up too)."""
    rel = os.path.relpath(target, os.path.realpath(root))
    if rel == ".." or rel.startswith(".." + os.sep):
        return
    from kiln.state import StateStore

    try:
        if output_dir_state(root) != "kiln":
            return
    except (UsageError, StateError):
        return
    try:
        store = StateStore(root, warn=_printer(err))
        try:
            store.claim_outputs([rel.replace(os.sep, "/")])
        finally:
            store.close()
    except StateError as e:
        print(f"kiln: warning: {e}; kiln clean will keep {target}", file=err)
