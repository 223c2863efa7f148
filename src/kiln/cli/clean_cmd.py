"""``kiln clean``: remove what kiln wrote in the output directory, and only that.

kiln deletes the files its state records as written by it (the ``written``
ledger and the outputs of recorded actions), its temporaries beside them,
``manifest.json`` and its own files in ``.kiln/``, then the directories left
empty. It never follows a link: a link where kiln's file or directory should be
is removed as a link. A directory that is not kiln's is refused before anything
is touched; files kiln did not write are kept and listed.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path
from typing import IO

from kiln.cli import project_config
from kiln.cli.plain_parsers import clean_parser
from kiln.observe.event_log import is_kept_events
from kiln.output_dir.layout import HOST_MEMO, KILN_TREES, MANIFEST
from kiln.output_dir.lock import OutputLock
from kiln.output_dir.ownership import KILN_DIR, MARKER, output_dir_state
from kiln.output_dir.prefilled import USER_FILES
from kiln.output_dir.writing import is_temporary, remove_quietly
from kiln.state.snapshot import StateSnapshot

_SHOWN = 5


def run(argv: list[str], out: IO[str], err: IO[str]) -> int:
    ns = project_config.parse(clean_parser(), argv, os.getcwd())
    root: Path = ns.output_dir.absolute()
    if output_dir_state(root) != "kiln":  # refuses a directory that is not kiln's
        print(f"kiln: nothing to clean in {root} (not a kiln output directory)", file=err)
        return 0
    with OutputLock(root, wait=not ns.no_wait, notify=lambda m: print(m, file=err)):
        state = StateSnapshot(root, warn=lambda m: print(m, file=err))
        try:
            owned = state.written_outputs() | state.recorded_outputs()
        finally:
            state.close()
        removed = _Remover(root)
        for rel in sorted(owned):
            removed.owned_file(rel)
        removed.own_file(root / MANIFEST)
        removed.prune_dirs()
        kept = [e.name for e in os.scandir(root) if e.name != KILN_DIR]
        removed.kiln_dir(root / KILN_DIR, keep_marker=bool(kept))
    print(f"kiln: cleaned {root} ({removed.count} removed)", file=err)
    if kept:
        shown = ", ".join(sorted(kept)[:_SHOWN]) + (", ..." if len(kept) > _SHOWN else "")
        print(f"kiln: kept what kiln did not write: {shown}", file=err)
    return 0


# The last build's record (kiln report reads it).
# kiln's own files under .kiln/ besides the state and the marker.
_LAST_BUILD = ("last-events.jsonl", "last-trace.json", HOST_MEMO)


class _Remover:
    """Removes kiln's files below ``root`` without following a link.

    Invariant: ``_dirs`` holds every directory a removed file was in, to prune the
    ones left empty; nothing outside ``root`` is ever touched.
    """

    def __init__(self, root: Path):
        self.root = root
        self.count = 0
        self._dirs: set[str] = set()
        self._swept: set[str] = set()

    def _unlink(self, path: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            self.count += 1

    def owned_file(self, rel: str) -> None:
        """Remove the output ``rel``; a link on its way is removed as a link."""
        parts = [p for p in rel.split("/") if p not in ("", ".", "..")]
        path = str(self.root)
        for part in parts[:-1]:
            path = os.path.join(path, part)
            try:
                mode = os.lstat(path).st_mode
            except (FileNotFoundError, NotADirectoryError):
                return
            if stat.S_ISLNK(mode):
                self._unlink(path)  # e.g. a symlinked genfiles: the link, not its target
                return
            if not stat.S_ISDIR(mode):
                return
            self._dirs.add(path)
        self._sweep(path)
        target = os.path.join(path, parts[-1]) if parts else path
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            if not stat.S_ISDIR(os.lstat(target).st_mode):
                self._unlink(target)

    def _sweep(self, directory: str) -> None:
        if directory in self._swept:
            return
        self._swept.add(directory)
        with contextlib.suppress(OSError), os.scandir(directory) as entries:
            for entry in entries:
                if is_temporary(entry.name):
                    self._unlink(entry.path)

    def own_file(self, path: Path) -> None:
        with contextlib.suppress(FileNotFoundError):
            if not stat.S_ISDIR(os.lstat(path).st_mode):
                self._unlink(str(path))

    def prune_dirs(self) -> None:
        """Remove the directories left empty, deepest first (never the root)."""
        for directory in sorted(self._dirs, key=len, reverse=True):
            with contextlib.suppress(OSError):  # not empty: something of the user's
                os.rmdir(directory)

    def kiln_dir(self, kiln_dir: Path, keep_marker: bool) -> None:
        """Remove kiln's own files; ``.kiln/`` itself too unless files remain that kiln
        did not write (then the marker stays, so the directory is still kiln's)."""
        for sub in KILN_TREES:
            self._tree(kiln_dir / sub)
        for entry in list(os.scandir(kiln_dir)):
            name = entry.name
            ours = (
                name.startswith("state.db")
                or name in _LAST_BUILD
                or is_kept_events(name)
                or (name in (MARKER, "lock", USER_FILES) and not keep_marker)
            )
            if ours and not entry.is_dir(follow_symlinks=False):
                self._unlink(entry.path)
        if not keep_marker:
            with contextlib.suppress(OSError):
                os.rmdir(kiln_dir)

    def _tree(self, top: Path) -> None:
        """Remove kiln's directory ``top`` (logs, temporaries); a link is unlinked."""
        try:
            if not stat.S_ISDIR(os.lstat(top).st_mode):
                self._unlink(str(top))
                return
        except FileNotFoundError:
            return
        for here, dirs, files in os.walk(top, topdown=False):
            for name in files + [d for d in dirs if os.path.islink(os.path.join(here, d))]:
                remove_quietly(os.path.join(here, name))
                self.count += 1
            with contextlib.suppress(OSError):
                os.rmdir(here)
