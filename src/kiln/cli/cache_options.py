"""The cache's command-line options and environment, and the cache they open."""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

from kiln.cache import DEFAULT_MAX_SIZE, BuildCache, LocalCache, default_cache_dir, parse_size
from kiln.errors import UsageError


def size_option(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def add_cache_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cache")
    g.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="the local cache (default: $KILN_CACHE_DIR, else kiln under "
        "$XDG_CACHE_HOME or ~/.cache)",
    )
    g.add_argument(
        "--no-cache", action="store_true", help="neither read nor fill any cache in this build"
    )
    g.add_argument(
        "--cache-max-size",
        type=size_option,
        default=None,
        metavar="SIZE",
        help="evict least-recently-used results beyond SIZE (default: "
        "$KILN_CACHE_MAX_SIZE, else 10G)",
    )
    g.add_argument(
        "--remote-cache",
        default=None,
        metavar="URL",
        help="an HTTP cache (Bazel's protocol: {URL}/ac/, {URL}/cas/) behind "
        "the local one (default: $KILN_REMOTE_CACHE)",
    )
    g.add_argument(
        "--remote-cache-upload",
        choices=("yes", "no"),
        default="yes",
        help="no: only read the remote cache (default: yes)",
    )
    g.add_argument(
        "--remote-cache-timeout",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="bound on each remote request (default: 10)",
    )


def cache_dir(ns: argparse.Namespace) -> Path:
    return ns.cache_dir if ns.cache_dir is not None else default_cache_dir()


def max_size(ns: argparse.Namespace, name: str = "cache_max_size") -> int:
    given = getattr(ns, name, None)
    if given is not None:
        return int(given)
    text = os.environ.get("KILN_CACHE_MAX_SIZE")
    if not text:
        return DEFAULT_MAX_SIZE
    try:
        return parse_size(text)
    except ValueError as e:
        raise UsageError(f"KILN_CACHE_MAX_SIZE: {e}") from None


def open_cache(ns: argparse.Namespace, warn: Callable[[str], None]) -> BuildCache | None:
    """The cache a ``build`` or ``explain`` with options ``ns`` uses; None when off."""
    if not hasattr(ns, "no_cache") or ns.no_cache:
        return None
    url = ns.remote_cache if ns.remote_cache is not None else os.environ.get("KILN_REMOTE_CACHE")
    remote = None
    if url:
        from kiln.cache.remote import RemoteCache

        if ns.remote_cache_timeout <= 0:
            raise UsageError("--remote-cache-timeout must be more than 0 seconds")
        try:
            remote = RemoteCache(
                url,
                upload=ns.remote_cache_upload == "yes",
                timeout_s=ns.remote_cache_timeout,
                warn=warn,
            )
        except ValueError as e:
            where = "--remote-cache" if ns.remote_cache is not None else "KILN_REMOTE_CACHE"
            raise UsageError(f"{where}: {e}; give an http:// or https:// URL") from None
    return BuildCache(LocalCache(cache_dir(ns)), remote, max_size=max_size(ns), warn=warn)
