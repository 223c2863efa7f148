"""Tests of kiln.state: the SQLite build state, the digest cache, per-file metadata,
and recovery from a state database that cannot be trusted."""

from __future__ import annotations

import hashlib
import json
import os
import re
import sqlite3
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import kiln.state
from kiln.executor import BuildContext, Executor, FileNamespace
from kiln.state import SCHEMA_VERSION, ActionRecord, StateStore


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class Warnings(list[str]):
    """Collects the store's warnings."""

    def __call__(self, text: str) -> None:
        self.append(text)


@pytest.fixture
def out(tmp_path: Path) -> Path:
    return tmp_path / "out"


def open_store(out: Path, warnings: Warnings | None = None) -> StateStore:
    return StateStore(out, warn=warnings if warnings is not None else Warnings())


def record(key: str = "k1") -> ActionRecord:
    return ActionRecord(key, {"argv": ["x"]}, {"src:/a": sha(b"a")}, {"gen/b": sha(b"b")})


def raw_rows(db: Path, sql: str) -> list[tuple[object, ...]]:
    """Rows read through a separate connection, as another process would see them."""
    conn = sqlite3.connect(db)
    try:
        return conn.execute(sql).fetchall()
    finally:
        conn.close()


@pytest.fixture
def hash_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every file kiln.state reads to hash it."""
    calls: list[str] = []
    real = kiln.state.hash_file

    def counting(path: Path | str, follow: bool = True) -> str:
        calls.append(str(path))
        return real(path, follow)

    monkeypatch.setattr(kiln.state.file_digests, "hash_file", counting)
    return calls


# -- the database --------------------------------------------------------------


def test_creates_wal_database_with_schema_version(out: Path) -> None:
    store = open_store(out)
    store.close()
    db = out / ".kiln" / "state.db"
    assert store.path == db
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        meta = dict(conn.execute("SELECT name, value FROM meta").fetchall())
    finally:
        conn.close()
    assert meta == {"app": "kiln", "schema": SCHEMA_VERSION}


def test_every_table_is_documented_where_defined(out: Path) -> None:
    open_store(out).close()
    tables = [
        r[0]
        for r in raw_rows(
            out / ".kiln" / "state.db", "SELECT name FROM sqlite_master WHERE type = 'table'"
        )
    ]
    assert set(tables) >= {"meta", "files", "actions", "file_metadata"}
    doc = kiln.state.__doc__ or ""
    for table in tables:
        assert f"``{table}(" in doc, f"table {table} is not described in kiln.state's docstring"
    assert f"schema {SCHEMA_VERSION}" in doc


def test_record_is_committed_at_once_and_survives_reopen(out: Path) -> None:
    store = open_store(out)
    store.record("gen/b", record())
    # Visible to another connection before the store is closed: its own transaction.
    rows = raw_rows(store.path, "SELECT id, key FROM actions")
    assert rows == [("gen/b", "k1")]
    store.close()

    again = open_store(out)
    assert again.records() == {"gen/b": record()}
    again.close()


def test_a_starting_action_loses_its_record_durably(out: Path) -> None:
    store = open_store(out)
    store.record("gen/b", record())
    store.record("gen/c", record("k2"))
    store.commit_round([], ["gen/b"], [])
    assert raw_rows(store.path, "SELECT id FROM actions") == [("gen/c",)]
    store.close()
    again = open_store(out)
    assert set(again.records()) == {"gen/c"}
    again.close()


def test_record_survives_a_killed_process(out: Path) -> None:
    """A record written just before SIGKILL (no close, no checkpoint) is kept."""
    script = f"""
