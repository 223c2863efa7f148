"""Whose a cache directory is: kiln's only when marked.

kiln uses a directory as its cache only when it is new, empty, marked as kiln's
(``.kiln/format`` holding ``kiln-cache/1``) or made by a kiln from before the
marker (``v1/`` holding only kiln's names). ``cache_dir_state`` reads only;
``claim_cache_dir`` writes the marker before anything else is written. Any other
directory (a project, a kiln output directory, a newer format) is refused with a
``UsageError`` naming how to choose another. ``kiln.cache.cache_dir.CacheDir``
claims the directory before its first write.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from kiln.base.errors import StateError, UsageError
from kiln.output_dir.ownership import KILN_DIR, MARKER, marker_problem, own_dir_checked
from kiln.output_dir.writing import atomic_write, is_temporary, link_text

FORMAT_DIR = "v1"
FORMAT_NAME = "kiln-cache"
FORMAT_VERSION = 1
# What a kiln from before the marker kept in v1/.
_V1_NAMES = frozenset({"ac", "cas", "tmp", "builds.log"})


def _refuse(root: Path, why: str) -> UsageError:
    return UsageError(
        f"refusing to use {root} as the cache: {why}; kiln keeps its cache only in a new, "
        "empty or kiln-made directory: choose another with --cache-dir or KILN_CACHE_DIR, "
        "or build with --no-cache"
    )


def cache_dir_state(root: Path, again: bool = True) -> str:
    """``missing``, ``empty``, ``kiln`` or ``legacy`` (made by a kiln before the
    marker) for a directory kiln may use as its cache; UsageError for any other,
    OSError when it cannot be read. Reads only. ``again``: look once more when a
    claim completed while this look was made."""
    try:
        st = os.stat(root)
    except FileNotFoundError:
        return "missing"
    if not stat.S_ISDIR(st.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, "Not a directory", str(root))
    names = set(os.listdir(root))
    marker_dir = root / KILN_DIR
    if KILN_DIR not in names:
        if not names:
            return "empty"
        if names == {FORMAT_DIR} and _is_legacy(root / FORMAT_DIR):
            return "legacy"
        raise _refuse(root, f"it is not empty and is not a kiln cache (no {KILN_DIR}/{MARKER})")
    kst = os.lstat(marker_dir)
    if not stat.S_ISDIR(kst.st_mode):
        what = link_text(marker_dir) if stat.S_ISLNK(kst.st_mode) else str(marker_dir)
        raise _refuse(root, f"{what} is not a directory kiln made")
    try:
        why = marker_problem(marker_dir, FORMAT_NAME, FORMAT_VERSION)
    except FileNotFoundError:
        # Killed while claiming it, or claimed by another build this very moment: then
        # the marker may be there by now, and a second look reads it.
        present = os.listdir(marker_dir)
        if again and MARKER in present:
            return cache_dir_state(root, again=False)
        claiming = all(is_temporary(n) for n in present)
        rest = names - {KILN_DIR}
        if claiming and (not rest or (rest == {FORMAT_DIR} and _is_legacy(root / FORMAT_DIR))):
            return "legacy"
        raise _refuse(root, f"{marker_dir} holds no {MARKER} file") from None
    if why is not None:
        raise _refuse(root, why)
    return "kiln"


def _is_legacy(v1: Path) -> bool:
    """Whether ``v1`` is a real directory holding nothing but kiln's names."""
    with contextlib.suppress(OSError):
        if stat.S_ISDIR(os.lstat(v1).st_mode):
            return set(os.listdir(v1)) <= _V1_NAMES
    return False


def claim_cache_dir(root: Path) -> None:
    """Make ``root`` kiln's cache (creating it if new): the marker is written before
    anything else. UsageError if it is another program's directory."""
    state = cache_dir_state(root)
    if state == "kiln":
        return
    if state == "missing":
        os.makedirs(root, exist_ok=True)
    with contextlib.suppress(FileExistsError):
        os.mkdir(root / KILN_DIR)
    try:
        own_dir_checked(root / KILN_DIR)
    except StateError as e:
        raise _refuse(root, str(e)) from None
    with atomic_write(root / KILN_DIR / MARKER, "w") as f:
        f.write(f"{FORMAT_NAME}/{FORMAT_VERSION}\n")
