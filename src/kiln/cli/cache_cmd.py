"""``kiln cache stats|gc|clear``: look at and tidy the local cache.

Exit status: 0 done; 2 a usage error, or a directory that is not kiln's cache
(refused before anything is read or removed); 1 the cache could not be read or
changed (a read-only mount, permissions), with a message. Only kiln's entries,
blobs and temporaries are ever removed; anything else found in the cache's layout
is named and left.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import IO, Any

from kiln.base.terminal import printable
from kiln.cache import LocalCache, format_size
from kiln.cache.claim import cache_dir_state, claim_cache_dir
from kiln.cli import project_config
from kiln.cli.cache_options import cache_dir, max_size
from kiln.cli.plain_parsers import cache_parser

_BUILDS_SHOWN = 10


def run(argv: list[str], out: IO[str], err: IO[str]) -> int:
    # 'kiln cache' alone, or with options only (the cache's), is 'kiln cache stats'.
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help")):
        argv = ["stats", *argv]
    ns = project_config.parse(cache_parser(), argv, os.getcwd())
    root = cache_dir(ns)
    bound = max_size(ns, "max_size") if ns.action == "gc" else 0
    cache = LocalCache(root, lambda text: print(text, file=err))
    try:
        state = cache_dir_state(root)  # a directory that is not kiln's: UsageError
        if ns.action == "stats":
            return _stats(cache, ns, out)
        if state in ("missing", "empty"):
            print(f"kiln: the cache {root} holds nothing", file=err)
            return 0
        if state == "legacy":
            claim_cache_dir(root)  # made by an older kiln: marked as kiln's now
        if ns.action == "gc":
            files, freed = cache.gc(bound)
            print(
                f"kiln: removed {files} file(s), {format_size(freed)}; "
                f"{format_size(cache.usage().bytes)} left (bound {format_size(bound)})",
                file=err,
            )
        else:
            files = cache.clear()
            print(f"kiln: cleared the cache {root} ({files} file(s) removed)", file=err)
    except OSError as e:
        where = printable(e.filename if isinstance(e.filename, str) else str(root))
        print(
            f"kiln: error: cannot {ns.action} the cache {root}: {where}: {e.strerror or e}",
            file=err,
        )
        return 1
    return 0


def _build_row(b: dict[str, Any]) -> dict[str, Any]:
    """A build of the cache's shared log, as ``stats --json`` gives it: its known
    fields only, each of its type (the log is any build's, of any content)."""
    row: dict[str, Any] = {"time": b["time"] if isinstance(b.get("time"), str) else None}
    for field in ("hits", "remote_hits", "misses", "stored", "corrupt"):
        value = b.get(field)
        row[field] = value if type(value) is int else 0
    return row


def _stats(cache: LocalCache, ns: argparse.Namespace, out: IO[str]) -> int:
    usage = cache.usage()
    if ns.json:
        doc = {
            "cache": str(cache.root),
            "entries": usage.entries,
            "blobs": usage.blobs,
            "bytes": usage.bytes,
            "max_bytes": max_size(ns),
            "builds": [_build_row(b) for b in cache.builds()[-_BUILDS_SHOWN:]],
        }
        print(json.dumps(doc, indent=2), file=out)
        return 0
    print(f"cache: {cache.root}", file=out)
    print(f"entries: {usage.entries}", file=out)
    print(f"blobs: {usage.blobs}", file=out)
    print(f"size: {format_size(usage.bytes)} of {format_size(max_size(ns))}", file=out)
    builds = cache.builds()[-_BUILDS_SHOWN:]
    if not builds:
        print("no builds recorded yet", file=out)
        return 0
    print("last builds:", file=out)
    for b in builds:
        print(
            printable(
                f"  {b.get('time', '?')}: {b.get('hits', 0)} hits ({b.get('remote_hits', 0)} "
                f"remote), {b.get('misses', 0)} misses, {b.get('stored', 0)} stored, "
                f"{b.get('corrupt', 0)} corrupt"
            ),
            file=out,
        )
    return 0
