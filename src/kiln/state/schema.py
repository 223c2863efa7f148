"""The tables of the state database (described in ``kiln.state``'s docstring)."""

from __future__ import annotations

import os

SCHEMA_VERSION = "1"

TABLES = """
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
# The tables added to schema 1 later: created on open in a database that lacks them.
WRITTEN = "CREATE TABLE IF NOT EXISTS written(path TEXT PRIMARY KEY) WITHOUT ROWID;"
NONREPRODUCIBLE = (
    "CREATE TABLE IF NOT EXISTS nonreproducible(key TEXT PRIMARY KEY, why TEXT NOT NULL) "
    "WITHOUT ROWID;"
)
DURATIONS = (
    "CREATE TABLE IF NOT EXISTS durations(id TEXT PRIMARY KEY, seconds REAL NOT NULL) "
    "WITHOUT ROWID;"
)
FAILURES = (
    "CREATE TABLE IF NOT EXISTS failures(id TEXT PRIMARY KEY, key TEXT NOT NULL, params TEXT, "
    "inputs TEXT NOT NULL, error TEXT NOT NULL, detail TEXT, log TEXT, result TEXT, "
    "time REAL NOT NULL, why TEXT NOT NULL, remembered INTEGER NOT NULL) "
    "WITHOUT ROWID;"
)
FAILURES_COLUMNS = [
    *("id", "key", "params", "inputs", "error", "detail", "log", "result", "time"),
    *("why", "remembered"),
]
LATER_TABLES = {
    "written": WRITTEN,
    "nonreproducible": NONREPRODUCIBLE,
    "durations": DURATIONS,
    "failures": FAILURES,
}
META = f"INSERT INTO meta VALUES ('app', 'kiln'), ('schema', '{SCHEMA_VERSION}')"


def stored_path(path: str) -> str | bytes:
    """``path`` as a table keyed by paths (``files``, ``written``, ``file_metadata``)
    stores it: text when it is UTF-8, else its bytes (a name with a byte that is not
    UTF-8, which ``os.fsdecode`` made a lone surrogate: SQLite's text cannot hold
    it). A BLOB never equals a TEXT, so no two paths share a row, and an older kiln,
    reading text rows only, skips it. Every path goes into those tables through here."""
    if path.isascii():
        return path
    try:
        path.encode()
    except UnicodeEncodeError:
        return os.fsencode(path)
    return path


def loaded_path(stored: str | bytes) -> str:
    """The path ``stored_path`` stored."""
    return stored if isinstance(stored, str) else os.fsdecode(stored)
