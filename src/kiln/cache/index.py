"""The cache's index, ``v1/index.db``: action-cache entries and the size accounting
of the cache, in one SQLite database that every build using the cache shares.

Why: an entry kept as a file of its own costs a file creation, a rename and a
directory entry per action run (hundreds of microseconds of kernel time each on a
busy ext4, more than a tiny action itself); the index takes a build's new entries
in one transaction per batch (``BATCH_S`` or ``BATCH_MAX`` entries, and whatever
is left when the build ends). Its accounting (the bytes stored since eviction last
walked the cache) spares a build that walk while the cache is well within its
bound.

Schema, format 1 (``PRAGMA application_id`` = ``APPLICATION_ID``, ``user_version``
= 1)::

    entries(name TEXT PRIMARY KEY, data BLOB, used INTEGER)
        name  an entry name (``entry.key_name`` of the action key)
        data  the entry's bytes (``kiln.cache.entry``: JSON, small outputs inline)
        used  when it was stored or last served (seconds since the epoch)
    meta(name TEXT PRIMARY KEY, value INTEGER)
        walked  when eviction last walked the whole cache
        total   the bytes the cache held then
        added   the bytes stored since (entries and blobs; an upper bound)

Trust: the database is one more file in the cache directory, which may be shared
and hostile. It is opened only when the database and its ``-wal``, ``-shm`` and
``-journal`` files are each absent or a regular file owned by this user (SQLite
would follow a link; another user's file could say anything). A database that is
not kiln's index (another application id, or tables but not kiln's) or that is
damaged is never read from: it is reported once and the cache goes on with entry
files (the older layout, ``v1/ac/``). Entries read from it are checked as any
entry is (``CacheEntry.decode``, inline outputs against their digest): a row that
fails is a miss. Concurrency: write-ahead logging and a busy timeout of
``BUSY_S``; an index that stays busy longer (another program holding it) is only
read for the rest of the build (its entries kept as files), so a build waits on it
once at most.
"""

from __future__ import annotations

import contextlib
import errno
import os
import sqlite3
import stat
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator

from kiln.cache.entry import MAX_ENTRY_SIZE
from kiln.output_dir.writing import file_kind, link_text
from kiln.state.database import use_wal

INDEX = "index.db"
APPLICATION_ID = 0x6B696C6E  # "kiln"
VERSION = 1
# New entries wait at most BATCH_S for their transaction, or until BATCH_MAX wait. Each
# transaction rewrites every page its entries touch, and entries land on random
# pages: 10,000 tiny actions (tmpfs) spent ~0.15 s less on the index at 1 s and
# 2,048 than at 0.25 s and 512. What a killed build loses is at most BATCH_S of
# entries: misses, never wrong results.
BATCH_S = 1.0
BATCH_MAX = 2048
BUSY_S = 2.0
WALK_EVERY_S = 24 * 3600.0  # eviction walks the whole cache at least this often
_SUFFIXES = ("", "-wal", "-shm", "-journal")
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS entries "
    "(name TEXT PRIMARY KEY, data BLOB NOT NULL, used INTEGER NOT NULL) WITHOUT ROWID;"
    "CREATE TABLE IF NOT EXISTS meta (name TEXT PRIMARY KEY, value INTEGER NOT NULL);"
    f"PRAGMA application_id = {APPLICATION_ID};"
    f"PRAGMA user_version = {VERSION};"
)
_TABLES = {"entries", "meta"}


class _IndexUnusable(Exception):
    """The index cannot be used (this build goes on with entry files); the text says
    why, for the user."""


def _full(error: sqlite3.Error) -> bool:
    return getattr(error, "sqlite_errorcode", None) == 13 or "full" in str(error)  # SQLITE_FULL


def _busy(error: sqlite3.Error) -> bool:
    return isinstance(error, sqlite3.OperationalError) and "locked" in str(error)


