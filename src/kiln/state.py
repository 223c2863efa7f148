"""The build state: what each action last produced, and a file-digest cache.

Stored in ``OUTPUT_DIR/.kiln/state.db``, SQLite in WAL mode. Format, schema 1:

``meta(name TEXT PRIMARY KEY, value TEXT)``
    ``app`` = ``kiln``, ``schema`` = ``1``. Anything else is a foreign database.
``files(path TEXT PRIMARY KEY, size, mtime_ns, ino, ctime_ns, sha256 TEXT)``
    SHA-256 of a file, valid while its stat still matches the four numbers, so a
    no-op build reads no file contents.
``actions(id TEXT PRIMARY KEY, key TEXT, params TEXT, inputs TEXT, outputs TEXT)``
    One row per action that last succeeded. ``id`` names the action by its
    outputs; ``key`` is the digest deciding whether it must run again;
    ``params`` is its parameters as JSON; ``inputs`` and ``outputs`` are JSON
    objects mapping file keys to SHA-256 digests.
``file_metadata(path TEXT PRIMARY KEY, data TEXT)``
    ``BuildFile.access_metadata`` dictionaries as JSON.
``written(path TEXT PRIMARY KEY)``
    Every output path (relative to the output directory) kiln let an action
    write, recorded before the action starts: what ``kiln clean`` may delete.
    Created on open in a database that lacks it.
``nonreproducible(key TEXT PRIMARY KEY, why TEXT)``
    The keys whose results ``kiln build --check-reproducible`` found not
    reproduced, with what differed (``kiln.reproducible``): no build of this
    output directory puts them into or takes them from a cache. Created on open
    in a database that lacks it.
``durations(id TEXT PRIMARY KEY, seconds REAL)``
    How long each action (by ``id``, as in ``actions``) took the last time it
    ran, successful or not: the weights of critical-path scheduling
    (``kiln.priority``). Added to schema 1 compatibly: a schema-1 database
    without it (written by an older kiln) gets the empty table when opened, and
    an older kiln ignores it. Durations are written with the action records and
    at the end of a build; a killed build may lose those of its last actions,
    which only makes the next build's order less informed.

Each finished action is written in its own transaction, so a build killed at
any point keeps the records of what it finished and nothing else. An action
that is about to run loses its old record first, so a half-run action is never
trusted. A database that fails the integrity check (not SQLite, truncated, another
program's, another schema or other tables, a damaged page found while the
tables are read, as kiln reads them whole) is moved aside to
``state.db.corrupt-<time>``, unchanged, replacing any earlier such copy (at most
one is kept), and replaced by an empty one. Any other failure to open it (a
full disk, an I/O error, a lock held by another program, no permission) is not
corruption: the state is kept and ``StateError`` names the OS's reason. Every
table is ``WITHOUT ROWID``: its primary key is its only b-tree, so reading a
table reads all of its pages. A row of the right tables holding values of the
wrong types (a key that is not text, fields that are not the JSON objects
described above) is a damaged record: its action runs again.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kiln._statecheck import (
    check_kiln_database,
    is_corruption,
    metadata_dict,
    os_reason,
)
from kiln.action_record import ActionRecord
from kiln.digests import hash_file
from kiln.errors import NotRegularFile, StateError, Untrusted
from kiln.outputs import check_own_file, claim_output_dir, file_kind

SCHEMA_VERSION = "1"
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta(name TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS files(
    path TEXT PRIMARY KEY, size INTEGER, mtime_ns INTEGER, ino INTEGER,
    ctime_ns INTEGER, sha256 TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS actions(
    id TEXT PRIMARY KEY, key TEXT NOT NULL, params TEXT, inputs TEXT NOT NULL,
    outputs TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS file_metadata(
    path TEXT PRIMARY KEY, data TEXT NOT NULL) WITHOUT ROWID;
"""
_WRITTEN = "CREATE TABLE IF NOT EXISTS written(path TEXT PRIMARY KEY) WITHOUT ROWID;"
# Keys whose results --check-reproducible found not reproduced: never shared.
_NONREPRODUCIBLE = (
    "CREATE TABLE IF NOT EXISTS nonreproducible(key TEXT PRIMARY KEY, why TEXT NOT NULL) "
    "WITHOUT ROWID;"
)
# Added to schema 1 later: created in databases that lack it (see the docstring).
_DURATIONS = """
CREATE TABLE IF NOT EXISTS durations(id TEXT PRIMARY KEY, seconds REAL NOT NULL) WITHOUT ROWID;
"""
_META = f"INSERT INTO meta VALUES ('app', 'kiln'), ('schema', '{SCHEMA_VERSION}')"

