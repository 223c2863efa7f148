"""The import names of build modules loaded by path, and how keys spell them.

A build module loaded from a file gets a private name in ``sys.modules`` that is
unique to its path (two build modules with the same file name can be loaded in
one process). Keys must not depend on where the checkout lies, so wherever a
module's name goes into a key (action types, classes, functions) it is spelled
without that path tag: ``build_module_name`` makes the private name and
``stable_module_name`` turns it back into the file's own name. That file name
stays the build module's own: no import of it finds the file again
(``hide_build_module``; a worker process keeps its parent's, ``hide_build_modules``).
"""

from __future__ import annotations

import hashlib
import importlib.machinery
import os
import re
import sys
import types
from collections.abc import Iterable, Sequence
from pathlib import Path

_PREFIX = "kiln_build_"
_PRIVATE = re.compile(rf"{_PREFIX}[0-9a-f]{{12}}_")


def build_module_name(path: Path) -> str:
    """The name a build module loaded from the file ``path`` is imported as: text,
    whatever bytes the path holds (a byte that is not UTF-8 is spelled ``\\xff``,
    as keys spell it)."""
    tag = hashlib.sha256(os.fsencode(path)).hexdigest()[:12]
    stem = os.fsencode(path.stem).decode(errors="backslashreplace")
    return f"{_PREFIX}{tag}_{stem.replace('-', '_')}"


def is_build_module_name(name: str) -> bool:
    return _PRIVATE.match(name) is not None


def stable_module_name(name: str) -> str:
    """``name`` as keys spell it: a build module loaded by path by its file's stem,
    any other module as it is."""
    match = _PRIVATE.match(name)
    return name if match is None else name[match.end() :]


# -- a build module's file name stays its own -----------------------------------------


class _HiddenBuildModules:
    """A meta path finder, first on ``sys.meta_path``, for the build modules loaded
    by path in this process (their resolved files).

    Invariant: a top-level import of a build module's file name (``random`` for
    ``random.py``) never finds that file, nor anything else in its directory: the
    module is loaded under its private name, and its directory is first on
    ``sys.path`` (its siblings import, as when Python runs a script), so without
    this kiln's own ``import random``, the standard library's and every other
    library's would run the build module again as ``random``. The name imports
    from where it would without the build module, or not at all.
    """

    def __init__(self) -> None:
        self.files: frozenset[str] = frozenset()
        self._dirs: dict[str, frozenset[str]] = {}  # file name (stem) -> directories

    def set_files(self, files: frozenset[str]) -> None:
        dirs: dict[str, set[str]] = {}
        for file in files:
            stem = os.path.splitext(os.path.basename(file))[0]
            dirs.setdefault(stem, set()).add(os.path.dirname(file))
        self.files = files
        self._dirs = {stem: frozenset(found) for stem, found in dirs.items()}

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: types.ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        hidden = self._dirs.get(fullname) if path is None else None
        if not hidden:
            return None
        rest = [p for p in sys.path if os.path.realpath(p or os.curdir) not in hidden]
        for finder in sys.meta_path:
            if finder is self:
                continue
            if finder is importlib.machinery.PathFinder:
                spec = importlib.machinery.PathFinder.find_spec(fullname, rest, target)
            else:
                find = getattr(finder, "find_spec", None)
                spec = find(fullname, None, target) if find is not None else None
            if spec is not None and os.path.realpath(spec.origin or "") not in self.files:
                return spec
        raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)


def _finder() -> _HiddenBuildModules | None:
    return next((f for f in sys.meta_path if isinstance(f, _HiddenBuildModules)), None)


def hidden_build_modules() -> frozenset[str]:
    """The files of the build modules whose names this process keeps to themselves."""
    finder = _finder()
    return finder.files if finder is not None else frozenset()


def hide_build_modules(files: Iterable[str]) -> None:
    """Keep exactly the build modules ``files`` (resolved paths) from being imported
    under their file names (``_HiddenBuildModules``); a worker process is given its
    parent's."""
    wanted = frozenset(files)
    finder = _finder()
    if finder is None:
        if not wanted:
            return
        finder = _HiddenBuildModules()
        sys.meta_path.insert(0, finder)
    finder.set_files(wanted)
    if not wanted:
        sys.meta_path.remove(finder)


def hide_build_module(path: Path) -> None:
    """Add the build module ``path`` to those whose file names stay their own."""
    hide_build_modules(hidden_build_modules() | {os.path.realpath(path)})
