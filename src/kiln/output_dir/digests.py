"""SHA-256 of files and streams: the one place kiln reads bytes to hash them,
a chunk at a time (a file of any size costs ``CHUNK`` bytes of memory)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from pathlib import Path

from kiln.output_dir.ownership import open_regular

CHUNK = 1 << 20


def hash_stream(
    read: Callable[[int], bytes], write: Callable[[bytes], object] | None = None
) -> str:
    """The SHA-256 of what ``read`` yields until it returns ``b""``, each chunk also
    handed to ``write`` when given (a copy that hashes what it copies)."""
    h = hashlib.sha256()
    while chunk := read(CHUNK):
        h.update(chunk)
        if write is not None:
            write(chunk)
    return h.hexdigest()


def hash_fd(fd: int) -> str:
    """The SHA-256 of the file open on ``fd``, read from its start (``pread``: the
    descriptor's offset is left where it is)."""
    h = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, CHUNK, offset):
        h.update(chunk)
        offset += len(chunk)
    return h.hexdigest()


def hash_small(fd: int, size: int, keep: int) -> tuple[str, bytes | None]:
    """The SHA-256 of the file open on ``fd`` (``size`` bytes by its ``fstat``), and
    its bytes when it holds at most ``keep`` (else None): a small file is read
    once, in one call."""
    if size <= keep:
        data = os.pread(fd, keep + 1, 0)
        if len(data) <= keep:
            return hashlib.sha256(data).hexdigest(), data
    return hash_fd(fd), None


def hash_output(path: str, keep: int) -> tuple[os.stat_result, str, bytes | None]:
    """The ``fstat``, SHA-256 and, when it holds at most ``keep`` bytes, the bytes of
    the regular file ``path``: opened once, never through a link at its name
    (NotRegularFile for anything else)."""
    fd = open_regular(path)
    try:
        st = os.fstat(fd)
        digest, data = hash_small(fd, st.st_size, keep)
    finally:
        os.close(fd)
    return st, digest, data


def hash_file(path: Path | str, follow: bool = True) -> str:
    """SHA-256 of a regular file's content (NotRegularFile for anything else; without
    ``follow``, a final symlink is not followed)."""
    with os.fdopen(open_regular(path, follow=follow), "rb") as f:
        return hash_stream(f.read)
