"""The directories of the output tree, made and checked one component at a time.

Part of ``kiln.output_dir`` (see its docstring for the trust model):
below the output root, kiln creates directories with ``mkdir`` after an ``lstat``
of each component, so a pre-planted link (``genfiles/<entrypoint> -> /elsewhere``)
is never written through.
"""

from __future__ import annotations

import contextlib
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path

from kiln.base.errors import ConfinementError
from kiln.output_dir.ownership import claim_output_dir
from kiln.output_dir.writing import file_kind, is_temporary, link_text, remove_quietly


class OutputTree:
    """The directories below one output root, made and checked component by component.

    Invariant: a directory path in ``_checked`` mapped to None was seen, during this
    build, to be a real directory all the way down from the root (no component a
    link or another kind of file); kiln writes only into such directories.
    """

    def __init__(
        self,
        root: Path,
        warn: Callable[[str], None],
        *,
        claim: Callable[[Path], object] = claim_output_dir,
        name: str = "the output directory",
    ):
        # ``claim`` makes the root kiln's before the first directory is made below
        # it; ``name`` is what messages call the tree (the cache uses one too).
        self.root = Path(os.path.normpath(Path(root).absolute()))
        self._root_str = str(self.root)
        self._warn = warn
        self._claim = claim
        self.name = name
        self._checked: dict[str, str | None] = {}
        self._inspected: dict[str, str | None] = {}  # dir_problem's answers (reads only)
        self._lock = threading.Lock()

    def _components(self, directory: str) -> list[str]:
        """The directories from just below the root down to ``directory``."""
        directory = os.path.normpath(directory)
        rel = os.path.relpath(directory, self._root_str)
        if rel == ".":
            return []
        if rel == ".." or rel.startswith("../") or os.path.isabs(rel):
            raise ConfinementError(f"{directory} is outside {self.name} {self.root}")
        parts, out = rel.split(os.sep), []
        for i in range(len(parts)):
            out.append(os.path.join(self._root_str, *parts[: i + 1]))
        return out

    def dir_problem(self, directory: str) -> str | None:
        """Why ``directory`` is not a real directory below the root (reads only), or None."""
        cached = self._inspected.get(directory, "")
        if cached != "" or self._checked.get(directory, "") is None:
            return cached or None
        problem = None
        for path in self._components(directory):
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                break  # missing is not a problem of kind; the file check reports it
            if not stat.S_ISDIR(st.st_mode):
                rel = os.path.relpath(path, self._root_str)
                problem = f"its directory {rel} is {file_kind(st.st_mode)}"
                break
        else:
            self._inspected[directory] = None
        return problem

    def make_dirs(
        self, directory: Path | str, *, heal: Callable[[str], bool] | None = None
    ) -> None:
        """Create ``directory`` below the root one component at a time. Without
        ``heal`` anything else in the way is a ConfinementError naming it. With it, a
        link, FIFO, socket or device is removed (never followed), and so is a regular
        file for which ``heal(path relative to the root)`` says kiln wrote it."""
        directory = os.path.normpath(str(directory))
        if self._checked.get(directory, "") is None:
            return
        with self._lock:
            if self._checked.get(self._root_str, "") is not None:
                self._claim(self.root)  # never writes into a directory that is not kiln's
                self._checked[self._root_str] = None
            for path in self._components(directory):
                if self._checked.get(path, "") is not None:
                    self._make_one(path, heal)
                    self._checked[path] = None

    def _make_one(self, path: str, heal: Callable[[str], bool] | None) -> None:
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            with contextlib.suppress(FileExistsError):
                os.mkdir(path)
            st = os.lstat(path)
        if stat.S_ISDIR(st.st_mode):
            return
        what = link_text(path) if stat.S_ISLNK(st.st_mode) else f"{path} ({file_kind(st.st_mode)})"
        ours = stat.S_ISREG(st.st_mode) and heal and heal(os.path.relpath(path, self._root_str))
        if heal is None or (stat.S_ISREG(st.st_mode) and not ours):
            raise ConfinementError(
                f"{what} is where kiln needs a directory of {self.name}; "
                "kiln never writes through links: remove it"
            )
        remove_quietly(path)
        self._warn(
            f"warning: removed {what}, where kiln needs a directory; its target is untouched"
        )
        os.mkdir(path)

    def prepare_output(self, path: Path | str, owned: Callable[[str], bool]) -> None:
        """Make ``path`` ready for an action to write: real directories above it, and
        nothing there but a regular file (a link, FIFO, socket or device is removed,
        never followed; a directory only when it holds nothing but kiln's files)."""
        path = str(path)
        self.make_dirs(os.path.dirname(path), heal=owned)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return
        if stat.S_ISREG(st.st_mode):
            return
        if stat.S_ISDIR(st.st_mode):
            self._remove_owned_dir(path, owned)
            return
        what = link_text(path) if stat.S_ISLNK(st.st_mode) else f"{path} ({file_kind(st.st_mode)})"
        remove_quietly(path)
        self._warn(f"warning: removed {what}, where kiln writes an output; its target is untouched")

    def _remove_owned_dir(self, path: str, owned: Callable[[str], bool]) -> None:
        """Remove the directory ``path`` if everything in it is kiln's; else refuse."""
        doomed: list[tuple[str, bool]] = []
        for top, dirs, files in os.walk(path, topdown=False):
            for name in files + [d for d in dirs if os.path.islink(os.path.join(top, d))]:
                full = os.path.join(top, name)
                rel = os.path.relpath(full, self._root_str)
                if not (owned(rel) or is_temporary(name)):
                    raise ConfinementError(
                        f"output {path} is a directory holding {full}, which kiln did not "
                        "write; move it away or rename the output"
                    )
                doomed.append((full, False))
            doomed.append((top, True))
        for full, is_dir in doomed:
            if is_dir:
                with contextlib.suppress(FileNotFoundError):
                    os.rmdir(full)
            else:
                remove_quietly(full)
        self._warn(f"warning: removed the directory {path}, where kiln writes an output")
