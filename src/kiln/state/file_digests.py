"""The digest cache: the SHA-256 of each file kiln hashed, valid while the file's
stat (size, mtime, inode, ctime) is unchanged, so a no-op build reads no file
contents (the ``files`` table)."""

from __future__ import annotations

import os
import stat
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from kiln.base.errors import NotRegularFile
from kiln.output_dir.digests import hash_file
from kiln.output_dir.writing import file_kind
from kiln.state.schema import loaded_path, stored_path

if TYPE_CHECKING:
    from kiln.graph import BuildFile
    from kiln.state.records import ActionRecord, FailureRecord

StatKey = tuple[int, int, int, int]
# What an action wrote: each output file, its stat key and its digest.
Produced = dict["BuildFile", tuple[StatKey, str]]


def stat_key(st: os.stat_result) -> StatKey:
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


# The rows of the digest cache whose every field has its type (a mistyped row is
# not trusted: SQLite leaves it out). A path is text, or the file system's bytes
# where they are not UTF-8 (``stored_path``).
TYPED_ROWS = (
    "SELECT * FROM files WHERE typeof(path) IN ('text', 'blob') AND typeof(sha256) = 'text'"
    + "".join(f" AND typeof({c}) = 'integer'" for c in ("size", "mtime_ns", "ino", "ctime_ns"))
)
UPSERT = "INSERT OR REPLACE INTO files VALUES (?,?,?,?,?,?)"


class FileDigests:
    """Digests by path, read from the ``files`` table once; new ones wait in
    ``pending`` for the next transaction. Safe to call from several threads.

    Invariant: a digest is returned only for a regular file whose stat equals the
    one it was computed for."""

    def __init__(self, rows: list[tuple[Any, ...]]):
        self._lock = threading.Lock()
        self._known: dict[str, tuple[StatKey, str]] = {
            loaded_path(path): ((size, mtime, ino, ctime), digest)
            for path, size, mtime, ino, ctime, digest in rows
        }
        self._pending: dict[str, tuple[StatKey, str]] = {}

    def forget_all(self) -> None:
        """The database was replaced: nothing it said holds."""
        with self._lock:
            self._known.clear()
            self._pending.clear()

    def digest(self, path: Path | str, output: bool = False) -> str | None:
        """SHA-256 of the file at ``path`` (cached by stat), or None if it is missing.
        An ``output`` is taken as it is, a link not followed; anything but a regular
        file is NotRegularFile."""
        spath = str(path)
        try:
            st = os.lstat(spath) if output else os.stat(spath)
        except FileNotFoundError:
            return None
        if not stat.S_ISREG(st.st_mode):
            raise NotRegularFile(f"{spath} is {file_kind(st.st_mode)}, not a regular file")
        known = self._lookup(spath, st)
        if known is not None:
            return known
        digest = hash_file(spath, follow=not output)  # an output: never through a link
        self.remember(spath, stat_key(st), digest)
        return digest

    def cached_digest(self, path: Path | str, output: bool = False) -> str | None:
        """The digest cached for ``path`` if the file is unchanged since (same stat;
        an ``output``'s own, a link not followed); None when it is missing, changed
        or not a regular file. Never reads the file (an up-to-date check asks it
        for every output of every action)."""
        spath = path if type(path) is str else str(path)
        try:
            st = os.lstat(spath) if output else os.stat(spath)
        except OSError:
            return None
        return self._lookup(spath, st)

    def _lookup(self, path: str, st: os.stat_result) -> str | None:
        known = self._known.get(path)
        if known is None or not stat.S_ISREG(st.st_mode):
            return None
        if known[0] != (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns):
            return None
        return known[1]

    def remember(self, path: str, skey: StatKey, digest: str) -> None:
        with self._lock:
            self._known[path] = (skey, digest)
            self._pending[path] = (skey, digest)

    def take_pending(self) -> list[tuple[Any, ...]]:
        """The rows to write for the digests remembered since the last call."""
        with self._lock:
            rows = [(stored_path(p), *s, d) for p, (s, d) in self._pending.items()]
            self._pending.clear()
            return rows


class DigestStore(Protocol):
    """What the up-to-date check (``kiln.engine.incremental``) reads: the records of the
    actions that last succeeded, the failures remembered, and the digests of
    files. ``StateStore`` is one; the judgement of unplanned actions
    (``kiln.engine.unrequested``) passes one that answers from the stat cache only."""

    def records(self) -> Mapping[str, ActionRecord]: ...

    def failures(self) -> Mapping[str, FailureRecord]: ...

    def digest(self, path: Path | str, output: bool = False) -> str | None:
        """The file's digest, hashing it if need be; None when it is missing."""
        ...

    def cached_digest(self, path: Path | str, output: bool = False) -> str | None:
        """The file's digest if known for its current stat, without reading it."""
        ...
