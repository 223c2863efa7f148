"""The files a user names for kiln to write (``kiln report -o``, ``kiln build
--events`` and ``--profile``): a regular file or a new one, never one of kiln's own
nor one the build reads.

``check_destinations`` is the one check they all go through, together, before
anything is written (an option that writes a file must be checked here). It looks
at each file where its writer will reach it: from the directory kiln started in,
through the links and ``..`` of the directories above it. It refuses, with a
UsageError (exit 2) naming the file and asking for another:

- anything but a regular file at the name itself: a symbolic link (wherever it
  points), a FIFO, a socket, a device (``/dev/null`` stays a device), a directory;
- a file in a directory that is kiln's: the ``.kiln/`` of a kiln output directory
  (its marker, lock, state, logs and kept events), or anywhere in a kiln cache
  (one marked as kiln's, or the cache the command would use, whatever it holds);
- the ``manifest.json`` of a kiln output directory or of the command's own;
- a file of the build in an output directory: one the build module declares
  (``build``), or an output the directory's state records as built;
- an input of the build: the build module's file, a source file it declares, any
  file in a source directory it declares (compared by resolved path, and by
  identity, so that a hard link to one is refused too), and the ``pyproject.toml``
  whose ``[tool.kiln]`` gave the command its settings;
- the file another of the command's options names (``--events X --profile X``).

Anywhere else in an output directory stays allowed: ``kiln report`` writes its
page there by default, and records it as kiln's.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from kiln.base.errors import StateError, UsageError
from kiln.output_dir.layout import MANIFEST
from kiln.output_dir.ownership import KILN_DIR, output_dir_state
from kiln.output_dir.writing import atomic_output, file_kind

_OWN = "kiln never writes over its own files"
_INPUT = "kiln never writes over what the build reads"


def check_destinations(
    named: Sequence[tuple[str, Path]],
    output_dir: Path,
    *,
    cache_dir: Path | None = None,
    declared: Callable[[], Iterable[str]] = tuple,
    inputs: Callable[[], Iterable[str | Path]] = tuple,
    warn: Callable[[str], None] = lambda text: None,
) -> list[Path]:
    """UsageError when one of the files ``named`` (each ``(option, path)``) may not be
    written (the module's docstring says which), or two name the same file; else the
    paths their writers will write, in order. The command works on ``output_dir``,
    whose files of the build ``declared()`` names (relative to it), would use the
    cache ``cache_dir``, and reads the files and directories ``inputs()``. Reads only."""
    written: list[tuple[str, Path, Path]] = []
    for option, path in named:
        real = check_destination(
            option,
            path,
            output_dir,
            cache_dir=cache_dir,
            declared=declared,
            inputs=inputs,
            warn=warn,
        )
        for other_option, other_path, other in written:
            if _same_file(real, other):
                raise UsageError(
                    f"{option} {_shown(path, real)} is the file {other_option} {other_path} "
                    "names too: each option writes a file of its own; choose another path"
                )
        written.append((option, path, real))
    return [real for _, _, real in written]


def check_destination(
    option: str,
    path: Path,
    output_dir: Path,
    *,
    cache_dir: Path | None = None,
    declared: Callable[[], Iterable[str]] = tuple,
    inputs: Callable[[], Iterable[str | Path]] = tuple,
    warn: Callable[[str], None] = lambda text: None,
) -> Path:
    """``check_destinations`` of one file ``path``, given as ``option``."""
    real = written_path(path)
    what, why = _not_a_file(real), "kiln writes only a regular file or a new one"
    if what is None:
        what, why = (
            _kiln_file(real, Path(os.path.realpath(output_dir)), cache_dir, declared, warn),
            _OWN,
        )
    if what is None:
        what, why = _build_input(real, inputs), _INPUT
    if what is not None:
        raise UsageError(f"{option} {_shown(path, real)} is {what}: {why}; choose another path")
    return real


def _shown(path: Path, real: Path) -> str:
    return str(path) if str(real) == os.path.abspath(path) else f"{path} (that is {real})"


def written_path(path: Path) -> Path:
    """``path`` as the kernel reaches it when it is written: relative to the working
    directory, its directory's links and ``..`` resolved, its own name kept."""
    head, name = os.path.split(os.path.join(os.getcwd(), path))
    if name in ("", ".", ".."):
        return Path(os.path.realpath(os.path.join(head, name)))
    return Path(os.path.realpath(head), name)


def _not_a_file(real: Path) -> str | None:
    """What is at ``real`` when it is there and is not a regular file (a link at the
    name is never followed), else None."""
    try:
        mode = os.lstat(real).st_mode
    except FileNotFoundError:
        return None
    except OSError as e:
        return f"a path kiln cannot look at ({e.strerror})"
    if stat.S_ISREG(mode):
        return None
    if stat.S_ISLNK(mode):
        try:
            return f"a symbolic link to {os.readlink(real)}"
        except OSError:
            return "a symbolic link"
    return file_kind(mode)


def _build_input(real: Path, inputs: Callable[[], Iterable[str | Path]]) -> str | None:
    """Which input of the build ``real`` is or lies in, else None. A regular file
    there is compared by identity too: writing in place through a hard link to the
    build module would overwrite the module."""
    try:
        st: os.stat_result | None = os.stat(real)
    except OSError:
        st = None
    for given in inputs():
        source = Path(os.path.realpath(given))
        if real == source:
            return f"an input of the build ({given})"
        if source in real.parents:
            return f"in the source directory {given}, an input of the build"
        if st is not None and st.st_nlink > 1 and _same_inode(st, source):
            return f"a hard link to the build's input {given}"
    return None


def _same_inode(st: os.stat_result, path: Path) -> bool:
    try:
        other = os.stat(path)
    except OSError:
        return False
    return (st.st_dev, st.st_ino) == (other.st_dev, other.st_ino)


def _same_file(a: Path, b: Path) -> bool:
    """Whether the written paths ``a`` and ``b`` reach one file."""
    if a == b:
        return True
    try:
        return _same_inode(os.stat(a), b)
    except OSError:
        return False


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
    if real == output_dir:
        return "the output directory"
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
    from kiln.cache.claim import cache_dir_state

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


def write_page(option: str, target: Path, page: str) -> None:
    """Write the HTML ``page`` (``kiln report -o``, ``kiln compare --html``) at
    ``target``, a destination ``check_destinations`` passed, whole or not at all. A
    lone surrogate from a manifest's path is written escaped, not refused."""
    if not target.parent.is_dir():
        raise UsageError(f"{option} {target}: no directory {target.parent} to write it in")
    try:
        with atomic_output(target) as tmp:
            tmp.write_text(page, encoding="utf-8", errors="backslashreplace")
    except OSError as e:
        raise UsageError(f"{option} {target}: cannot write it: {e.strerror}") from e
