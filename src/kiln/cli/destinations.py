"""The files a user names for kiln to write (``kiln report -o``, ``kiln build
--events`` and ``--profile``): never one of kiln's own.

``check_destination`` is the one check each of them goes through, before anything
is written. It looks at the file where its writer will reach it: from the
directory kiln started in, through the links and ``..`` of the directories above
it (a link at the file's own name is never followed: the writers refuse it or
replace it). It refuses, with a UsageError naming the file and asking for another:

- a file in a directory that is kiln's: the ``.kiln/`` of a kiln output directory
  (its marker, lock, state, logs and kept events), or anywhere in a kiln cache
  (one marked as kiln's, or the cache the command would use, whatever it holds);
- the ``manifest.json`` of a kiln output directory or of the command's own;
- a file of the build in an output directory: one the build module declares
  (``build``), or an output the directory's state records as built.

Anywhere else in an output directory stays allowed: ``kiln report`` writes its
page there by default, and records it as kiln's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from pathlib import Path

from kiln.errors import StateError, UsageError
from kiln.layout import MANIFEST
from kiln.output_dir.ownership import KILN_DIR, output_dir_state


def check_destination(
    option: str,
    path: Path,
    output_dir: Path,
    *,
    cache_dir: Path | None = None,
    declared: Callable[[], Iterable[str]] = tuple,
    warn: Callable[[str], None] = lambda text: None,
) -> Path:
    """UsageError when ``path``, given as ``option``, is one of kiln's own files (the
    module's docstring says which); else the path its writer will write. The
    command works on ``output_dir``, whose files of the build ``declared()`` names
    (relative to it), and would use the cache ``cache_dir``. Reads only."""
    real = written_path(path)
    what = _kiln_file(real, Path(os.path.realpath(output_dir)), cache_dir, declared, warn)
    if what is not None:
        shown = str(path) if str(real) == os.path.abspath(path) else f"{path} (that is {real})"
        raise UsageError(
            f"{option} {shown} is {what}: kiln never writes over its own files; choose another path"
        )
    return real


def written_path(path: Path) -> Path:
    """``path`` as the kernel reaches it when it is written: relative to the working
    directory, its directory's links and ``..`` resolved, its own name kept."""
    head, name = os.path.split(os.path.join(os.getcwd(), path))
    if name in ("", ".", ".."):
        return Path(os.path.realpath(os.path.join(head, name)))
    return Path(os.path.realpath(head), name)


def _kiln_file(
    real: Path,
    output_dir: Path,
    cache_dir: Path | None,
    declared: Callable[[], Iterable[str]],
    warn: Callable[[str], None],
) -> str | None:
    """What of kiln's ``real`` is, or None when it is none of kiln's files."""
    if cache_dir is not None:
        cache = Path(os.path.realpath(cache_dir))
        if real == cache or cache in real.parents:
            return f"in kiln's cache {cache}"
    for root in real.parents:
        own = root == output_dir
        if not own and not os.path.lexists(root / KILN_DIR):
            continue
        kind = "output" if own else _kind(root)
        if kind == "cache":
            return f"in kiln's cache {root}"
        if kind is None:
            continue
        rel = real.relative_to(root)
        if rel.parts[0] == KILN_DIR:
            return f"in kiln's own directory {root / KILN_DIR}"
        if str(rel) == MANIFEST:
            return f"the manifest of the output directory {root}"
        files = _recorded_outputs(root, warn) | (set(declared()) if own else set())
        if rel.as_posix() in files:
            return f"the build's file {rel.as_posix()} in the output directory {root}"
    return None


def _kind(root: Path) -> str | None:
    """``output`` or ``cache`` when ``root`` is a kiln output directory or a kiln
    cache, else None."""
    from kiln.cache.ownership import cache_dir_state

    try:
        if output_dir_state(root) == "kiln":
            return "output"
    except (UsageError, StateError):
        pass
    try:
        if cache_dir_state(root) in ("kiln", "legacy"):
            return "cache"
    except (UsageError, OSError):
        pass
    return None


def _recorded_outputs(root: Path, warn: Callable[[str], None]) -> set[str]:
    """The outputs the state of the output directory ``root`` records as built."""
    if output_dir_state(root) != "kiln":
        return set()
    from kiln.state.snapshot import StateSnapshot

    state = StateSnapshot(root, warn=warn)
    try:
        return state.recorded_outputs()
    finally:
        state.close()
