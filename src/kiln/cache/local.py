"""The local cache: an action cache and a content-addressed store in one directory.

Layout, format 1 (everything under ``CACHE_DIR/v1``; a later format uses ``v2``)::

    v1/ac/<k[:2]>/<k>          action-cache entries (``kiln.cache.entry``), named by
                               ``entry.key_name(action key)``
    v1/cas/<d[:2]>/<d>         blobs, named by the SHA-256 ``d`` of their bytes
    v1/tmp/                    files being written (renamed into ac/ or cas/ when whole)
    v1/builds.log              one JSON object per build: time, hits, remote_hits,
                               misses, stored, corrupt

Several builds may share the directory at once: every file is written under
``tmp/`` and renamed into place, so a reader sees a whole file or none. A blob is
trusted only after its digest is checked while it is copied out (``copy_verified``);
a blob that fails the check is removed. Least-recently-used eviction reads each
file's mtime, which a hit refreshes. Nothing here reports or swallows errors: the
caller (``kiln.cache.build_cache``) decides what an ``OSError`` means.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import itertools
import json
import os
import shutil
import stat
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from kiln.cache.entry import key_name
from kiln.errors import NotRegularFile
from kiln.outputs import open_regular, read_regular

FORMAT_DIR = "v1"
_CHUNK = 1 << 20
_FICLONE = 0x40049409  # Linux ioctl: share the source's extents (btrfs, xfs)
_STALE_TMP_S = 3600.0
_LOG_KEEP = 100
_NEW_TMP = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


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


def _hash_file(f: IO[bytes]) -> str:
    h = hashlib.sha256()
    while chunk := f.read(_CHUNK):
        h.update(chunk)
    return h.hexdigest()


def copy_verified(src: str | Path, dst: str | Path) -> str:
    """Copy the regular file ``src`` over the file ``dst`` (a reflink where the file
    system has them, never a hard link) and return the SHA-256 of the bytes now in
    ``dst``. Neither path is followed if it is a symbolic link (NotRegularFile, OSError)."""
    in_fd = open_regular(src)
    try:
        out_fd = os.open(
            dst, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC, 0o666
        )
    except BaseException:
        os.close(in_fd)
        raise
    with os.fdopen(in_fd, "rb") as fin, os.fdopen(out_fd, "wb") as fout:
        if _reflink(fin, fout):
            with open(dst, "rb") as check:
                return _hash_file(check)
        h = hashlib.sha256()
        while chunk := fin.read(_CHUNK):
            h.update(chunk)
            fout.write(chunk)
        return h.hexdigest()


class LocalCache:
    """The cache directory ``root``.

    Invariant: a file under ``ac/`` or ``cas/`` was complete when it got its name;
    a blob's name is the digest of the bytes that were written under it.
    """

    def __init__(self, root: Path):
        self.root = Path(root)
        self.base = self.root / FORMAT_DIR
        self._tmp = self.base / "tmp"
        self._base_str = str(self.base)
        self._made: set[str] = set()
        # Temporary names: this process's random tag and a counter (thread-safe).
        self._tag = f"{os.getpid()}-{os.urandom(4).hex()}"
        self._serial = itertools.count()

    # -- paths ---------------------------------------------------------------

    def entry_path(self, key: str) -> Path:
        return Path(self._entry_str(key))

    def _entry_str(self, key: str) -> str:
        """``entry_path`` as a string: made per action, so without pathlib's cost."""
        name = key_name(key)
        return f"{self._base_str}/ac/{name[:2]}/{name}"

    def blob_path(self, digest: str) -> Path:
        return self.base / "cas" / digest[:2] / digest

    def _mkdir(self, path: Path | str) -> None:
        key = str(path)
        if key not in self._made:
            os.makedirs(key, exist_ok=True)
            self._made.add(key)

    # -- action cache --------------------------------------------------------

    def get_entry(self, key: str, touch: bool = True) -> bytes | None:
        """The entry for ``key``, marked used unless ``touch`` is False; None if absent."""
        path = self._entry_str(key)
        try:
            data = read_regular(path)
        except (FileNotFoundError, NotADirectoryError, NotRegularFile):
            return None
        if touch:
            _touch(path)
        return data

    def has_entry(self, key: str) -> bool:
        return self.entry_path(key).is_file()

    def put_entry(self, key: str, data: bytes) -> None:
        with self._writing(self._entry_str(key)) as f:
            f.write(data)

    # -- blobs ---------------------------------------------------------------

    def has_blob(self, digest: str) -> bool:
        return _is_regular(self.blob_path(digest))

    def touch_blob(self, digest: str) -> None:
        _touch(self.blob_path(digest))

    def remove_blob(self, digest: str) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.blob_path(digest).unlink()

    def put_file(self, src: str | Path, digest: str) -> bool:
        """Store the file ``src`` as blob ``digest``; False (nothing stored) when its
        bytes do not have that digest (it changed since it was hashed)."""
        target = self.blob_path(digest)
        if _is_regular(target):
            _touch(target)
            return True
        fd, tmp = self._new_tmp("b-")
        os.close(fd)
        stored = False
        try:
            if copy_verified(src, tmp) == digest:
                self._commit(Path(tmp), target)
                stored = True
        finally:
            if not stored:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(tmp)
        return stored

    def put_stream(self, digest: str, read: Callable[[int], bytes]) -> bool:
        """Store what ``read`` yields until it returns b'' as blob ``digest``; False
        (nothing stored) when those bytes have another digest."""
        h = hashlib.sha256()
        with self._writing(self.blob_path(digest), expect=lambda: h.hexdigest() == digest) as f:
            while chunk := read(_CHUNK):
                h.update(chunk)
                f.write(chunk)
        return h.hexdigest() == digest

    @contextlib.contextmanager
    def _writing(
        self, target: Path | str, expect: Callable[[], bool] = lambda: True, mode: int = 0o444
    ) -> Iterator[IO[bytes]]:
        """A new file under ``tmp/``, renamed onto ``target`` if the body succeeds
        and ``expect()`` holds, removed otherwise."""
        fd, name = self._new_tmp("w-")
        committed = False
        try:
            with os.fdopen(fd, "wb") as f:
                yield f
            if expect():
                os.chmod(name, mode)
                self._mkdir(os.path.dirname(target))
                os.replace(name, target)
                committed = True
        finally:
            if not committed:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name)

    def _new_tmp(self, prefix: str) -> tuple[int, str]:
        """A new, empty file under ``tmp/``: its descriptor (open for writing) and name,
        unique among the processes and threads sharing the cache."""
        self._mkdir(self._tmp)
        while True:
            name = f"{self._tmp}/{prefix}{self._tag}-{next(self._serial)}"
            try:
                return os.open(name, _NEW_TMP, 0o600), name
            except FileExistsError:  # left by a process of the same tag: the next name
                continue

    def _commit(self, tmp: Path, target: Path, mode: int = 0o444) -> None:
        os.chmod(tmp, mode)
        self._mkdir(target.parent)
        os.replace(tmp, target)

    # -- size, eviction ------------------------------------------------------

    def _files(self) -> Iterator[os.DirEntry[str]]:
        for area in ("ac", "cas"):
            with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                for sub in os.scandir(self.base / area):
                    if not sub.is_dir(follow_symlinks=False):
                        continue
                    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
                        yield from (
                            e for e in os.scandir(sub.path) if e.is_file(follow_symlinks=False)
                        )

    def usage(self) -> CacheUsage:
        entries = blobs = size = 0
        for e in self._files():
            with contextlib.suppress(FileNotFoundError):
                size += e.stat(follow_symlinks=False).st_size
                if os.path.basename(os.path.dirname(os.path.dirname(e.path))) == "ac":
                    entries += 1
                else:
                    blobs += 1
        return CacheUsage(entries, blobs, size)

    def gc(self, max_size: int) -> tuple[int, int]:
        """Remove least-recently-used files until the cache holds at most ``max_size``
        bytes, and temporaries that killed writers left; return (files, bytes) removed."""
        files: list[tuple[float, int, str]] = []
        for e in self._files():
            with contextlib.suppress(FileNotFoundError):
                st = e.stat(follow_symlinks=False)
                files.append((st.st_mtime, st.st_size, e.path))
        total = sum(size for _, size, _ in files)
        removed = freed = 0
        files.sort()
        for _, size, path in files:
            if total <= max_size:
                break
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
                removed, freed = removed + 1, freed + size
            total -= size
        self._sweep_tmp()
        return removed, freed

    def _sweep_tmp(self) -> None:
        cutoff = time.time() - _STALE_TMP_S
        with contextlib.suppress(FileNotFoundError, NotADirectoryError):
            for e in os.scandir(self._tmp):
                with contextlib.suppress(FileNotFoundError):
                    if e.stat(follow_symlinks=False).st_mtime < cutoff:
                        os.unlink(e.path)

    def clear(self) -> None:
        """Remove everything this format keeps (what other programs put beside it stays)."""
        if self.base.is_dir() and not self.base.is_symlink():
            shutil.rmtree(self.base)
        self._made.clear()

    # -- build statistics ----------------------------------------------------

    def log_build(self, stats: dict[str, Any]) -> None:
        """Append one build's counts to ``builds.log``, keeping the last ones."""
        path = self.base / "builds.log"
        self._mkdir(self.base)
        line = json.dumps({"time": time.strftime("%Y-%m-%dT%H:%M:%S"), **stats}) + "\n"
        with open(path, "a", encoding="utf-8") as f:
            f.write(line)
        if path.stat().st_size > 200 * _LOG_KEEP:
            lines = self.builds()
            with self._writing(path, mode=0o644) as f:
                f.write("".join(json.dumps(x) + "\n" for x in lines[-_LOG_KEEP:]).encode())

    def builds(self) -> list[dict[str, Any]]:
        try:
            text = (self.base / "builds.log").read_text(encoding="utf-8")
        except (FileNotFoundError, NotADirectoryError):
            return []
        out = []
        for line in text.splitlines():
            with contextlib.suppress(ValueError):
                item = json.loads(line)
                if isinstance(item, dict):
                    out.append(item)
        return out


def _is_regular(path: Path) -> bool:
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False


def _touch(path: Path | str) -> None:
    """Mark ``path`` used now, for eviction; a read-only cache is used as it is."""
    try:
        os.utime(path)
    except OSError as e:
        if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT):
            raise
