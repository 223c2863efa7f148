"""The parsers of the commands that take no build module (``kiln clean``, ``report``,
``cache``, ``compare``, ``devices``): here, apart from the commands, so that whatever
needs every option of kiln's (``[tool.kiln]``'s keys, shell completion) reads them
without importing the commands."""

from __future__ import annotations

import argparse
from pathlib import Path

from kiln.cli.cache_options import directory_path, seconds_option, size_option
from kiln.cli.executor_options import add_executor_options
from kiln.cli.options import KilnArgumentParser
from kiln.observe.event_log import KEPT_BUILDS


def _output_dir_option(parser: KilnArgumentParser, said: str) -> None:
    parser.add_argument("--output-dir", type=directory_path, default=Path("kiln-out"), help=said)


def clean_parser() -> KilnArgumentParser:
    parser = KilnArgumentParser(
        prog="kiln clean",
        description="Remove what kiln wrote in the output directory (the outputs its state "
        "records, the manifest, its state); files kiln did not write stay.",
    )
    parser.add_argument("module", nargs="?", help="ignored; accepted for symmetry")
    _output_dir_option(parser, "the output directory to clean (default: ./kiln-out)")
    parser.add_argument(
        "--no-wait",
        action="store_true",
        help="fail at once, instead of waiting, while a build holds the output directory",
    )
    return parser


def report_parser() -> KilnArgumentParser:
    parser = KilnArgumentParser(
        prog="kiln report",
        description="Write an HTML page of the last build, or of one of the builds before "
        "it that the output directory keeps; needs no build module. Prints the page's path "
        "on stdout. A page written inside the output directory is kiln's (kiln clean "
        "removes it); one written elsewhere is yours. A page never goes over one of kiln's "
        "own files.",
    )
    parser.add_argument(
        "module",
        nargs="?",
        help="the build module (not loaded; accepted for symmetry, and never written over)",
    )
    _output_dir_option(parser, "the build's output directory (default: ./kiln-out)")
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        metavar="FILE",
        help="where to write the page (default: OUTPUT_DIR/report.html; with --build N, "
        "OUTPUT_DIR/report-N.html)",
    )
    parser.add_argument(
        "--build",
        type=build_number,
        default=0,
        metavar="N",
        help=f"the build N builds before the last (kiln keeps the last {KEPT_BUILDS}; "
        "default 0: the last)",
    )
    parser.add_argument(
        "--list", action="store_true", help="list the kept builds on stdout; write no page"
    )
    parser.add_argument("--json", action="store_true", help="with --list: one JSON document")
    return parser


def build_number(text: str) -> int:
    """A ``--build`` value: how many builds before the last, 0 for the last."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if not 0 <= value < KEPT_BUILDS:
        raise argparse.ArgumentTypeError(
            f"kiln keeps the last {KEPT_BUILDS} builds: give 0 (the last) to {KEPT_BUILDS - 1}"
        )
    return value


def cache_parser() -> KilnArgumentParser:
    parser = KilnArgumentParser(
        prog="kiln cache", description="the local cache ('kiln cache' alone: its stats)"
    )
    sub = parser.add_subparsers(dest="action", metavar="stats|gc|clear")
    sub.required = False  # 'kiln cache' alone: stats
    for name, text in (
        ("stats", "entries, size, hits and misses of the last builds"),
        ("gc", "evict least-recently-used results down to the size bound"),
        ("clear", "remove everything kiln keeps in the cache"),
    ):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument(
            "--cache-dir",
            type=directory_path,
            default=None,
            help="the cache (default: $KILN_CACHE_DIR, else ~/.cache/kiln)",
        )
        if name == "stats":
            p.add_argument("--json", action="store_true", help="print one JSON document")
        if name == "gc":
            p.add_argument(
                "--max-size",
                type=size_option,
                default=None,
                metavar="SIZE",
                help="default: $KILN_CACHE_MAX_SIZE, else 10G",
            )
    return parser


def compare_parser() -> KilnArgumentParser:
    parser = KilnArgumentParser(
        prog="kiln compare",
        description="Compare two builds: each artifact added, removed, renamed, unchanged or "
        "changed (and why), and per compiled module its size, compile time, latency (ratio "
        "B/A with an interval), verification and outputs. A and B: output directories, "
        "manifest files, or @-N (@0 the last build of --output-dir, @-1 the one before).",
    )
    parser.add_argument("a", metavar="A", help="the build before")
    parser.add_argument("b", metavar="B", help="the build after")
    _output_dir_option(parser, "the output directory whose builds @-N name (default: ./kiln-out)")
    parser.add_argument("--json", action="store_true", help="print one JSON document")
    parser.add_argument(
        "--fail-if",
        action="append",
        default=[],
        metavar="CONDITIONS",
        help="exit 1 when a row meets one: slower[>P%%], size[>P%%], accuracy, new-failures "
        "(comma-separated, or repeated; quote a '>' from the shell)",
    )
    parser.add_argument(
        "--measure",
        action="store_true",
        help="benchmark here the modules whose digest differs, A and B "
        "interleaved, until each is classed or --budget runs out",
    )
    parser.add_argument(
        "--budget",
        type=seconds_option,
        default=120.0,
        metavar="SECONDS",
        help="for --measure (default: 120)",
    )
    parser.add_argument(
        "--html", type=Path, default=None, metavar="FILE", help="also write the comparison page"
    )
    return parser


def devices_parser() -> KilnArgumentParser:
    """``kiln devices``'s parser (kiln's: --help and a bad option end as every
    command's do)."""
    p = KilnArgumentParser(
        prog="kiln devices",
        description="list the devices kiln finds here, or on every worker of a cluster",
    )
    p.add_argument("--json", action="store_true", help="print JSON: {machine: [device, ...]}")
    add_executor_options(p)
    return p
