"""A read-only view of an output directory's build state, for commands that must
create nothing on disk (``explain``, ``build --dry-run``, ``clean``'s reading).

SQLite opens even a read-only WAL database by creating its ``-shm`` and ``-wal``
files, so the snapshot copies the database (and its write-ahead log, when a
killed build left one) into a private temporary directory outside the output
directory, reads it into memory there, and removes the copy. What the command
then records (digests it computed) stays in memory.
"""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from pathlib import Path

from kiln.base.errors import NotRegularFile, StateError, Untrusted
from kiln.output_dir.ownership import KILN_DIR, check_own_file, open_regular, output_dir_state
from kiln.state.database import StateDatabase, add_later_tables
from kiln.state.integrity import check_kiln_database, is_corruption
from kiln.state.schema import META, SCHEMA_VERSION, TABLES
from kiln.state.store import StateStore


def _empty() -> sqlite3.Connection:
    db = sqlite3.connect(":memory:", check_same_thread=False, isolation_level=None)
    db.executescript(f"BEGIN;{TABLES}{META};COMMIT;")
    add_later_tables(db, set())
    return db


def _copy_regular(source: str, dest: str) -> bool:
    try:
        fd = open_regular(source)
    except FileNotFoundError:
        return False
    with open(fd, "rb") as src, open(dest, "wb") as out:
        shutil.copyfileobj(src, out)
    return True


class SnapshotDatabase(StateDatabase):
    """A copy of the state database in memory.

    Invariant: nothing under the output directory is created, changed or removed.
    A missing state reads as empty; an unreadable one as empty, with a warning.
    """

    def open(self) -> sqlite3.Connection:
        if output_dir_state(self.output_dir) != "kiln" or not (self.output_dir / KILN_DIR).is_dir():
            return _empty()
        for suffix in ("", "-wal", "-shm"):
            check_own_file(f"{self.path}{suffix}")
        with tempfile.TemporaryDirectory(prefix="kiln-state-") as tmp:
            copy = str(Path(tmp) / "state.db")
            try:
                if not _copy_regular(str(self.path), copy):
                    return _empty()
                _copy_regular(f"{self.path}-wal", f"{copy}-wal")
                disk = sqlite3.connect(copy, isolation_level=None)
                try:
                    tables = {r[0] for r in disk.execute("SELECT name FROM sqlite_master")}
                    check_kiln_database(disk, tables, SCHEMA_VERSION)
                    memory = sqlite3.connect(
                        ":memory:", check_same_thread=False, isolation_level=None
                    )
                    disk.backup(memory)
                finally:
                    disk.close()
            except (sqlite3.Error, Untrusted, NotRegularFile, OSError) as e:
                return self.replace_corrupt(e)
        add_later_tables(memory, tables)
        return memory

    def replace_corrupt(
        self, error: BaseException, old: sqlite3.Connection | None = None
    ) -> sqlite3.Connection:
        """Trust nothing, change nothing: the next build moves the database aside."""
        if isinstance(error, OSError) and not isinstance(error, FileNotFoundError):
            raise StateError(f"cannot read the build state {self.path}: {error}") from error
        if isinstance(error, sqlite3.Error) and not is_corruption(error):
            raise self.unusable(error) from error  # a full disk, I/O: not damage
        reason = " ".join(str(error).split())
        self.warn(
            f"warning: build state {self.path} is unreadable ({reason}); treating every "
            "action as never built (the next build moves it aside to state.db.corrupt-*)"
        )
        return _empty()


class StateSnapshot(StateStore):
    """The state of an output directory, read into memory (``SnapshotDatabase``);
    writes stay in memory."""

    database_class = SnapshotDatabase
