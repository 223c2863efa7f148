"""The local cache: an action cache and a content-addressed store in one directory.

Layout, format 1 (everything under ``CACHE_DIR/v1``; a later format uses ``v2``;
``kiln.cache.cache_dir`` owns the directory and is the only way in)::

    v1/index.db                action-cache entries (``kiln.cache.entry``), named by
                               ``entry.key_name(action key)``, and the accounting of
                               the cache's size (``kiln.cache.index``)
    v1/cas/<d[:2]>/<d>         blobs, named by the SHA-256 ``d`` of their bytes
    v1/ac/<k[:2]>/<k>          entries as files: an older kiln's, or this one's when
                               the index cannot be used; read when the index has none
    v1/tmp/                    files being written (renamed into ac/ or cas/ when whole)
    v1/builds.log              one JSON object per build: time, hits, remote_hits,
                               misses, stored, corrupt

Several builds may share the directory at once: the index is an SQLite database
(written a batch at a time), and every other file is written under ``tmp/`` and
renamed into place, so a reader sees a whole file or none. A blob is trusted only
after its digest is checked while it is copied out (``copy_blob``); a blob that
fails the check is removed. Least-recently-used eviction reads each file's mtime
(which a hit refreshes) and each entry's ``used`` time; it walks the whole cache
only when the index's accounting says it may have outgrown its bound (or has not
walked for a day). What is not kiln's, or not a regular file, is skipped and
reported by the ``CacheDir`` (never followed, never removed). Nothing here
swallows other errors: the caller (``kiln.cache.build_cache``) decides what an
``OSError`` means.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from kiln.base.errors import ConfinementError
from kiln.cache.cache_dir import FORMAT_DIR, CacheDir
from kiln.cache.entry import MAX_ENTRY_SIZE, key_name
from kiln.output_dir.digests import hash_fd, hash_stream
from kiln.output_dir.ownership import open_regular
from kiln.output_dir.writing import written

__all__ = ["FORMAT_DIR", "CacheUsage", "LocalCache", "copy_verified"]

_FICLONE = 0x40049409  # Linux ioctl: share the source's extents (btrfs, xfs)
_STALE_TMP_S = 3600.0
# ``clear`` leaves the temporaries written to this recently: a running build's.
_WRITING_TMP_S = 600.0
_LOG_KEEP = 100
_LOG_MAX = 1 << 20  # builds.log is read back at most this far


@dataclass(frozen=True)
class CacheUsage:
    entries: int
    blobs: int
    bytes: int


def _reflink(src: IO[bytes], dst: IO[bytes]) -> bool:
    try:
        fcntl.ioctl(dst.fileno(), _FICLONE, src.fileno())
    except OSError:
        return False
    return True


def _copy_hashing(fin: IO[bytes], fout: IO[bytes]) -> str:
    """Copy ``fin`` into ``fout`` (a reflink where the file system has them) and
    return the SHA-256 of what ``fout`` now holds (``fout`` open for reading too)."""
    if _reflink(fin, fout):
        return hash_fd(fout.fileno())
    return hash_stream(fin.read, fout.write)


def copy_verified(src: str | Path | int, dst: str | Path, mode: int = 0o644) -> str:
    """Copy the regular file ``src`` (a path, or a descriptor open for reading, which
    is closed) over the file ``dst`` (a reflink where the file system has them,
    never a hard link), give it ``mode`` through its descriptor, and return the
    SHA-256 of the bytes now in ``dst``. Neither path is followed if it is a
    symbolic link (NotRegularFile, OSError)."""
    in_fd = src if isinstance(src, int) else open_regular(src)
    try:
        out_fd = os.open(
            dst, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666
        )
    except BaseException:
        os.close(in_fd)
        raise
    with os.fdopen(in_fd, "rb") as fin, os.fdopen(out_fd, "wb") as fout:
        os.fchmod(out_fd, mode)
        return _copy_hashing(fin, fout)


class LocalCache:
    """The cache directory ``root``, as the action cache and CAS it holds.

    Invariant: a file under ``ac/`` or ``cas/`` was complete when it got its name;
    a blob's name is the digest of the bytes that were written under it. Every
    file operation goes through ``self.dir`` (``CacheDir``).
    """

    def __init__(self, root: Path, warn: Callable[[str], None] | None = None):
        self.dir = CacheDir(root, warn)
        self.root = self.dir.root
        self.base = self.dir.base
        self.index = self.dir.index(spill=self._put_entry_file)
        self._entry_files: bool | None = None  # whether ``ac/`` may hold entries

    def close(self) -> None:
        """Write what waits for the index and close it (reopened if used again)."""
        self.index.close()

    # -- paths ---------------------------------------------------------------

    def blob_path(self, digest: str) -> Path:
        return Path(self.dir.blob_file(digest))

    # -- action cache --------------------------------------------------------

    def get_entry(self, key: str, touch: bool = True) -> bytes | None:
        """The entry for ``key``, marked used unless ``touch`` is False; None if absent
        (or larger than an entry can be: not read further). The index first, then
        the entry files (an older kiln's)."""
        name = key_name(key)
        data = self.index.get(name, touch)
        if data is None and self._has_entry_files():
            path = self.dir.entry_file(name)
            data = self.dir.read(path, MAX_ENTRY_SIZE + 1)
            if data is not None and touch:
                self.dir.touch(path)
        if data is None or len(data) > MAX_ENTRY_SIZE:
            return None
        return data

    def _has_entry_files(self) -> bool:
        """Whether ``ac/`` is there (looked at once: a miss then costs nothing more)."""
        if self._entry_files is None:
            self._entry_files = os.path.lexists(f"{self.base}/ac")
        return self._entry_files

    def put_entry(self, key: str, data: bytes) -> None:
        """Store the entry ``data`` for ``key``: in the index with its next batch, or
        as a file when the index cannot be used."""
        name = key_name(key)
        if not self.index.put(name, data):
            self._put_entry_file(name, data)

    def _put_entry_file(self, name: str, data: bytes) -> None:
        """Keep an entry as a file of its own (the index cannot take it)."""
        self._entry_files = True
        with self._writing(self.dir.entry_file(name)) as f:
            f.write(data)

    # -- blobs ---------------------------------------------------------------

    def has_blob(self, digest: str) -> bool:
        return self.dir.is_regular(self.dir.blob_file(digest))

    def touch_blob(self, digest: str) -> None:
        self.dir.touch(self.dir.blob_file(digest))

    def remove_blob(self, digest: str) -> None:
        self.dir.discard(self.dir.blob_file(digest))

    def copy_blob(self, digest: str, dst: str | Path, mode: int) -> str | None:
        """Copy blob ``digest`` over the file ``dst``, of ``mode``; the SHA-256 of what
        was copied (which the caller checks), or None when there is no such blob."""
        fd = self.dir.open_file(self.dir.blob_file(digest))
        return None if fd is None else copy_verified(fd, dst, mode)

    def put_file(self, src: str | Path, digest: str) -> bool:
        """Store the file ``src`` as blob ``digest``; False (nothing stored) when its
        bytes do not have that digest (it changed since it was hashed) or kiln
        cannot put it in its place (reported)."""
        target = self.dir.blob_file(digest)
        if self.dir.is_regular(target):
            self.dir.touch(target)
            return True
        copied: list[str] = []
        with (
            os.fdopen(open_regular(src), "rb") as fin,
            self._writing(target, expect=lambda: copied == [digest]) as f,
        ):
            copied.append(_copy_hashing(fin, f))
            size = f.tell()
        if copied == [digest]:
            self.index.added(size)
        return copied == [digest]

    def put_stream(self, digest: str, read: Callable[[int], bytes]) -> bool:
        """Store what ``read`` yields until it returns b'' as blob ``digest``; False
        (nothing stored) when those bytes have another digest."""
        target = self.dir.blob_file(digest)
        found: list[str] = []
        with self._writing(target, expect=lambda: found == [digest]) as f:
            found.append(hash_stream(read, f.write))
            size = f.tell()
        if found == [digest]:
            self.index.added(size)
        return found == [digest]

    @contextlib.contextmanager
    def _writing(
        self, target: str, expect: Callable[[], bool] = lambda: True, mode: int = 0o444
    ) -> Iterator[IO[bytes]]:
        """A new file under ``tmp/``, renamed onto ``target`` if the body succeeds
        and ``expect()`` holds, removed otherwise. A link or another kind of file in
        the way of ``target``'s directories is reported and nothing is stored."""
        fd, name = self.dir.new_tmp("w-")
        os.fchmod(fd, mode)  # on the descriptor: the name under tmp/ is never followed

        def commit() -> bool:
            if not expect():
                return False
            try:
                self.dir.commit(name, target)
            except ConfinementError as e:
                self.dir.skip(target, str(e))
                return False
            return True

        with written(fd, "wb", commit, lambda: self.dir.discard(name)) as f:
            yield f

    # -- size, eviction ------------------------------------------------------

    def usage(self) -> CacheUsage:
        entries = blobs = size = 0
        for area, _, st in self.dir.files():
            size += st.st_size
            if area == "ac":
                entries += 1
            else:
                blobs += 1
        for _, length, _ in self.index.rows():
            entries, size = entries + 1, size + length
        return CacheUsage(entries, blobs, size)

    def evict(self, max_size: int) -> tuple[int, int]:
        """``gc`` when the cache may hold more than ``max_size`` bytes (by the index's
        accounting: no walk of the directory otherwise); (0, 0) when it may not."""
        if not self.index.must_walk(max_size):
            return 0, 0
        return self.gc(max_size)

    def gc(self, max_size: int) -> tuple[int, int]:
        """Remove least-recently-used entries and blobs until the cache holds at most
        ``max_size`` bytes, and temporaries that killed writers left; return (entries
        and blobs, bytes) removed."""
        found = [(st.st_mtime, st.st_size, path, False) for _, path, st in self.dir.files()]
        found += [(used, size, name, True) for used, size, name in self.index.rows()]
        found.sort()
        total = sum(size for _, size, _, _ in found)
        removed = freed = row_bytes = 0
        rows: list[str] = []
        for _, size, where, in_index in found:
            if total <= max_size:
                break
            if in_index:
                rows.append(where)
                row_bytes += size
            elif self.dir.discard(where):
                removed, freed = removed + 1, freed + size
            total -= size
        gone = self.index.remove(rows)
        removed, freed = removed + gone, freed + (row_bytes if gone else 0)
        cutoff = time.time() - _STALE_TMP_S
        for path, st in self.dir.temporaries():
            if st.st_mtime < cutoff:
                self.dir.discard(path)
        self.index.walked(total)
        return removed, freed

    def clear(self) -> int:
        """Remove every entry, blob and temporary (what is not kiln's stays, reported);
        the number of entries and files removed. Builds may be using the cache: the
        temporaries they are writing stay (``_WRITING_TMP_S``), and the index is
        emptied in place, so that what they store afterwards is kept."""
        doomed = [path for _, path, _ in self.dir.files()]
        cutoff = time.time() - _WRITING_TMP_S
        doomed += [path for path, st in self.dir.temporaries() if st.st_mtime < cutoff]
        doomed.append(self.dir.log_file)
        removed = sum(self.dir.discard(path) for path in doomed)
        if self.dir.index_dir_ok():
            removed += self.index.clear()
        self.dir.remove_empty_dirs()
        return removed

    # -- build statistics ----------------------------------------------------

    def log_build(self, stats: dict[str, Any]) -> None:
        """Append one build's counts to ``builds.log``, keeping the last ones."""
        line = json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **stats}) + "\n"
        if self.dir.append_log(line) > 200 * _LOG_KEEP:
            lines = self.builds()
            with self._writing(self.dir.log_file, mode=0o644) as f:
                f.write("".join(json.dumps(x) + "\n" for x in lines[-_LOG_KEEP:]).encode())

    def builds(self) -> list[dict[str, Any]]:
        # Only the log's end is read: the file is in a shared directory, of any size.
        data = self.dir.read(self.dir.log_file, _LOG_MAX, tail=True)
        if data is None:
            return []
        out = []
        for line in data.decode("utf-8", errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                item = json.loads(line)
                if isinstance(item, dict):
                    out.append(item)
        return out
