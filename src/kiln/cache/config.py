"""Where the cache lives and how big it may grow: the defaults and the size syntax;
and that it lies apart from the output directory (``check_apart``)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from kiln.base.errors import UsageError

DEFAULT_MAX_SIZE = 10 << 30
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*\Z", re.IGNORECASE)
_POWERS = {"": 0, "k": 1, "m": 2, "g": 3, "t": 4}


def default_cache_dir(env: Mapping[str, str] | None = None) -> Path:
    """``$KILN_CACHE_DIR``, else ``kiln`` under ``$XDG_CACHE_HOME`` or ``~/.cache``."""
    env = os.environ if env is None else env
    if env.get("KILN_CACHE_DIR"):
        return Path(env["KILN_CACHE_DIR"])
    xdg = env.get("XDG_CACHE_HOME")
    base = Path(xdg) if xdg and os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "kiln"


def check_apart(cache_dir: Path, output_dir: Path) -> None:
    """UsageError, naming both, when the cache directory and the output directory
    overlap: the same directory, or one inside the other, either way. Decided by
    their resolved paths (links and ``..`` followed, relative to the working
    directory), and by the identity of the directories that exist (a bind mount is
    no way around it): the same answer on every build, whatever either holds."""
    cache, output = Path(os.path.realpath(cache_dir)), Path(os.path.realpath(output_dir))
    if _within(cache, output) and _within(output, cache):
        how = "are the same directory"
    elif _within(cache, output):
        how = "overlap: the cache is inside the output directory"
    elif _within(output, cache):
        how = "overlap: the output directory is inside the cache"
    else:
        return
    raise UsageError(
        f"the cache directory {cache_dir} and the output directory {output_dir} {how}; "
        "kiln keeps the two apart (what one holds is never the other's): choose another "
        "--cache-dir (or KILN_CACHE_DIR) or --output-dir, or build with --no-cache"
    )


def _within(inner: Path, outer: Path) -> bool:
    """Whether the resolved path ``inner`` is ``outer`` or lies inside it."""
    if inner == outer or outer in inner.parents:
        return True
    try:
        found = os.stat(outer)
    except OSError:
        return False
    for path in (inner, *inner.parents):
        try:
            st = os.stat(path)
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (found.st_dev, found.st_ino):
            return True
    return False


def parse_size(text: str) -> int:
    """Bytes in ``text``: a number with an optional unit, K/M/G/T or KiB/MiB/GiB/TiB
    (powers of 1024) or KB/MB/GB/TB (powers of 1000); ValueError otherwise."""
    m = _SIZE.match(text)
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 500M, 10G, 2GiB, 1500000)")
    number, unit, suffix = float(m[1]), m[2].lower(), m[3].lower()
    base = 1000 if suffix == "b" and unit else 1024
    return int(number * base ** _POWERS[unit])


def format_size(size: int) -> str:
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024:
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} TiB"
