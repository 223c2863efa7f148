"""The manifests of the builds before the last, kept in ``OUTPUT_DIR/.kiln/manifests/``
so that ``kiln compare @-1 @0`` can compare two builds of one output directory. The
manifest's writer keeps them (``write_manifest``); ``kiln.compare`` reads them.

Format: ``.kiln/manifests/<n>.json`` is, byte for byte, the ``manifest.json`` that the
build ``n`` builds before the last left (``1``: the one just before); at most
``KEPT_MANIFESTS`` are kept, the oldest dropped. A build whose manifest is the same,
byte for byte, as the one before (a no-op rebuild) keeps no copy: the history holds
builds that differ. Only kiln writes there: the directory must be a real one (never
a link), each copy is written to a temporary name and renamed into place, only
regular files are shifted, and nothing is followed; what cannot be kept is a
warning, never a failed build. ``kiln clean`` removes the directory with the rest of
kiln's state.
"""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable
from pathlib import Path

from kiln.base.errors import NotRegularFile, StateError
from kiln.output_dir.layout import MANIFEST
from kiln.output_dir.ownership import KILN_DIR, own_dir_checked, read_regular
from kiln.output_dir.writing import atomic_write

HISTORY_DIR = "manifests"
KEPT_MANIFESTS = 10  # the builds before the last whose manifests stay
MAX_MANIFEST_BYTES = 256 << 20  # a manifest larger than this is not one kiln wrote


def history_dir(output_dir: Path) -> Path:
    return output_dir / KILN_DIR / HISTORY_DIR


def kept_manifest(output_dir: Path, n: int) -> Path:
    """Where the manifest of the build ``n`` builds before the last is (0: the last).
    StateError when kiln's directories on the way (``.kiln``, its ``manifests``) are
    there as anything but real directories: kiln reads its history, as it writes it,
    never through a link."""
    if n == 0:
        return output_dir / MANIFEST
    for directory in (output_dir / KILN_DIR, history_dir(output_dir)):
        with contextlib.suppress(FileNotFoundError):
            own_dir_checked(directory)
    return history_dir(output_dir) / f"{n}.json"


def read_manifest_bytes(path: Path) -> bytes | None:
    """``path``'s bytes if it is a regular file of a manifest's size, else None."""
    try:
        data = read_regular(path, MAX_MANIFEST_BYTES + 1)
    except (OSError, NotRegularFile):
        return None
    return data if len(data) <= MAX_MANIFEST_BYTES else None


def keep_previous(output_dir: Path, old: bytes, warn: Callable[[str], None]) -> None:
    """Keep ``old``, the manifest a build just replaced with another, as ``1.json``,
    the others shifted one place back; what cannot be kept is a warning."""
    try:
        _push(history_dir(output_dir), old)
    except (OSError, StateError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
        warn(f"warning: cannot keep the previous manifest in {history_dir(output_dir)}: {reason}")


def _push(directory: Path, old: bytes) -> None:
    with contextlib.suppress(FileExistsError):
        directory.mkdir()
    own_dir_checked(directory)  # a link or a file there: refused, nothing written
    for n in range(KEPT_MANIFESTS - 1, 0, -1):
        source = directory / f"{n}.json"
        with contextlib.suppress(OSError):
            if stat.S_ISREG(os.lstat(source).st_mode):
                os.replace(source, directory / f"{n + 1}.json")
    with atomic_write(directory / "1.json") as f:
        f.write(old)
