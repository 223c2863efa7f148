"""Checking output names when the graph is defined, before anything touches the disk.

An output name is refused (a ``BuildDefinitionError`` naming it and the user's
file and line) when it holds a control character (NUL included) or a byte that is
not UTF-8 (from a command-line argument: ``os.fsdecode``'s lone surrogate), when one of its
components is longer than the file system allows (``NAME_MAX``, 255 bytes; kiln's
temporaries have short names of their own, so nothing is added to it), when the
whole path passes ``PATH_MAX``, when it looks like one of kiln's temporaries, or
when it would be both a file and a directory (``a`` and ``a/b``).
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path, PurePosixPath

from kiln.base.errors import BuildDefinitionError
from kiln.output_dir.ownership import NAME_MAX, PATH_MAX, non_utf8
from kiln.output_dir.writing import TMP_PREFIX

# Unicode's control characters (category Cc): C0, DEL and C1.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")


def name_problem(rel: str) -> str | None:
    """Why the output path ``rel`` (relative to the output root) cannot be a file name."""
    bad = _CONTROL.search(rel)
    if bad is not None:
        return f"holds the control character {bad.group()!r}; use printable characters"
    undecodable = non_utf8(rel)
    if undecodable is not None:
        return (
            f"holds the {undecodable}, which is not UTF-8; kiln records output names as "
            "UTF-8 text: use UTF-8 (in the module, or in the argument that names it)"
        )
    ascii_only = rel.isascii()  # then a component's length is its size in bytes
    for part in rel.split("/"):
        size = len(part) if ascii_only else len(os.fsencode(part))
        if size > NAME_MAX:
            return (
                f"has a component of {size} bytes ({part[:24]}...); file systems allow "
                f"{NAME_MAX}: shorten it"
            )
    if rel.rsplit("/", 1)[-1].startswith(TMP_PREFIX):
        return f"starts with {TMP_PREFIX!r}, which kiln reserves for its temporaries"
    return None


class OutputNames:
    """The on-disk names of a graph's outputs, to refuse one that is both a file and a
    directory.

    Invariant: ``_files`` maps each output's path (relative to the output root) to
    where it was defined; ``_dirs`` maps each directory those paths imply to the
    first output below it, and holds every ancestor of each directory it holds.
    ``_journal`` lists the additions in order, to undo them: a path alone, or a
    path and the directories it added.
    """

    def __init__(self, root: str):
        self._root = root
        self._root_size = len(os.fsencode(root)) + 1
        self._files: dict[str, object] = {}
        self._dirs: dict[str, tuple[str, object]] = {}
        self._journal: list[str | tuple[str, list[str]]] = []

    def add(self, rel: str, site: object) -> None:
        """Register the output ``rel`` defined at ``site`` (shown with ``str``), or
        raise naming both."""
        problem = name_problem(rel)
        if problem is None:
            size = len(rel) if rel.isascii() else len(os.fsencode(rel))
            if self._root_size + size >= PATH_MAX:
                problem = f"makes a path longer than the {PATH_MAX} bytes file systems allow"
        if problem is not None:
            raise BuildDefinitionError(f"output name {rel!r} (at {site}) {problem}")
        if rel in self._dirs:
            below, below_site = self._dirs[rel]
            raise self._clash(rel, site, below, below_site)
        cut = rel.rfind("/")
        if cut < 0 or rel[:cut] in self._dirs:
            # Its directory and all above it are known directories, so none is a file.
            if rel not in self._files:
                self._files[rel] = site
            self._journal.append(rel)
            return
        parts = rel.split("/")
        parents = ["/".join(parts[:i]) for i in range(1, len(parts))]
        for parent in parents:
            if parent in self._files:
                raise self._clash(parent, self._files[parent], rel, site)
        made = [p for p in parents if p not in self._dirs]
        for parent in made:
            self._dirs[parent] = (rel, site)
        self._files.setdefault(rel, site)
        self._journal.append((rel, made))

    @staticmethod
    def _clash(
        file: str, file_site: object, below: str, below_site: object
    ) -> BuildDefinitionError:
        return BuildDefinitionError(
            f"output {file!r} (at {file_site}) would be both a file and a directory: "
            f"{below!r} (at {below_site}) lies below it; rename one of them"
        )

    def mark(self) -> int:
        return len(self._journal)

    def undo(self, mark: int) -> None:
        """Forget the outputs added since ``mark`` (an entrypoint that failed)."""
        while len(self._journal) > mark:
            entry = self._journal.pop()
            rel, made = (entry, []) if isinstance(entry, str) else entry
            self._files.pop(rel, None)
            for parent in made:
                self._dirs.pop(parent, None)


def path_below(root: Path, rel: object) -> Path | None:
    """``rel``, a relative POSIX path read from a record kiln does not trust (a task,
    a manifest, a check's result), under ``root``; None when it is not a plain
    relative path (absolute, empty, with a ``..``, which would leave ``root``, or with
    a NUL or a lone surrogate, which no file name holds)."""
    if not isinstance(rel, str) or "\x00" in rel or non_utf8(rel):
        return None
    p = PurePosixPath(rel)
    if p.is_absolute() or ".." in p.parts or not p.parts:
        return None
    return root.joinpath(*p.parts)


def file_below(root: Path, rel: object, *, follow_last: bool = False) -> Path | None:
    """``path_below``'s path when a regular file is there now, reached from ``root``
    through real directories only: a link among its directories (which ``path_below``,
    reading text, cannot see), a FIFO, a device or nothing at all is None; so is a
    link at its end unless ``follow_last`` (kiln's own links to the sources, in
    ``.kiln/src``), and then it must lead to a regular file. A file to read
    (``O_NONBLOCK``) after this check, for a file planted before kiln runs; not a
    guard against a process racing it."""
    path = path_below(root, rel)
    if path is None:
        return None
    here = root
    try:
        for part in path.relative_to(root).parts[:-1]:
            here = here / part
            if not stat.S_ISDIR(os.lstat(here).st_mode):  # lstat: a link is no directory
                return None
        found = os.stat(path) if follow_last else os.lstat(path)
        return path if stat.S_ISREG(found.st_mode) else None
    except (OSError, ValueError):
        return None
