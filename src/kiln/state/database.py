"""The state database's connection: opened and checked, moved aside when its
content is damaged, kept (with ``StateError``) when anything else fails, and
written in transactions that a signal never leaves open."""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from kiln.base.errors import StateError, Untrusted
from kiln.output_dir.ownership import (
    check_own_file,
    claim_output_dir,
    corrupt_copy_name,
    is_corrupt_copy,
)
from kiln.state.integrity import check_kiln_database, is_corruption, os_reason
from kiln.state.schema import FAILURES_COLUMNS, LATER_TABLES, META, SCHEMA_VERSION, TABLES

# Statements, each with the rows it runs over.
Steps = Iterable[tuple[str, list[tuple[Any, ...]]]]

# A WAL checkpoint copies the log's pages into the database and waits for the disk
# (two fdatasyncs), on the thread whose commit crossed the mark. At SQLite's default
# mark (1,000 pages) a clean build of 10,000 small actions on ext4 made 117 of them
# on the scheduler's thread, and its cache index 48 more on the action workers
# (4.7 s of waits, under load); every 16,384 pages, a page rewritten by many commits is copied
# once. After a checkpoint the log is cut back to ``WAL_KEEP`` bytes.
WAL_CHECKPOINT_PAGES = 16384
WAL_KEEP = 4 << 20


def use_wal(db: sqlite3.Connection) -> None:
    """Write-ahead logging as kiln's databases use it: commits that do not wait for
    the disk (a power cut may lose the last ones, never corrupt the database), and
    checkpoints far apart."""
    if db.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
        with contextlib.suppress(sqlite3.OperationalError):  # another connection makes it
            db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute(f"PRAGMA wal_autocheckpoint={WAL_CHECKPOINT_PAGES}")
    db.execute(f"PRAGMA journal_size_limit={WAL_KEEP}")


class StateDatabase:
    """The SQLite database at ``OUTPUT_DIR/.kiln/state.db``.

    Invariant: ``connection`` is a checked kiln database of this schema with every
    table; it is replaced (``recover``) only by a new empty one, after the damaged
    one was moved aside. ``lock`` guards every use of it."""

    def __init__(self, output_dir: Path, path: Path, warn: Callable[[str], None]):
        self.output_dir = output_dir
        self.path = path
        self.warn = warn
        self.lock = threading.RLock()
        self.connection = self.open()

    def open(self) -> sqlite3.Connection:
        claim_output_dir(self.output_dir)
        for suffix in ("", "-wal", "-shm"):  # SQLite would follow a link
            check_own_file(f"{self.path}{suffix}")
        try:
            return self._connect()
        except Untrusted as e:
            return self.replace_corrupt(e)

    def _connect(self) -> sqlite3.Connection:
        """Open and check the database: raise Untrusted when its content fails the
        check, StateError for any other failure (the file is left as it is)."""
        try:
            db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        except sqlite3.Error as e:
            raise self.unusable(e) from e
        try:
            # Validate before writing anything: a foreign database is left as it was.
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
            if tables:
                check_kiln_database(db, tables, SCHEMA_VERSION)
            use_wal(db)
            if not tables:
                db.executescript(f"BEGIN;{TABLES}{META};COMMIT;")
            add_later_tables(db, tables)
        except (sqlite3.Error, Untrusted) as e:
            with contextlib.suppress(sqlite3.Error):
                db.close()
            if is_corruption(e):
                raise Untrusted(str(e)) from e
            raise self.unusable(e) from e
        return db

    def unusable(self, error: BaseException) -> StateError:
        return StateError(
            f"cannot use the build state {self.path}: {os_reason(error, self.path.parent)}; "
            "it is kept as it is: fix the cause (free disk space, permissions, the "
            "program holding it) and build again"
        )

    def recover(self, error: BaseException) -> None:
        """After ``error`` reading the open database: move it aside if it is damaged
        (and go on with an empty one), else keep it and raise StateError."""
        if not is_corruption(error):
            with contextlib.suppress(sqlite3.Error):
                self.connection.close()
            raise self.unusable(error) from error
        self.connection = self.replace_corrupt(error, self.connection)

    def replace_corrupt(
        self, error: BaseException, old: sqlite3.Connection | None = None
    ) -> sqlite3.Connection:
        """Move the database aside and open a new one. ``old`` is closed first: on
        close SQLite would delete the write-ahead log by name, the new database's."""
        if old is not None:
            with contextlib.suppress(sqlite3.Error):
                old.close()
        aside = self.path.with_name(corrupt_copy_name())
        try:
            os.replace(self.path, aside)
        except OSError as e:
            raise StateError(f"cannot move the unreadable {self.path} aside: {e}") from e
        for earlier in os.listdir(self.path.parent):
            if is_corrupt_copy(earlier) and earlier != aside.name:
                # One copy is kept: repeated damage never fills the disk.
                (self.path.parent / earlier).unlink(missing_ok=True)
        for suffix in ("-wal", "-shm"):
            Path(f"{self.path}{suffix}").unlink(missing_ok=True)
        reason = " ".join(str(error).split())  # one line, whatever SQLite said
        self.warn(
            f"warning: build state {self.path} was unreadable ({reason}); moved it to "
            f"{aside} and starting a clean build"
        )
        try:
            return self._connect()
        except Untrusted as e:
            raise StateError(f"cannot create a new build state at {self.path}: {e}") from e

    def read(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        """The rows of a query; a database error is left to the caller."""
        with self.lock:
            return self.connection.execute(sql, args).fetchall()

    def transaction(self, steps: Steps) -> None:
        """Each statement over its rows, all in one transaction (none if no rows)."""
        steps = [(sql, rows) for sql, rows in steps if rows]
        if not steps:
            return
        with self.lock:
            db = self.connection
            try:
                db.execute("BEGIN")
                for sql, rows in steps:
                    db.executemany(sql, rows)
                db.execute("COMMIT")
            except sqlite3.Error as e:
                self._rollback()
                raise StateError(f"cannot write the build state {self.path}: {e}") from e
            except BaseException:  # Ctrl-C mid-transaction: leave none open
                self._rollback()
                raise

    def _rollback(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.connection.execute("ROLLBACK")

    def close(self) -> None:
        with self.lock:
            self.connection.close()


def add_later_tables(db: sqlite3.Connection, tables: set[str]) -> None:
    """Create the tables added to schema 1 after its first release that ``db``
    lacks (an older kiln ignores them). A ``failures`` table of other columns (a
    later kiln's, a hand edit) is replaced by an empty one: forgetting failures
    only runs those actions again."""
    if "failures" in tables:
        found = [row[1] for row in db.execute("PRAGMA table_info(failures)")]
        if found != FAILURES_COLUMNS:
            db.execute("DROP TABLE failures")
            tables = tables - {"failures"}
    for name, create in LATER_TABLES.items():
        if name not in tables:
            db.execute(create)
