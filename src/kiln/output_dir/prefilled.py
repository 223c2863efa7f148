"""Output directories a user filled before kiln's first build there.

Builders written for iree.build expect files placed by hand under the output
directory (weights in ``OUT/genfiles/<entrypoint>/``) before they run. kiln takes
over a directory that holds nothing but its namespace folders (``genfiles/``,
``params/``, ``bin/``, ``platform/``, real directories, whatever lies in them),
and lists in ``.kiln/user-files`` (a JSON list of paths relative to the output
directory) the files that were there: they are the user's. kiln reads them as
inputs, never writes an output over one (the action fails naming it), and
``kiln clean`` never deletes them (it deletes only what kiln wrote).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

# The folders of ``kiln.output_dir.layout``'s namespaces, at the top of an output directory.
NAMESPACE_DIRS = frozenset({"genfiles", "params", "bin", "platform"})
USER_FILES = "user-files"  # in .kiln/


def is_prefilled(root: Path) -> bool:
    """Whether ``root`` holds something, and only real directories named as kiln's
    namespace folders. Reads only."""
    found = False
    with os.scandir(root) as entries:
        for entry in entries:
            if entry.name not in NAMESPACE_DIRS or not entry.is_dir(follow_symlinks=False):
                return False
            found = True
    return found


def list_user_files(root: Path) -> list[str]:
    """Everything but directories below the namespace folders of ``root`` (links not
    followed), as sorted paths relative to ``root``."""
    found = []
    for top in sorted(NAMESPACE_DIRS):
        for here, dirs, files in os.walk(root / top):
            rel = os.path.relpath(here, root)
            found += [f"{rel}/{name}" for name in files]
            found += [
                f"{rel}/{d}" for d in dirs if stat.S_ISLNK(os.lstat(os.path.join(here, d)).st_mode)
            ]
    return sorted(found)
