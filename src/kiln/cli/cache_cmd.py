"""``kiln cache stats|gc|clear``: look at and tidy the local cache."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import IO

from kiln.cache import LocalCache, format_size
from kiln.cli.cache_options import cache_dir, max_size, size_option
from kiln.cli.options import KilnArgumentParser

_BUILDS_SHOWN = 10


def run(argv: list[str], out: IO[str], err: IO[str]) -> int:
    parser = KilnArgumentParser(prog="kiln cache", description="the local cache")
    sub = parser.add_subparsers(dest="action", metavar="stats|gc|clear")
    sub.required = True
    for name, text in (
        ("stats", "entries, size, hits and misses of the last builds"),
        ("gc", "evict least-recently-used results down to the size bound"),
        ("clear", "remove everything in the cache"),
    ):
        p = sub.add_parser(name, help=text, description=text)
        p.add_argument(
            "--cache-dir",
            type=Path,
            default=None,
            help="the cache (default: $KILN_CACHE_DIR, else ~/.cache/kiln)",
        )
        if name == "gc":
            p.add_argument(
                "--max-size",
                type=size_option,
                default=None,
                metavar="SIZE",
                help="default: $KILN_CACHE_MAX_SIZE, else 10G",
            )
    ns = parser.parse_args(argv)
    cache = LocalCache(cache_dir(ns))
    if ns.action == "stats":
        _stats(cache, ns, out)
    elif ns.action == "gc":
        bound = max_size(ns, "max_size")
        files, freed = cache.gc(bound)
        print(
            f"kiln: removed {files} file(s), {format_size(freed)}; "
            f"{format_size(cache.usage().bytes)} left (bound {format_size(bound)})",
            file=err,
        )
    else:
        cache.clear()
        print(f"kiln: cleared the cache {cache.root}", file=err)
    return 0


def _stats(cache: LocalCache, ns: argparse.Namespace, out: IO[str]) -> None:
    usage = cache.usage()
    print(f"cache: {cache.root}", file=out)
    print(f"entries: {usage.entries}", file=out)
    print(f"blobs: {usage.blobs}", file=out)
    print(f"size: {format_size(usage.bytes)} of {format_size(max_size(ns))}", file=out)
    builds = cache.builds()[-_BUILDS_SHOWN:]
    if not builds:
        print("no builds recorded yet", file=out)
        return
    print("last builds:", file=out)
    for b in builds:
        print(
            f"  {b.get('time', '?')}: {b.get('hits', 0)} hits ({b.get('remote_hits', 0)} "
            f"remote), {b.get('misses', 0)} misses, {b.get('stored', 0)} stored, "
            f"{b.get('corrupt', 0)} corrupt",
            file=out,
        )
