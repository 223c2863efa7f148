"""The cache directory: whose it is, and every open, write, rename, delete and scan
in it.

Layout, format 1 (``kiln.cache.local`` says what the files hold)::

    .kiln/format                     ``kiln-cache/1``: the directory is kiln's cache
    v1/ac/<n[:2]>/<n>                entries, ``n`` an entry name (``entry.key_name``)
    v1/cas/<d[:2]>/<d>               blobs, ``d`` the SHA-256 of their bytes
    v1/tmp/<w|b>-<pid>-<hex>-<n>     files being written
    v1/index.db                      entries and accounting (``kiln.cache.index``),
                                     with SQLite's -wal and -shm beside it
    v1/builds.log                    one JSON line per build

The cache is shared by every project of a user, often by a team, so ``CacheDir``
holds the trust model of the output directory (``kiln.output_dir``) for it, by
construction: nothing else in kiln touches the cache directory by path.

- **Ownership.** kiln uses a cache directory only when it is kiln's
  (``kiln.cache.claim``): the ``OutputTree`` below claims it, marking it,
  before the first directory is made; any other non-empty directory is refused.
- **Confinement.** Directories below the root are made and checked one component
  at a time (``OutputTree``: ``lstat`` before ``mkdir``); files are opened with
  ``O_NOFOLLOW | O_NONBLOCK`` and an ``fstat`` check (``open_regular``,
  ``open_own_file``); temporaries are created with ``O_EXCL``; a rename replaces a
  link at its target instead of following it. A link, FIFO, socket or device where
  kiln expects a directory or a file is a skipped entry, reported once: never
  followed, never opened, never a hang.
- **Deletion.** Only regular files with kiln's names in kiln's places are removed
  (an entry or blob in the directory named by its first two characters, a
  temporary in ``tmp/``), each name matched whole (``is_digest``,
  ``is_entry_name``, ``_TMP_NAME``), never by a prefix; of directories, only the
  layout's own, empty (``is_shard``). Anything else found there is reported and
  left.
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import os
import re
import stat
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from kiln.base.errors import ConfinementError, NotRegularFile, StateError
from kiln.cache.claim import FORMAT_DIR, cache_dir_state, claim_cache_dir
from kiln.cache.entry import is_digest, is_entry_name
from kiln.cache.index import INDEX, CacheIndex
from kiln.output_dir.ownership import open_own_file, open_regular
from kiln.output_dir.tree import OutputTree
from kiln.output_dir.writing import file_kind, link_text

__all__ = ["AREAS", "FORMAT_DIR", "CacheDir", "cache_dir_state", "claim_cache_dir"]

AREAS = ("ac", "cas")
LOG = "builds.log"
_TMP_NAME = re.compile(r"[wb]-\d+-[0-9a-f]{8}-\d+")
_SHARD = re.compile(r"[0-9a-f]{2}")
_NEW_TMP = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC

_T = TypeVar("_T")


class CacheDir:
    """One cache directory, and the only way kiln touches it.

    Invariants: kiln writes below ``root`` only after ``claim_cache_dir`` (the
    ``OutputTree`` claims it before it makes the first directory) and only into
    directories seen to be real ones all the way down; a file is read, written or
    removed only if it is a regular file, reached without following a link; a path
    handed out names a place of the layout. Safe to use from several threads.
    """

    def __init__(self, root: Path, warn: Callable[[str], None] | None = None):
        self.root = Path(os.path.normpath(Path(root).absolute()))
        self.base = self.root / FORMAT_DIR
        self._base = str(self.base)
        self._warn = warn or (lambda text: None)
        self._lock = threading.Lock()
        self._reported: set[str] = set()
        self._tree = self._new_tree()
        # Temporary names: this process's random tag and a counter (thread-safe).
        self._tag = f"{os.getpid()}-{os.urandom(4).hex()}"
        self._serial = itertools.count()

    def _new_tree(self) -> OutputTree:
        return OutputTree(self.root, self._warn, claim=claim_cache_dir, name="the cache")

    # -- places of the layout ------------------------------------------------

    def entry_file(self, name: str) -> str:
        if not is_entry_name(name):
            raise ValueError(f"not an entry name: {name!r}")
        return f"{self._base}/ac/{name[:2]}/{name}"

    def blob_file(self, digest: str) -> str:
        if not is_digest(digest):
            raise ValueError(f"not a blob name: {digest!r}")
        return f"{self._base}/cas/{digest[:2]}/{digest}"

    @property
    def log_file(self) -> str:
        return f"{self._base}/{LOG}"

    def index(self, spill: Callable[[str, bytes], None]) -> CacheIndex:
        """The cache's index (``kiln.cache.index``), opened when first used; its
        directory is checked before it is read and made (claiming the cache) before
        it is written. ``spill`` keeps the entries it no longer takes."""
        return CacheIndex(f"{self._base}/{INDEX}", self.skip, self._index_dir, spill)

    def index_dir_ok(self) -> bool:
        """Whether the index's directory is a real one (else reported)."""
        return self._index_dir(create=False)

    def _index_dir(self, create: bool) -> bool:
        """Whether ``v1/`` is a real directory (made when ``create``); what is in the
        way is reported."""
        if not create:
            return self._dir_ok(self._base)
        try:
            self._retrying(lambda: self._made_dir(self._base))
        except ConfinementError as e:
            self.skip(self._base, str(e))
            return False
        return True

    # -- what is skipped -----------------------------------------------------

    def skip(self, path: str, why: str) -> None:
        """Report, once per path, something kiln found where it keeps its files and
        left alone."""
        with self._lock:
            if path in self._reported:
                return
            self._reported.add(path)
        self._warn(f"warning: skipped {why} in the cache; kiln leaves it as it is")

    def _kind_of(self, path: str) -> str | None:
        """What ``path`` is when it is there and not a regular file, else None."""
        try:
            mode = os.lstat(path).st_mode
        except OSError:
            return None
        if stat.S_ISREG(mode):
            return None
        return link_text(path) if stat.S_ISLNK(mode) else f"{path} ({file_kind(mode)})"

    def _dirs_ok(self, path: str) -> bool:
        """Whether the directories above ``path`` are real ones (else reported)."""
        return self._dir_ok(os.path.dirname(path))

    def _dir_ok(self, directory: str) -> bool:
        """Whether ``directory`` and those above it are real ones, or missing (else
        reported)."""
        problem = self._tree.dir_problem(directory)
        if problem is None:
            return True
        self.skip(directory, f"{directory}: {problem}")
        return False

    # -- reading -------------------------------------------------------------

    def open_file(self, path: str) -> int | None:
        """A read-only descriptor of the regular file ``path``; None when it is not
        there or is anything else (reported): never follows a link, never blocks."""
        if not _exists(path) or not self._dirs_ok(path):  # a miss costs one lstat
            return None
        try:
            return open_regular(path)
        except (FileNotFoundError, NotADirectoryError):
            return None
        except NotRegularFile:
            self.skip(path, self._kind_of(path) or path)
            return None

    def read(self, path: str, limit: int = -1, tail: bool = False) -> bytes | None:
        """The bytes of the regular file ``path`` (at most ``limit``; with ``tail``,
        its last ``limit`` bytes), or None."""
        fd = self.open_file(path)
        if fd is None:
            return None
        with os.fdopen(fd, "rb") as f:
            if limit >= 0:  # no buffer of ``limit`` bytes for a small file
                size = os.fstat(f.fileno()).st_size
                if tail:
                    f.seek(max(0, size - limit))
                limit = min(limit, size + 1)
            return f.read(limit)

    def is_regular(self, path: str) -> bool:
        """Whether ``path`` is a regular file; anything else there is reported (a
        store then replaces it by rename, never writing through it)."""
        try:
            mode = os.lstat(path).st_mode
        except (FileNotFoundError, NotADirectoryError):
            return False  # a miss costs one lstat
        if not self._dirs_ok(path):
            return False
        if not stat.S_ISREG(mode):
            self.skip(path, self._kind_of(path) or path)
        return stat.S_ISREG(mode)

    def touch(self, path: str) -> None:
        """Mark ``path`` used now, for eviction; a read-only cache is used as it is."""
        if not self._dirs_ok(path):
            return
        try:
            os.utime(path, follow_symlinks=False)
        except OSError as e:
            if e.errno not in (errno.EROFS, errno.EACCES, errno.EPERM, errno.ENOENT):
                raise

    # -- writing -------------------------------------------------------------

    def make_dirs(self, directory: str) -> None:
        """Make ``directory`` of the layout (claiming the cache first); ConfinementError
        if a link or another kind of file is in the way."""
        self._tree.make_dirs(directory)

    def _made_dir(self, directory: str) -> None:
        """``make_dirs``, then FileNotFoundError if ``directory`` is not there: one
        made before and removed since (``kiln cache clear`` while a build runs), for
        a user of it that is not kiln's own ``open`` (SQLite), under ``_retrying``."""
        self.make_dirs(directory)
        if not _is_dir(directory):
            raise FileNotFoundError(errno.ENOENT, "removed meanwhile", directory)

    def new_tmp(self, prefix: str) -> tuple[int, str]:
        """A new, empty file under ``tmp/``: its descriptor (open for writing) and
        name, unique among the processes and threads sharing the cache."""
        tmp = f"{self._base}/tmp"

        def make() -> tuple[int, str]:
            self.make_dirs(tmp)
            while True:
                name = f"{tmp}/{prefix}{self._tag}-{next(self._serial)}"
                try:
                    return os.open(name, _NEW_TMP, 0o600), name
                except FileExistsError:  # left by a process of the same tag: the next name
                    continue

        try:
            return self._retrying(make)
        except ConfinementError as e:  # nowhere to write: the cache cannot be filled
            self.skip(tmp, str(e))
            raise OSError(errno.ENOTDIR, f"{tmp} is not a directory kiln made") from None

    def commit(self, tmp: str, target: str) -> None:
        """Give the temporary ``tmp`` (its mode set through its descriptor) its place
        ``target`` (a rename, which replaces a link or FIFO there, never following
        it); ConfinementError when a link or another kind of file is in the way of
        its directories, or a directory at it."""

        def place() -> None:
            self.make_dirs(os.path.dirname(target))
            try:
                os.replace(tmp, target)
            except IsADirectoryError:
                raise ConfinementError(
                    f"{target} is a directory, where kiln keeps a file"
                ) from None

        self._retrying(place)

    def _retrying(self, act: Callable[[], _T]) -> _T:
        """``act()``, once more on a fresh check of the directories if one vanished
        meanwhile (``kiln cache clear`` while a build runs)."""
        try:
            return act()
        except FileNotFoundError:
            self._tree = self._new_tree()
            return act()

    def discard(self, path: str) -> bool:
        """Remove kiln's temporary, entry or blob ``path`` if it is a regular file;
        whether it did. Anything else there stays (``files`` reports it)."""
        if not self._dirs_ok(path) or self._kind_of(path) is not None:
            return False
        try:
            os.unlink(path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        return True

    def append_log(self, line: str) -> int:
        """Append ``line`` to ``builds.log``; its size after. A link, FIFO or other
        file there is reported and left (-1)."""
        path = self.log_file

        def open_log() -> int:
            self.make_dirs(self._base)
            return open_own_file(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

        try:
            fd = self._retrying(open_log)
        except ConfinementError as e:
            self.skip(self._base, str(e))
            return -1
        except StateError:
            self.skip(path, self._kind_of(path) or path)
            return -1
        with os.fdopen(fd, "a", encoding="utf-8") as f:
            f.write(line)
            f.flush()
            return os.fstat(f.fileno()).st_size

    # -- scanning ------------------------------------------------------------

    def files(self) -> Iterator[tuple[str, str, os.stat_result]]:
        """(area, path, stat) of every entry and blob: regular files with kiln's names
        in kiln's places. Anything else there is reported (``skip``) and left out."""
        for area in AREAS:
            top = f"{self._base}/{area}"
            if not self._dir_ok(top):
                continue
            for sub in _listing(top):
                if not sub.is_dir(follow_symlinks=False):
                    self.skip(sub.path, self._kind_of(sub.path) or f"{sub.path} (not kiln's)")
                    continue
                for e in _listing(sub.path):
                    st = _lstat(e)
                    if st is None:
                        continue
                    ours = is_entry_name(e.name) if area == "ac" else is_digest(e.name)
                    if not ours or e.name[:2] != sub.name:
                        self.skip(e.path, f"{e.path} (a name kiln does not give)")
                    elif not stat.S_ISREG(st.st_mode):
                        self.skip(e.path, self._kind_of(e.path) or e.path)
                    else:
                        yield area, e.path, st

    def temporaries(self) -> Iterator[tuple[str, os.stat_result]]:
        """(path, stat) of kiln's temporaries under ``tmp/``; anything else there is
        reported and left out."""
        top = f"{self._base}/tmp"
        if not self._dir_ok(top):
            return
        for e in _listing(top):
            st = _lstat(e)
            if st is None:
                continue
            if _TMP_NAME.fullmatch(e.name) and stat.S_ISREG(st.st_mode):
                yield e.path, st
            else:
                self.skip(e.path, self._kind_of(e.path) or f"{e.path} (not kiln's)")

    def remove_empty_dirs(self) -> None:
        """Remove the empty directories of the layout (after ``clear``): shards, the
        areas, ``tmp/``, the format's directory; an empty directory of another name
        is not kiln's and stays."""
        for area in AREAS:
            top = f"{self._base}/{area}"
            if self._tree.dir_problem(top) is not None:
                continue
            for sub in _listing(top):
                if _is_shard(area, sub.name) and sub.is_dir(follow_symlinks=False):
                    _rmdir_quietly(sub.path)
            _rmdir_quietly(top)
        _rmdir_quietly(f"{self._base}/tmp")
        if self._tree.dir_problem(self._base) is None:
            _rmdir_quietly(self._base)
        self._tree = self._new_tree()


def _is_shard(area: str, name: str) -> bool:
    """Whether ``name`` is one of ``area``'s shards: the first two characters of the
    names kept there (all of a one-character entry name)."""
    if area == "cas":
        return _SHARD.fullmatch(name) is not None
    return len(name) <= 2 and is_entry_name(name)


def _is_dir(path: str) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _exists(path: str) -> bool:
    try:
        os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return False
    return True


def _listing(directory: str) -> list[os.DirEntry[str]]:
    try:
        with os.scandir(directory) as entries:
            return list(entries)
    except (FileNotFoundError, NotADirectoryError):
        return []


def _lstat(entry: os.DirEntry[str]) -> os.stat_result | None:
    try:
        return entry.stat(follow_symlinks=False)
    except FileNotFoundError:
        return None


def _rmdir_quietly(path: str) -> None:
    with contextlib.suppress(OSError):
        os.rmdir(path)
