"""Telling a damaged state database from an unusable one, and checking the values
read from it (``kiln.state`` uses these).

Only damage to the database's content moves it aside: SQLite's ``CORRUPT`` and
``NOTADB`` results, or a failed ``check_kiln_database``. A full disk, an I/O
error, a lock or a permission leaves it alone. SQLite stores any type in any
column, so every value read is checked against what kiln wrote.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import resource
import sqlite3
from pathlib import Path
from typing import Any

from kiln.base.errors import Untrusted

COLUMNS = {
    "meta": ["name", "value"],
    "files": ["path", "size", "mtime_ns", "ino", "ctime_ns", "sha256"],
    "actions": ["id", "key", "params", "inputs", "outputs"],
    "file_metadata": ["path", "data"],
}
# SQLite's primary result codes that mean the file itself is damaged or not a
# database; every other error (full, I/O, busy, permission) leaves it alone.
CORRUPTION_CODES = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})


def is_corruption(error: BaseException) -> bool:
    """Whether ``error`` says the database content is damaged (not the disk, a
    lock or a permission)."""
    if isinstance(error, Untrusted):
        return True
    code = getattr(error, "sqlite_errorcode", None)
    return code is not None and (code & 0xFF) in CORRUPTION_CODES


def os_reason(error: BaseException, directory: Path) -> str:
    """What SQLite reported, with the operating system's view where it explains a
    failed write or create (no free space or inodes, a file size limit)."""
    text = " ".join(str(error).split())
    name = getattr(error, "sqlite_errorname", None)
    hints = [name] if name else []
    code = (getattr(error, "sqlite_errorcode", None) or 0) & 0xFF
    if code in (sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL, sqlite3.SQLITE_CANTOPEN):
        with contextlib.suppress(OSError):
            st = os.statvfs(directory)
            if st.f_bavail == 0 or st.f_favail == 0:
                hints.append(os.strerror(errno.ENOSPC))
        soft, _ = resource.getrlimit(resource.RLIMIT_FSIZE)
        if soft != resource.RLIM_INFINITY:
            hints.append(f"file size limit (ulimit -f) is {soft} bytes")
    return f"{text} ({'; '.join(hints)})" if hints else text


def check_kiln_database(db: sqlite3.Connection, tables: set[str], schema: str) -> None:
    """Raise Untrusted unless ``db`` is a kiln state database of this schema with
    exactly the columns kiln reads."""
    if "meta" not in tables:
        raise Untrusted("not a kiln state database (no meta table)")
    meta = dict(db.execute("SELECT name, value FROM meta").fetchall())
    if meta.get("app") != "kiln" or meta.get("schema") != schema:
        raise Untrusted(
            f"foreign state database (app={meta.get('app')!r}, schema={meta.get('schema')!r})"
        )
    for table, columns in COLUMNS.items():
        found = [row[1] for row in db.execute(f"PRAGMA table_info({table})")]
        if found != columns:
            raise Untrusted(f"table {table} has columns {found}, expected {columns}")


BAD = object()


def decode_field(index: int, text: Any) -> Any:
    """A record's JSON field (0 params, 1 inputs, 2 outputs), or ``BAD`` when it is
    not text, not JSON, or not of its documented shape."""
    if not isinstance(text, str):
        return BAD
    try:
        value = json.loads(text)
    except ValueError:
        return BAD
    if index == 0:
        return value if value is None or isinstance(value, dict) else BAD
    if type(value) is not dict:
        return BAD
    for v in value.values():  # JSON object keys are always strings
        if type(v) is not str:
            return BAD
    return value


def metadata_dict(text: Any) -> dict[str, Any]:
    """A stored metadata dict; a damaged one reads as empty."""
    try:
        value = json.loads(text) if isinstance(text, str) else None
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}