import os, signal, sys
from pathlib import Path
from kiln.state import ActionRecord, StateStore
store = StateStore(Path({str(out)!r}), warn=print)
store.record("gen/done", ActionRecord("k", {{}}, {{}}, {{"gen/done": "d"}}))
store.commit_round([], ["gen/none"], [])
os.kill(os.getpid(), signal.SIGKILL)
"""
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, timeout=60)
    assert proc.returncode == -9, proc.stderr.decode()
    warnings = Warnings()
    store = open_store(out, warnings)
    assert store.records() == {"gen/done": ActionRecord("k", {}, {}, {"gen/done": "d"})}
    store.close()
    assert warnings == []


# -- the digest cache ----------------------------------------------------------


def test_digest_is_sha256_and_none_for_a_missing_file(out: Path, tmp_path: Path) -> None:
    f = tmp_path / "a.bin"
    f.write_bytes(b"\x00abc" * 1000)
    store = open_store(out)
    assert store.digest(f) == sha(b"\x00abc" * 1000)
    assert store.digest(tmp_path / "missing") is None
    store.close()


def test_digest_cache_persists_so_a_new_store_reads_no_contents(
    out: Path, tmp_path: Path, hash_calls: list[str]
) -> None:
    f = tmp_path / "a.txt"
    f.write_text("hello")
    store = open_store(out)
    assert store.digest(f) == sha(b"hello")
    assert store.digest(f) == sha(b"hello")
    assert hash_calls == [str(f)]  # hashed once, then from the cache
    store.close()

    hash_calls.clear()
    again = open_store(out)
    assert again.digest(f) == sha(b"hello")
    assert hash_calls == []
    again.close()


def test_digest_cache_entries_are_written_by_flush(out: Path, tmp_path: Path) -> None:
    f = tmp_path / "a.txt"
    f.write_text("hello")
    store = open_store(out)
    store.digest(f)
    store.flush()
    rows = raw_rows(store.path, "SELECT path, sha256 FROM files")
    assert rows == [(str(f), sha(b"hello"))]
    store.close()


def test_changed_file_is_rehashed(out: Path, tmp_path: Path, hash_calls: list[str]) -> None:
    f = tmp_path / "a.txt"
    f.write_text("hello")
    store = open_store(out)
    store.digest(f)
    f.write_text("hello, world")  # new size
    assert store.digest(f) == sha(b"hello, world")
    st = f.stat()
    f.write_text("HELLO, WORLD")  # same size; a different mtime
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000))
    assert store.digest(f) == sha(b"HELLO, WORLD")
    assert len(hash_calls) == 3
    store.close()


def test_same_size_same_mtime_edit_is_seen_through_ctime(
    out: Path, tmp_path: Path, hash_calls: list[str]
) -> None:
    """Tools that restore mtime after editing (or edits within one clock tick) are
    caught by the change time, which user space cannot set."""
    f = tmp_path / "a.txt"
    f.write_text("hello")
    st = f.stat()
    store = open_store(out)
    store.digest(f)
    f.write_text("HELLO")
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    if f.stat().st_ctime_ns == st.st_ctime_ns:
        pytest.skip("the file system's change-time clock did not advance")
    assert store.digest(f) == sha(b"HELLO")
    store.close()


def test_replaced_file_is_rehashed_through_its_inode(out: Path, tmp_path: Path) -> None:
    f = tmp_path / "a.txt"
    f.write_text("hello")
    st = f.stat()
    store = open_store(out)
    store.digest(f)
    new = tmp_path / "new.txt"
    new.write_text("HELLO")
    os.utime(new, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(new, f)
    assert f.stat().st_ino != st.st_ino
    assert store.digest(f) == sha(b"HELLO")
    store.close()


def test_touched_file_is_rehashed_once_with_the_same_digest(
    out: Path, tmp_path: Path, hash_calls: list[str]
) -> None:
    f = tmp_path / "a.txt"
    f.write_text("hello")
    store = open_store(out)
    digest = store.digest(f)
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 5_000_000_000))
    assert store.digest(f) == digest
    store.close()
    hash_calls.clear()
    again = open_store(out)
    assert again.digest(f) == digest
    assert hash_calls == []  # the new stat was cached
    again.close()


# -- per-file metadata ---------------------------------------------------------


def metadata_file(out: Path) -> tuple[Executor, object]:
    executor = Executor(out)
    with executor.get_context(""):
        f = BuildContext.current().allocate_file("model.onnx", FileNamespace.PARAMS)
    return executor, f


def test_access_metadata_persists_when_the_callback_returns_true(out: Path) -> None:
    executor, f = metadata_file(out)

    def set_etag(m: dict[str, object]) -> bool:
        m["etag"] = "abc"
        m["size"] = 12
        return True

    assert f.access_metadata(set_etag) == {"etag": "abc", "size": 12}  # type: ignore[attr-defined]
    executor.close()

    executor, f = metadata_file(out)
    assert f.access_metadata() == {"etag": "abc", "size": 12}  # type: ignore[attr-defined]
    rows = raw_rows(out / ".kiln" / "state.db", "SELECT path, data FROM file_metadata")
    assert [(p, json.loads(d)) for p, d in rows] == [
        ("params/model.onnx", {"etag": "abc", "size": 12})
    ]
    executor.close()


def test_access_metadata_not_persisted_when_the_callback_returns_false(out: Path) -> None:
    executor, f = metadata_file(out)
    f.access_metadata(lambda m: m.update(etag="1") or True)  # type: ignore[attr-defined]

    def scribble(m: dict[str, object]) -> bool:
        m["etag"] = "2"
        m["other"] = True
        return False

    assert f.access_metadata(scribble)["etag"] == "2"  # type: ignore[attr-defined]
    assert f.access_metadata() == {"etag": "1"}  # type: ignore[attr-defined]
    executor.close()
    executor, f = metadata_file(out)
    assert f.access_metadata() == {"etag": "1"}  # type: ignore[attr-defined]
    executor.close()


def test_access_metadata_is_per_file_and_empty_by_default(out: Path) -> None:
    executor = Executor(out)
    with executor.get_context(""):
        ctx = BuildContext.current()
        a = ctx.allocate_file("a")
        b = ctx.allocate_file("b")
    assert a.access_metadata() == {}
    a.access_metadata(lambda m: m.update(n=1) or True)
    assert b.access_metadata() == {}
    assert a.access_metadata() == {"n": 1}
    executor.close()


def test_access_metadata_mutations_are_serialised(out: Path) -> None:
    executor, f = metadata_file(out)

    def bump(m: dict[str, object]) -> bool:
        value = m.get("n", 0)
        assert isinstance(value, int)
        m["n"] = value + 1
        return True

    def worker() -> None:
        for _ in range(25):
            f.access_metadata(bump)  # type: ignore[attr-defined]

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert f.access_metadata() == {"n": 200}  # type: ignore[attr-defined]
    executor.close()


# -- recovery from an untrusted database ---------------------------------------


def good_database(out: Path, tmp_path: Path) -> Path:
    """A state database holding an action record, a digest and some metadata."""
    f = tmp_path / "a.txt"
    f.write_text("hello")
    store = open_store(out)
    store.digest(f)
    store.record("gen/b", record())
    store.file_metadata("gen/b", lambda m: m.update(x=1) or True)
    store.close()
    return store.path


def corrupt_page(db: Path, table: str) -> None:
    """Overwrite the root page of ``table`` (or index) with garbage."""
    conn = sqlite3.connect(db)
    try:
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        (root,) = conn.execute(
            "SELECT rootpage FROM sqlite_master WHERE name = ?", (table,)
        ).fetchone()
    finally:
        conn.close()
    with open(db, "r+b") as f:
        f.seek((root - 1) * page_size)
        f.write(b"\xa5" * page_size)


def foreign_database(db: Path) -> None:
    db.unlink()
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE users(name TEXT)")
    conn.execute("INSERT INTO users VALUES ('ada')")
    conn.commit()
    conn.close()


def foreign_meta(db: Path, app: str, schema: str) -> None:
    conn = sqlite3.connect(db)
    conn.execute("UPDATE meta SET value = ? WHERE name = 'app'", (app,))
    conn.execute("UPDATE meta SET value = ? WHERE name = 'schema'", (schema,))
    conn.commit()
    conn.close()


def truncate(db: Path, size: int) -> None:
    with open(db, "r+b") as f:
        f.truncate(size)


def rename_column(db: Path) -> None:
    conn = sqlite3.connect(db)
    conn.execute("ALTER TABLE files RENAME COLUMN ino TO inode")
    conn.commit()
    conn.close()


CORRUPTIONS = {
    "other-columns": rename_column,
    "garbage": lambda db: db.write_bytes(os.urandom(3000) + b"\x00" * 5000),
    "text": lambda db: db.write_text("this is not a database\n"),
    "truncated-header": lambda db: truncate(db, 60),
    "truncated-half": lambda db: truncate(db, db.stat().st_size // 2),
    "foreign-sqlite": foreign_database,
    "other-app": lambda db: foreign_meta(db, "doit", SCHEMA_VERSION),
    "future-schema": lambda db: foreign_meta(db, "kiln", "999"),
    "actions-page": lambda db: corrupt_page(db, "actions"),
    "files-page": lambda db: corrupt_page(db, "files"),
    "metadata-page": lambda db: corrupt_page(db, "file_metadata"),
    "meta-page": lambda db: corrupt_page(db, "meta"),
}


@pytest.mark.parametrize("damage", sorted(CORRUPTIONS))
def test_untrusted_database_is_moved_aside_with_one_warning(
    damage: str, out: Path, tmp_path: Path
) -> None:
    db = good_database(out, tmp_path)
    CORRUPTIONS[damage](db)
    damaged = db.read_bytes()
    warnings = Warnings()

    store = open_store(out, warnings)
    assert store.records() == {}  # nothing of the old state is trusted
    # The new database works: every kind of write succeeds and is read back.
    store.record("gen/c", record("k9"))
    store.commit_round([], ["gen/c"], [])
    store.record("gen/d", record("k8"))
    f = tmp_path / "a.txt"
    assert store.digest(f) == sha(b"hello")
    store.file_metadata("gen/d", lambda m: m.update(y=2) or True)
    assert store.file_metadata("gen/b", None) == {}
    store.close()

    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    moved = re.search(r"(\S+state\.db\.corrupt-\S+)", warnings[0])
    assert moved is not None, warnings[0]
    aside = Path(moved.group(1).rstrip(".,;:"))
    assert aside.parent == db.parent
    assert aside.read_bytes() == damaged  # kept for the user, byte for byte
    assert str(db) in warnings[0]

    again = open_store(out, warnings)
    assert set(again.records()) == {"gen/d"}
    assert again.file_metadata("gen/d", None) == {"y": 2}
    again.close()
    assert len(warnings) == 1  # the new database is trusted


def test_empty_file_is_a_new_database_without_warning(out: Path, tmp_path: Path) -> None:
    db = good_database(out, tmp_path)
    db.write_bytes(b"")
    warnings = Warnings()
    store = open_store(out, warnings)
    assert store.records() == {}
    store.record("gen/c", record())
    store.close()
    assert warnings == []


def test_stale_wal_of_a_moved_database_is_removed(out: Path, tmp_path: Path) -> None:
    db = good_database(out, tmp_path)
    Path(f"{db}-wal").write_bytes(os.urandom(4096))
    db.write_bytes(os.urandom(4096))
    warnings = Warnings()
    store = open_store(out, warnings)
    store.record("gen/c", record())
    store.close()
    assert len(warnings) == 1
    again = open_store(out, warnings)
    assert set(again.records()) == {"gen/c"}
    again.close()
    assert len(warnings) == 1


def test_recovered_database_is_shared_with_other_readers(out: Path, tmp_path: Path) -> None:
    """After moving a database aside mid-open, records written to the new one are
    visible to another connection (the old connection must not take the new
    database's write-ahead log with it)."""
    db = good_database(out, tmp_path)
    corrupt_page(db, "actions")
    store = open_store(out)
    assert store.records() == {}
    store.record("gen/c", record())
    assert raw_rows(db, "SELECT id FROM actions") == [("gen/c",)]
    store.close()


def test_a_second_corruption_replaces_the_first_moved_copy(out: Path, tmp_path: Path) -> None:
    """At most one ``state.db.corrupt-*`` copy is kept: the latest, byte for byte."""
    db = good_database(out, tmp_path)
    warnings = Warnings()
    for content in (b"first garbage" * 300, b"second garbage" * 300):
        db.write_bytes(content)
        open_store(out, warnings).close()
    assert len(warnings) == 2
    (moved,) = db.parent.glob("state.db.corrupt-*")
    assert moved.read_bytes() == b"second garbage" * 300
    assert str(moved) in warnings[1]


@pytest.mark.parametrize("stored", ["'not json'", "'[1, 2]'", "42", "x'00'"])
def test_mistyped_metadata_reads_as_empty(stored: str, out: Path, tmp_path: Path) -> None:
    db = good_database(out, tmp_path)
    conn = sqlite3.connect(db)
    conn.execute(f"UPDATE file_metadata SET data = {stored}")
    conn.commit()
    conn.close()
    warnings = Warnings()
    store = open_store(out, warnings)
    assert store.file_metadata("gen/b", None) == {}
    store.file_metadata("gen/b", lambda m: m.update(z=3) or True)
    assert store.file_metadata("gen/b", None) == {"z": 3}
    store.close()
    assert warnings == []


def test_the_state_and_the_cache_index_checkpoint_their_logs_far_apart(tmp_path: Path) -> None:
    """Both databases log ahead (a commit waits for no disk) and leave a checkpoint,
    which copies the log back and waits for the disk twice, for every
    ``WAL_CHECKPOINT_PAGES`` pages rather than SQLite's 1,000: a clean build of
    10,000 small actions made 117 of them on the scheduler's thread."""
    from kiln.cache.local import LocalCache
    from kiln.state.database import WAL_CHECKPOINT_PAGES, WAL_KEEP

    store = open_store(tmp_path / "out")
    cache = LocalCache(tmp_path / "cache")
    cache.put_entry("k" * 64, b"{}")
    cache.index.flush()
    for db in (store.database.connection, sqlite3.connect(cache.index.path)):
        assert db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    for db in (store.database.connection, cache.index._writer):
        assert db is not None
        assert db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == WAL_CHECKPOINT_PAGES
        assert db.execute("PRAGMA journal_size_limit").fetchone()[0] == WAL_KEEP
        assert db.execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL
    assert WAL_CHECKPOINT_PAGES > 1000
    cache.close()
    store.close()
