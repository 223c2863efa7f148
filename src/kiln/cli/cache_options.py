"""The cache's command-line options and environment, and the cache they open."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Callable
from pathlib import Path

from kiln.base.errors import StateError, UsageError
from kiln.cache import DEFAULT_MAX_SIZE, BuildCache, LocalCache, default_cache_dir, parse_size
from kiln.cache.config import check_apart
from kiln.output_dir.ownership import output_dir_state


def size_option(text: str) -> int:
    try:
        return parse_size(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def seconds_option(text: str) -> float:
    """A timeout in seconds: a finite number above 0 (and at most a day)."""
    from kiln.cache.http_transport import check_timeout

    try:
        return check_timeout(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a number of seconds above 0 and at most 86400, got {text!r}"
        ) from None


def directory_path(text: str) -> Path:
    """A directory option's value (``--output-dir``, ``--cache-dir``): an empty one
    would silently mean the working directory."""
    if not text.strip():
        raise argparse.ArgumentTypeError("must name a directory, got an empty string")
    return Path(text)


def add_cache_options(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("cache")
    g.add_argument(
        "--cache-dir",
        type=directory_path,
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
        type=seconds_option,
        default=10.0,
        metavar="SECONDS",
        help="bound on each remote request, all of it, plus a second per MiB it "
        "moves (default: 10)",
    )


def cache_dir(ns: argparse.Namespace, base: str | None = None) -> Path:
    """The cache directory the options name, absolute (relative to ``base``, the
    directory kiln started in: a build module that changes directory moves nothing)."""
    path = ns.cache_dir if ns.cache_dir is not None else default_cache_dir()
    return Path(os.path.join(base or os.getcwd(), path))


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


def check_cache_dir(root: Path) -> None:
    """UsageError unless kiln may use ``root`` as its cache (reads only); a directory
    kiln cannot read is left for the build to report."""
    from kiln.cache.claim import cache_dir_state

    with contextlib.suppress(OSError):
        cache_dir_state(root)


def open_cache(
    ns: argparse.Namespace, warn: Callable[[str], None], base: str | None = None
) -> BuildCache | None:
    """The cache a ``build`` or ``explain`` with options ``ns`` uses; None when off.
    Every option is checked here, before the build starts; the cache and the output
    directory never overlap (``check_apart``)."""
    if not hasattr(ns, "no_cache") or ns.no_cache:
        return None
    url = ns.remote_cache if ns.remote_cache is not None else os.environ.get("KILN_REMOTE_CACHE")
    remote = None
    if url:
        from kiln.cache.remote import RemoteCache

        try:
            remote = RemoteCache(
                url,
                upload=ns.remote_cache_upload == "yes",
                timeout_s=ns.remote_cache_timeout,
                warn=warn,
            )
        except ValueError as e:
            where = "--remote-cache" if ns.remote_cache is not None else "KILN_REMOTE_CACHE"
            raise UsageError(f"{where}: {e}") from None
    root = cache_dir(ns, base)
    output_dir = Path(os.path.join(base or os.getcwd(), ns.output_dir))
    # An output directory that is not kiln's (``/``, a project) is refused as such
    # first: that is what the user must change.
    with contextlib.suppress(StateError):
        output_dir_state(output_dir)
    check_apart(root, output_dir)
    check_cache_dir(root)
    return BuildCache(LocalCache(root, warn), remote, max_size=max_size(ns), warn=warn)