class CacheIndex:
    """The index at ``path`` (``v1/index.db`` of a cache directory whose directories
    the caller checked).

    Invariants: ``_db`` is None until the index is first needed, and stays None once
    ``broken`` is set (never reopened in this process); a connection is made only
    after ``_check_files`` and is kept only for a database that is kiln's index of
    this format. ``_pending`` and ``_touched`` are what waits for the next
    transaction; ``get`` sees them. Safe to use from several threads (one lock).
    """

    def __init__(
        self,
        path: str,
        report: Callable[[str, str], None],
        directory: Callable[[bool], bool] = lambda create: True,
        spill: Callable[[str, bytes], None] = lambda name, data: None,
    ):
        self.path = path
        self._report = report  # (place, why): said once per place by the caller
        self._directory = directory  # whether the index's directory is sound (made if asked)
        self._spill = spill  # where the entries go that the index no longer takes
        self.damaged = False  # unusable for what it holds (not for where or whose it is)
        self.readonly = False  # read, never written: a read-only file system, or busy
        self._lock = threading.RLock()
        self._db: sqlite3.Connection | None = None  # reads, under ``_lock``
        # Batches are written on a connection of their own, under ``_write_lock`` alone,
        # so that a read never waits for a batch being written. Lock order: the write
        # lock first, never taken while ``_lock`` is held.
        self._write_lock = threading.Lock()
        self._writer: sqlite3.Connection | None = None
        self.broken = False
        self._flushing: dict[str, bytes] = {}  # being written: still seen by ``get``
        self._pending: dict[str, bytes] = {}
        self._touched: set[str] = set()
        self._added = 0
        self._since = 0.0  # when the oldest pending write was made

    # -- opening ---------------------------------------------------------------

    def _connection(self, create: bool) -> sqlite3.Connection | None:
        """The open index; None when there is none yet and ``create`` is false, or it
        cannot be used (``broken``, reported)."""
        if self._db is not None or self.broken:
            return self._db
        if not create and not os.path.lexists(self.path):
            return None
        if not self._directory(create):
            self.broken = True  # reported by ``directory``
            return None
        try:
            self._db = self._open()
        except _IndexUnusable as e:
            self._give_up(str(e))
        return self._db

    def _give_up(self, why: str) -> None:
        self.broken = True
        self._spill_pending()
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            self._db = None
        self._report(self.path, f"the index {self.path}: {why} (kiln keeps entries as files)")

    def _check_files(self) -> None:
        """_IndexUnusable unless the database and its companions are absent or regular
        files of this user."""
        uid = os.geteuid()
        for suffix in _SUFFIXES:
            name = self.path + suffix
            try:
                st = os.lstat(name)
            except FileNotFoundError:
                continue
            if stat.S_ISLNK(st.st_mode):
                raise _IndexUnusable(link_text(name))
            if not stat.S_ISREG(st.st_mode):
                raise _IndexUnusable(f"{name} is {file_kind(st.st_mode)}, not a regular file")
            if st.st_uid != uid:
                raise _IndexUnusable(f"{name} belongs to user {st.st_uid}, not to this one")

    def _open(self) -> sqlite3.Connection:
        self._check_files()
        self.readonly = _read_only_fs(os.path.dirname(self.path))
        # On a read-only file system SQLite cannot make the -shm a WAL database needs:
        # the database is read as it is (what a killed build left in a -wal unseen).
        where = f"file:{urllib.parse.quote(self.path)}?mode=ro&immutable=1"
        try:
            db = sqlite3.connect(
                where if self.readonly else self.path,
                timeout=BUSY_S,
                check_same_thread=False,
                isolation_level=None,
                uri=self.readonly,
            )
        except sqlite3.Error as e:
            raise _IndexUnusable(f"cannot open it: {e}") from None
        try:
            self._check_files()  # what SQLite opened is what was checked, or gone
            _prepare(db, self.readonly)
        except (sqlite3.Error, _IndexUnusable) as e:
            with contextlib.suppress(sqlite3.Error):
                db.close()
            if isinstance(e, _IndexUnusable):
                raise
            if _full(e):
                raise OSError(errno.ENOSPC, f"cannot create the cache index: {e}") from None
            self.damaged = not isinstance(e, sqlite3.OperationalError)
            raise _IndexUnusable(f"unreadable: {e}") from None
        return db

    # -- entries -------------------------------------------------------------

    def get(self, name: str, touch: bool = True) -> bytes | None:
        """The entry stored under ``name`` (marked used unless ``touch`` is false), or
        None: no such entry, no index, or the index cannot be read now."""
        with self._lock:
            data = self._pending.get(name) or self._flushing.get(name)
            if data is not None:
                return data
            db = self._connection(create=False)
            if db is None:
                return None
            try:
                row = db.execute(
                    "SELECT data FROM entries WHERE name = ? AND length(data) <= ?",
                    (name, MAX_ENTRY_SIZE),
                ).fetchone()
            except sqlite3.Error as e:
                self._failed(e)
                return None
            if row is None or not isinstance(row[0], bytes):
                return None
            due = False
            if touch and not self.readonly:
                self._touched.add(name)
                due = self._due()
        if due:
            self.flush()
        return bytes(row[0])

    def put(self, name: str, data: bytes) -> bool:
        """Store ``data`` under ``name`` with the next batch (or spill it, should the
        index fail); False when the index takes no writes (the caller keeps the entry
        as a file)."""
        with self._lock:
            if self.broken or self.readonly:
                return False
            self._pending[name] = data
            self._added += len(data)
            due = self._due()
        if due:
            self.flush()  # written with its batch, or spilled if the index fails
        return True

    def added(self, size: int) -> None:
        """Count ``size`` bytes stored beside the index (a blob), for eviction."""
        with self._lock:
            self._added += size

    def _due(self) -> bool:
        """Whether what waits is due for its transaction."""
        now = time.monotonic()
        if len(self._pending) + len(self._touched) == 1:
            self._since = now
        return len(self._pending) >= BATCH_MAX or now - self._since >= BATCH_S

    def flush(self) -> None:
        """Write what waits, in one transaction; spilled (kept as files) if the index
        is busy for longer than ``BUSY_S`` or unusable (``_failed``). OSError when
        the disk is full."""
        with self._write_lock:
            with self._lock:
                if not self._pending and not self._touched and not self._added:
                    return
                pending, touched, added = self._pending, self._touched, self._added
                create = bool(pending) or bool(added)
                if self.readonly or self._connection(create) is None:  # nothing to write to
                    self._pending, self._touched, self._added = {}, set(), 0
                    return
                self._pending, self._touched, self._added = {}, set(), 0
                self._flushing = pending
            try:
                self._write(pending, touched, added)
            except sqlite3.Error as e:
                with self._lock:
                    self._pending = {**pending, **self._pending}
                    try:
                        self._failed(e)  # what waits is spilled (dropped on a full disk)
                    finally:
                        self._pending = {}
            finally:
                with self._lock:
                    self._flushing = {}

    def _write(self, pending: dict[str, bytes], touched: set[str], added: int) -> None:
        """One batch, in one transaction on the writer's connection (``_write_lock``)."""
        if self._writer is None:
            try:
                self._writer = self._open()
            except _IndexUnusable as e:
                raise sqlite3.DatabaseError(str(e)) from None
        db, now = self._writer, int(time.time())
        with _transaction(db):
            db.executemany(
                "INSERT OR REPLACE INTO entries VALUES (?, ?, ?)",
                [(n, d, now) for n, d in pending.items()],
            )
            db.executemany(
                "UPDATE entries SET used = ? WHERE name = ?",
                [(now, n) for n in touched - pending.keys()],
            )
            db.execute(
                "INSERT INTO meta VALUES ('added', ?) "
                "ON CONFLICT(name) DO UPDATE SET value = value + excluded.value",
                (added,),
            )

    def _spill_pending(self) -> None:
        """Hand what waits to ``spill`` (the index takes no more writes)."""
        pending, self._pending = self._pending, {}
        self._touched.clear()
        for name, data in pending.items():
            self._spill(name, data)

    def _failed(self, error: sqlite3.Error) -> None:
        """A full disk is an OSError; anything else (an index busy for longer than
        ``BUSY_S``, damage) leaves the index for the rest of this build, so that no
        build waits on it again."""
        if _busy(error):  # still read (a reader never waits on a writer)
            self.readonly = True
            self._spill_pending()
            self._report(
                self.path,
                f"the index {self.path}: busy for more than {BUSY_S:g} s (another program "
                "holds it; kiln keeps this build's entries as files)",
            )
            return
        if _full(error):
            raise OSError(errno.ENOSPC, f"cannot write the cache index {self.path}: {error}")
        self.damaged = not isinstance(error, sqlite3.OperationalError)
        self._give_up(f"unreadable: {error}")

    # -- eviction and accounting -----------------------------------------------

    def rows(self) -> Iterator[tuple[float, int, str]]:
        """(used, size, name) of every entry."""
        self.flush()
        with self._lock:
            db = self._connection(create=False)
            if db is None:
                return iter(())
            try:
                # Rows of another type are not kiln's: never counted, never a crash.
                found = db.execute(
                    "SELECT used, length(data), name FROM entries WHERE typeof(name) = 'text' "
                    "AND typeof(data) = 'blob' AND typeof(used) IN ('integer', 'real')"
                ).fetchall()
            except sqlite3.Error as e:
                self._failed(e)
                return iter(())
        return iter((float(u), int(s), str(n)) for u, s, n in found)

    def remove(self, names: list[str]) -> int:
        """Remove the entries ``names``; how many were there."""
        with self._lock:
            db = self._connection(create=False)
            if db is None or not names:
                return 0
            try:
                with _transaction(db):
                    before = db.total_changes
                    db.executemany("DELETE FROM entries WHERE name = ?", [(n,) for n in names])
                    return db.total_changes - before
            except sqlite3.Error as e:
                self._failed(e)
                return 0

    def must_walk(self, max_size: int) -> bool:
        """Whether eviction must walk the whole cache: it may have grown past
        ``max_size`` since the last walk, or that was long ago (or never)."""
        self.flush()
        with self._lock:
            meta = self._meta()
        if meta is None:
            return True
        walked, total, added = meta.get("walked"), meta.get("total", 0), meta.get("added", 0)
        if walked is None or time.time() - walked > WALK_EVERY_S:
            return True
        return total + added > max_size

    def _meta(self) -> dict[str, int] | None:
        db = self._connection(create=False)
        if db is None:
            return None
        try:
            return {str(n): int(v) for n, v in db.execute("SELECT name, value FROM meta")}
        except (sqlite3.Error, ValueError, TypeError) as e:
            if isinstance(e, sqlite3.Error):
                self._failed(e)
            return None

    def walked(self, total: int) -> None:
        """Eviction walked the cache and left ``total`` bytes in it."""
        with self._lock:
            db = self._connection(create=False)
            if db is None:
                return
            try:
                with _transaction(db):
                    db.executemany(
                        "INSERT OR REPLACE INTO meta VALUES (?, ?)",
                        [("walked", int(time.time())), ("total", total), ("added", 0)],
                    )
            except sqlite3.Error as e:
                self._failed(e)

    def clear(self) -> int:
        """Remove the index's entries (how many there were). A sound index is emptied
        in one transaction and kept: builds that have it open go on writing to it, and
        what they store is kept (a database removed under them would take it along). A
        damaged one is removed; one that is not kiln's is reported and left as it is."""
        with self._write_lock, self._lock:
            self._pending.clear()
            self._touched.clear()
            self._added = 0
            if not os.path.lexists(self.path):
                return 0
            db = self._connection(create=False)
            counted = self._empty(db) if db is not None else 0
            if not self.damaged:  # emptied; or another program's, a link, a FIFO: kept
                return counted
            self._close_connections()
            for suffix in _SUFFIXES:  # nothing in it can be read: no build writes to it
                with contextlib.suppress(FileNotFoundError):
                    if stat.S_ISREG(os.lstat(self.path + suffix).st_mode):
                        os.unlink(self.path + suffix)
            self.broken, self.damaged = False, False
            return 0

    def _empty(self, db: sqlite3.Connection) -> int:
        """Delete every entry and the accounting of ``db``; how many entries there were.
        Its pages are given back to the file system when no build holds it."""
        try:
            with _transaction(db):
                counted = int(db.execute("DELETE FROM entries").rowcount)
                db.execute("DELETE FROM meta")
        except sqlite3.Error as e:
            self._failed(e)
            return 0
        with contextlib.suppress(sqlite3.Error):
            db.execute("VACUUM")
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return counted

    def close(self) -> None:
        """Write what waits and close the connections (opened again if needed)."""
        with contextlib.suppress(OSError):
            self.flush()
        with self._write_lock, self._lock:
            self._close_connections()

    def _close_connections(self) -> None:
        for db in (self._db, self._writer):
            if db is not None:
                with contextlib.suppress(sqlite3.Error):
                    db.close()
        self._db = self._writer = None