StatKey = tuple[int, int, int, int]


def stat_key(st: os.stat_result) -> StatKey:
    return (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns)


# The rows of the digest cache whose every field has its type.
_TYPED_FILES = (
    "SELECT * FROM files WHERE typeof(path) = 'text' AND typeof(sha256) = 'text'"
    + "".join(f" AND typeof({c}) = 'integer'" for c in ("size", "mtime_ns", "ino", "ctime_ns"))
)


class StateStore:
    """The state database of one output directory.

    Invariant: rows are read once at open; writes go straight to the database,
    each action record in its own transaction. Safe to call from several threads.
    """

    def __init__(self, output_dir: Path, warn: Callable[[str], None]):
        self.output_dir = output_dir
        self.path = output_dir / ".kiln" / "state.db"
        self._warn = warn
        self._lock = threading.RLock()
        self._db = self._open()
        self._files: dict[str, tuple[StatKey, str]] = {}
        self._records: dict[str, ActionRecord] | None = None
        self._dirty_files: dict[str, tuple[StatKey, str]] = {}
        self._durations: dict[str, float] | None = None
        self._dirty_durations: dict[str, float] = {}
        try:
            # Tables are WITHOUT ROWID (no separate index b-trees): reading them whole
            # touches every page, so damage shows now rather than at a later write.
            # A mistyped row is not trusted: SQLite leaves it out.
            self._files = {
                path: ((size, mtime, ino, ctime), digest)
                for path, size, mtime, ino, ctime, digest in self._db.execute(_TYPED_FILES)
            }
            self._db.execute("SELECT count(data) FROM file_metadata").fetchone()
        except sqlite3.Error as e:
            self._files.clear()
            self._db = self._recover(e, self._db)

    # -- opening -------------------------------------------------------------

    def _open(self) -> sqlite3.Connection:
        claim_output_dir(self.output_dir)
        for suffix in ("", "-wal", "-shm"):  # SQLite would follow a link
            check_own_file(f"{self.path}{suffix}")
        try:
            return self._connect()
        except Untrusted as e:
            return self._replace_corrupt(e)

    def _connect(self) -> sqlite3.Connection:
        """Open and check the database: raise Untrusted when its content fails the
        check, StateError for any other failure (the file is left as it is)."""
        try:
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        except sqlite3.Error as e:
            raise self._unusable(e) from e
        try:
            # Validate before writing anything: a foreign database is left as it was.
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
            if tables:
                check_kiln_database(db, tables, SCHEMA_VERSION)
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA synchronous=NORMAL")
            if not tables:
                db.executescript(f"BEGIN;{_SCHEMA}{_DURATIONS}{_META};COMMIT;")
            elif "durations" not in tables:
                db.executescript(f"BEGIN;{_DURATIONS}COMMIT;")
            if "written" not in tables:
                db.execute(_WRITTEN)
            if "nonreproducible" not in tables:
                db.execute(_NONREPRODUCIBLE)
        except (sqlite3.Error, Untrusted) as e:
            with contextlib.suppress(sqlite3.Error):
                db.close()
            if is_corruption(e):
                raise Untrusted(str(e)) from e
            raise self._unusable(e) from e
        return db

    def _unusable(self, error: BaseException) -> StateError:
        return StateError(
            f"cannot use the build state {self.path}: {os_reason(error, self.path.parent)}; "
            "it is kept as it is: fix the cause (free disk space, permissions, the "
            "program holding it) and build again"
        )

    def _recover(self, error: BaseException, old: sqlite3.Connection) -> sqlite3.Connection:
        """After ``error`` reading the open database: move it aside if it is damaged,
        else keep it and raise StateError."""
        if is_corruption(error):
            return self._replace_corrupt(error, old)
        with contextlib.suppress(sqlite3.Error):
            old.close()
        raise self._unusable(error) from error

    def _replace_corrupt(
        self, error: BaseException, old: sqlite3.Connection | None = None
    ) -> sqlite3.Connection:
        """Move the database aside and open a new one. ``old`` is closed first: on
        close SQLite would delete the write-ahead log by name, the new database's."""
        if old is not None:
            with contextlib.suppress(sqlite3.Error):
                old.close()
        aside = self.path.with_name(f"state.db.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
        try:
            os.replace(self.path, aside)
        except OSError as e:
            raise StateError(f"cannot move the unreadable {self.path} aside: {e}") from e
        for earlier in self.path.parent.glob("state.db.corrupt-*"):
            if earlier != aside:  # keep one copy: repeated damage never fills the disk
                earlier.unlink(missing_ok=True)
        for suffix in ("-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        reason = " ".join(str(error).split())  # one line, whatever SQLite said
        self._warn(
            f"warning: build state {self.path} was unreadable ({reason}); moved it to "
            f"{aside} and starting a clean build"
        )
        try:
            return self._connect()
        except Untrusted as e:
            raise StateError(f"cannot create a new build state at {self.path}: {e}") from e

    def close(self) -> None:
        with self._lock:
            self.flush()
            self._db.close()

    # -- file digests --------------------------------------------------------

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
        skey = stat_key(st)
        cached = self._files.get(spath)
        if cached is not None and cached[0] == skey:
            return cached[1]
        digest = hash_file(spath)
        self.remember_digest(spath, skey, digest)
        return digest

    def cached_digest(self, path: Path | str, output: bool = False) -> str | None:
        """The digest cached for ``path`` if the file is unchanged since (same stat;
        an ``output``'s own, a link not followed); None when it is missing, changed
        or not a regular file. Never reads the file."""
        spath = str(path)
        try:
            st = os.lstat(spath) if output else os.stat(spath)
        except OSError:
            return None
        if not stat.S_ISREG(st.st_mode):
            return None
        skey = stat_key(st)
        cached = self._files.get(spath)
        return cached[1] if cached is not None and cached[0] == skey else None

    def cached_output_digest(self, path: str) -> str | None:
        """``cached_digest(path, output=True)`` for a string path, as lean as it gets:
        an up-to-date check asks it for every output of every action."""
        try:
            st = os.lstat(path)
        except OSError:
            return None
        cached = self._files.get(path)
        if cached is None or not stat.S_ISREG(st.st_mode):
            return None
        if cached[0] != (st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns):
            return None
        return cached[1]

    def remember_digest(self, path: str, skey: StatKey, digest: str) -> None:
        with self._lock:
            self._files[path] = (skey, digest)
            self._dirty_files[path] = (skey, digest)

    def flush(self) -> None:
        """Write pending digest-cache entries and durations."""
        with self._lock:
            if self._dirty_durations:
                self._write(
                    "INSERT OR REPLACE INTO durations VALUES (?,?)",
                    list(self._dirty_durations.items()),
                )
                self._dirty_durations.clear()
            if not self._dirty_files:
                return
            rows = [(p, *s, d) for p, (s, d) in self._dirty_files.items()]
            self._dirty_files.clear()
            self._write("INSERT OR REPLACE INTO files VALUES (?,?,?,?,?,?)", rows)

    # -- durations -------------------------------------------------------------

    def durations(self) -> dict[str, float]:
        """Seconds each action took when it last ran, by action id (read once)."""
        with self._lock:
            if self._durations is None:
                try:
                    rows = self._db.execute("SELECT id, seconds FROM durations").fetchall()
                except sqlite3.DatabaseError as e:
                    self._warn(f"warning: cannot read past durations from {self.path}: {e}")
                    rows = []
                self._durations = {aid: float(sec) for aid, sec in rows}
            return self._durations

    def remember_duration(self, action_id: str, seconds: float) -> None:
        """Note how long an action took; written with the next record or flush."""
        with self._lock:
            self.durations()[action_id] = seconds
            self._dirty_durations[action_id] = seconds

    # -- action records ------------------------------------------------------

    def records(self) -> dict[str, ActionRecord]:
        if self._records is None:
            try:
                rows = self._db.execute("SELECT id, key, params, inputs, outputs FROM actions")
                self._records = {
                    aid: ActionRecord(key, params, inputs, outputs, raw=True)
                    for aid, key, params, inputs, outputs in rows
                    if type(aid) is str  # another type names no action
                }
            except sqlite3.Error as e:
                self._db = self._recover(e, self._db)
                self._files.clear()
                self._records = {}
        return self._records

    def record(self, action_id: str, rec: ActionRecord) -> None:
        """Record a finished action and its outputs' digests, in one transaction."""
        self.record_many([(action_id, rec)])

    def record_many(self, finished: list[tuple[str, ActionRecord]]) -> None:
        """Record finished actions with the digests and durations remembered so far,
        all in one transaction (a group commit): a kill keeps all of them or none."""
        self.commit_round(finished, [], [])

    def claim_outputs(self, paths: list[str]) -> None:
        """Record that kiln lets an action write ``paths`` (relative to the output dir)."""
        self.commit_round([], [], paths)

    def commit_round(
        self,
        finished: list[tuple[str, ActionRecord]],
        starting: list[str],
        paths: list[str],
    ) -> None:
        """One round of the scheduler in one transaction: record the ``finished``
        actions (with the digests and durations remembered so far), drop the records
        of the actions ``starting`` (a half-run action is never trusted) and record
        that kiln lets them write ``paths``. A kill keeps all of it or none."""
        with self._lock:
            records = self.records()
            files = [(p, *s, d) for p, (s, d) in self._dirty_files.items()]
            durations = list(self._dirty_durations.items())
            actions = [
                (
                    action_id,
                    rec.key,
                    json.dumps(rec.params),
                    json.dumps(rec.inputs),
                    json.dumps(rec.outputs),
                )
                for action_id, rec in finished
            ]
            gone = [(a,) for a in starting if a in records]
            self._transaction(
                [
                    ("INSERT OR REPLACE INTO files VALUES (?,?,?,?,?,?)", files),
                    ("INSERT OR REPLACE INTO durations VALUES (?,?)", durations),
                    ("INSERT OR REPLACE INTO actions VALUES (?,?,?,?,?)", actions),
                    ("DELETE FROM actions WHERE id = ?", gone),
                    ("INSERT OR IGNORE INTO written VALUES (?)", [(p,) for p in paths]),
                ]
            )
            self._dirty_files.clear()
            self._dirty_durations.clear()
            records.update(finished)
            for (a,) in gone:
                records.pop(a, None)

    def written_outputs(self) -> set[str]:
        """Every output path kiln ever let an action write here."""
        with self._lock:
            try:
                return {r[0] for r in self._db.execute("SELECT path FROM written")}
            except sqlite3.DatabaseError:
                return set()

    def nonreproducible(self) -> frozenset[str]:
        """The keys whose results a check found not reproduced (read once per call)."""
        with self._lock:
            try:
                rows = self._db.execute("SELECT key FROM nonreproducible").fetchall()
            except sqlite3.DatabaseError:
                return frozenset()
            return frozenset(r[0] for r in rows if isinstance(r[0], str))

    def mark_nonreproducible(self, key: str, why: str) -> None:
        """Remember that the results of ``key`` were not reproduced (``why``)."""
        with self._lock:
            self._write("INSERT OR REPLACE INTO nonreproducible VALUES (?, ?)", [(key, why)])

    def _write(self, sql: str, rows: list[tuple[Any, ...]]) -> None:
        self._transaction([(sql, rows)])

    def _transaction(self, steps: list[tuple[str, list[tuple[Any, ...]]]]) -> None:
        """Each statement over its rows, all in one transaction (none if no rows)."""
        steps = [(sql, rows) for sql, rows in steps if rows]
        if not steps:
            return
        try:
            self._db.execute("BEGIN")
            for sql, rows in steps:
                self._db.executemany(sql, rows)
            self._db.execute("COMMIT")
        except sqlite3.Error as e:
            self._rollback()
            raise StateError(f"cannot write the build state {self.path}: {e}") from e
        except BaseException:  # Ctrl-C mid-transaction: leave none open
            self._rollback()
            raise

    def _rollback(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self._db.execute("ROLLBACK")

    # -- per-file metadata ---------------------------------------------------

    def file_metadata(
        self, key: str, mutate: Callable[[dict[str, Any]], bool] | None
    ) -> dict[str, Any]:
        """The metadata dict of ``key``; ``mutate`` edits it under the lock and returns
        True to persist."""
        with self._lock:
            row = self._db.execute("SELECT data FROM file_metadata WHERE path = ?", (key,))
            found = row.fetchone()
            data = metadata_dict(found[0]) if found else {}
            if mutate is not None and mutate(data):
                self._write(
                    "INSERT OR REPLACE INTO file_metadata VALUES (?, ?)",
                    [(key, json.dumps(data, sort_keys=True))],
                )
            return data
