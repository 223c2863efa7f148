"""The digest of a directory an action reads: its tree, as the key sees it.

A directory input (``source_file("data/")``, or an absolute path iree.build style)
is keyed by what lies below it, never by its own times: the SHA-256 over each
entry in name order, its path relative to the directory, its kind, whether it is
executable, and for a regular file the digest of its content (through the build
state's stat cache, so a no-op build reads no content), for a symbolic link its
target text. A link is never followed, in or out of the tree; a FIFO, socket or
device counts by its kind alone and is never opened. So adding, removing,
renaming, editing or ``chmod +x``-ing anything below the directory changes the
digest, and touching nothing does not.

A link that leads out of the tree (or nowhere inside it) names something the
digest does not cover: ``tree_digest`` says which, and the action reading the
directory then has no key (it runs on every build, never cached). An entry that
cannot be read (no permission, a path longer than the system allows) is a
``BuildDefinitionError`` naming it. The walk keeps its own stack, so a tree may be
as deep as the system's path limit allows.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Callable, Iterator

from kiln.base.errors import BuildDefinitionError
from kiln.output_dir.writing import file_kind

_FORMAT = b"kiln-tree/1\0"


def tree_digest(root: str, file_digest: Callable[[str], str | None]) -> tuple[str, str | None]:
    """The digest of the directory ``root``, and the first link below it that leads
    out of it (relative to it), or None; ``file_digest(path)`` gives a regular
    file's content digest (None when it vanished meanwhile)."""
    h = hashlib.sha256(_FORMAT)
    inside = os.path.realpath(root) + os.sep
    escape = None
    try:
        for child, entry in _entries(root, file_digest):
            h.update(f"{child}\0{entry}\0".encode(errors="surrogateescape"))
            link = entry.startswith("l ")
            if link and escape is None and not _leads_inside(os.path.join(root, child), inside):
                escape = child
    except OSError as e:
        raise _unreadable(root, e) from None
    return h.hexdigest(), escape


def _unreadable(root: str, e: OSError) -> BuildDefinitionError:
    """The error for an entry below ``root`` that cannot be read (no permission, a
    path past the system's limit in a very deep tree), naming it."""
    where = os.fsdecode(e.filename) if e.filename is not None else root
    if len(where) > 160:
        where = f"{where[:100]}...{where[-40:]} ({len(os.fsencode(where))} bytes)"
    return BuildDefinitionError(
        f"cannot read {where} in the directory input {root}: {e.strerror}; kiln keys "
        "a directory by everything below it, so all of it must be readable by paths "
        "the system accepts: fix or remove that entry"
    )


def _leads_inside(link: str, inside: str) -> bool:
    return os.path.realpath(link).startswith(inside)


def _entries(root: str, file_digest: Callable[[str], str | None]) -> Iterator[tuple[str, str]]:
    """Each entry below ``root`` as (relative path, what it is), depth first in
    name order. Iterative: a tree thousands of directories deep costs a list of
    that many directories' names, not the interpreter's stack."""
    # Invariant: ``pending[i]`` holds the names of the i-th directory on the way down
    # from ``root`` still to visit, reversed (the next one last), with its path.
    pending = [("", _names(root, ""))]
    while pending:
        here, names = pending[-1]
        if not names:
            pending.pop()
            continue
        name = names.pop()
        child = f"{here}/{name}" if here else name
        path = os.path.join(root, child)
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            continue
        if stat.S_ISDIR(mode):
            yield child, "d"
            pending.append((child, _names(root, child)))
        elif stat.S_ISREG(mode):
            executable = "x" if mode & 0o111 else "-"
            yield child, f"f{executable} {file_digest(path) or 'missing'}"
        elif stat.S_ISLNK(mode):
            yield child, f"l {os.readlink(path)}"
        else:
            yield child, file_kind(mode)


def _names(root: str, rel: str) -> list[str]:
    """The names in the directory ``root/rel``, in reverse name order."""
    with os.scandir(os.path.join(root, rel) if rel else root) as found:
        return sorted((e.name for e in found), reverse=True)