def _read_only_fs(directory: str) -> bool:
    try:
        return bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def _prepare(db: sqlite3.Connection, readonly: bool) -> None:
    """Check that ``db`` is kiln's index (_IndexUnusable if not) or, unless
    ``readonly``, make it one."""
    # One read transaction: another build may be creating the index meanwhile, and
    # statements read apart could see its tables missing but its id set.
    with _transaction(db, "DEFERRED"):
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        app = db.execute("PRAGMA application_id").fetchone()[0]
        version = db.execute("PRAGMA user_version").fetchone()[0]
    if tables or app:
        if app != APPLICATION_ID or not _TABLES.issubset(tables):
            raise _IndexUnusable("not kiln's index: another program's database")
        if version != VERSION:
            raise _IndexUnusable(f"format {version}, which this kiln does not read")
    if readonly:
        return
    db.execute(f"PRAGMA busy_timeout = {int(BUSY_S * 1000)}")
    use_wal(db)
    if not tables:
        with _transaction(db):
            for statement in filter(None, (s.strip() for s in _SCHEMA.split(";"))):
                db.execute(statement)


@contextlib.contextmanager
def _transaction(db: sqlite3.Connection, kind: str = "IMMEDIATE") -> Iterator[None]:
    """One transaction, rolled back on any error. A write transaction is taken at
    once (IMMEDIATE: never upgraded from a read, which a concurrent writer could make
    fail without waiting); DEFERRED for reads that must see one snapshot."""
    db.execute(f"BEGIN {kind}")
    try:
        yield
    except BaseException:
        with contextlib.suppress(sqlite3.Error):
            db.execute("ROLLBACK")
        raise
    db.execute("COMMIT")
