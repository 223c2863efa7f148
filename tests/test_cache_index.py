"""The cache's index (``v1/index.db``, ``kiln.cache.index``): builds in several
processes write it at once without damage; a damaged, truncated, foreign, busy or
another user's index is never served from, is reported, and the build goes on
(keeping its entries as files); a row that is not the entry of its key is a miss."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import needs
import pytest
from cache_build import entries, index_path, tree

from kiln.cache.entry import CacheEntry

Kiln = Callable[..., Any]

# ``count`` tiny in-process actions, each writing a few bytes that depend on ``SALT``
# (a project of its own per salt); each run adds an ``x`` to ``runs/SALT-i``.
MODULE = """
import os
from kiln.executor import BuildAction

SALT, COUNT = {salt!r}, {count}

class Tiny(BuildAction):
    def __init__(self, out, i, **kw):
        super().__init__(**kw)
        self.out, self.i = out, i
        out.deps.add(self)
    def _invoke(self):
        self.out.get_fs_path().write_text(f"{{SALT}} {{self.i}}\\n")
        with open(os.path.join("runs", f"{{SALT}}-{{self.i}}"), "a") as f:
            f.write("x")

@entrypoint
def tiny():
    ctx = BuildContext.current()
    outs = []
    for i in range(COUNT):
        out = ctx.allocate_file(f"t{{i}}.txt")
        Tiny(out, i, desc=f"tiny {{i}}", executor=ctx.executor)
        outs.append(out)
    return outs
"""


def project(root: Path, salt: str, count: int) -> Path:
    """A build module of ``count`` tiny actions in ``root``; its runs directory."""
    runs = root / "runs"
    runs.mkdir(parents=True, exist_ok=True)
    header = "from kiln import *\nfrom kiln.executor import BuildContext\n"
    (root / "build.py").write_text(header + MODULE.format(salt=salt, count=count))
    return runs


def kiln_at(root: Path, *args: str, cache: Path, timeout: float = 120) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "kiln", *args],
        cwd=root,
        env={**os.environ, "NO_COLOR": "1", "KILN_CACHE_DIR": str(cache)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def finished(proc: subprocess.Popen[str], timeout: float = 120) -> str:
    _, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    assert "Traceback" not in err, err
    return err


def test_builds_in_four_processes_write_one_index_at_once_without_damage(
    tmp_path: Path, _private_cache: Path
) -> None:
    cache, count = _private_cache, 300
    roots = [tmp_path / f"p{i % 2}" / f"copy{i}" for i in range(4)]  # two projects, twice
    for i, root in enumerate(roots):
        project(root, f"salt{i % 2}", count)
    procs = [kiln_at(root, "build", "build.py", "-j", "2", cache=cache) for root in roots]
    errors = [finished(p) for p in procs]
    warned = [line for e in errors for line in e.splitlines() if "warning" in line]
    assert warned == []
    db = sqlite3.connect(index_path(cache))
    assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    db.close()
    found = entries(cache)
    assert len(found) == 2 * count  # each project's entries once, whoever stored them
    assert all(CacheEntry.decode(name, data) is not None for name, data in found.items())
    assert not (cache / "v1" / "ac").exists()  # nothing fell back to entry files
    for root in roots[:2]:
        shutil.rmtree(root / "kiln-out")
        err = finished(kiln_at(root, "build", "build.py", cache=cache))
        assert f"0 built, {count} cached" in err, err


def _built_then_cached(root: Path, cache: Path, count: int) -> str:
    """A build that finds the index unusable: every action runs, and what it stores
    serves the next fresh output directory (entries kept as files). Its stderr."""
    shutil.rmtree(root / "kiln-out")
    err = finished(kiln_at(root, "build", "build.py", cache=cache))
    assert f"{count} built" in err, err
    expected = {f"genfiles/tiny/t{i}.txt": f"s {i}\n".encode() for i in range(count)}
    assert tree(root / "kiln-out") == expected
    shutil.rmtree(root / "kiln-out")
    again = finished(kiln_at(root, "build", "build.py", cache=cache))
    assert f"0 built, {count} cached" in again, again
    assert tree(root / "kiln-out") == expected
    return err


@pytest.mark.parametrize("damage", ["garbage", "truncated", "zeroed pages"])
def test_a_damaged_index_is_never_read_and_the_build_goes_on(
    damage: str, tmp_path: Path, _private_cache: Path
) -> None:
    cache, count = _private_cache, 40
    project(tmp_path, "s", count)
    finished(kiln_at(tmp_path, "build", "build.py", cache=cache))
    index = index_path(cache)
    data = index.read_bytes()
    if damage == "garbage":
        index.write_bytes(os.urandom(len(data)))
    elif damage == "truncated":
        index.write_bytes(data[: len(data) // 2])
    else:
        index.write_bytes(data[:4096] + bytes(len(data) - 4096))
    err = _built_then_cached(tmp_path, cache, count)
    assert "skipped the index" in err and "kiln keeps entries as files" in err, err
    # kiln cache clear removes a damaged index (kiln's by its place and kind).
    r = subprocess.run(
        [sys.executable, "-m", "kiln", "cache", "clear", "--cache-dir", str(cache)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0 and not index.exists(), r.stderr


def test_another_programs_database_at_the_index_is_left_as_it_is(
    tmp_path: Path, _private_cache: Path
) -> None:
    cache, count = _private_cache, 20
    project(tmp_path, "s", count)
    finished(kiln_at(tmp_path, "build", "build.py", cache=cache))
    index = index_path(cache)
    index.unlink()
    db = sqlite3.connect(index)
    db.execute("CREATE TABLE notes (body TEXT)")
    db.execute("INSERT INTO notes VALUES ('mine')")
    db.commit()
    db.close()
    before = index.read_bytes()
    err = _built_then_cached(tmp_path, cache, count)
    assert "not kiln's index" in err, err
    for args in (["stats"], ["gc", "--max-size", "0"], ["clear"]):
        r = subprocess.run(
            [sys.executable, "-m", "kiln", "cache", *args, "--cache-dir", str(cache)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert index.read_bytes() == before


def test_an_index_of_another_user_is_never_read(tmp_path: Path, _private_cache: Path) -> None:
    needs.root("giving a file to another user needs root")
    cache, count = _private_cache, 20
    project(tmp_path, "s", count)
    finished(kiln_at(tmp_path, "build", "build.py", cache=cache))
    index = index_path(cache)
    os.chown(index, 65534, 65534)
    before = index.read_bytes()
    err = _built_then_cached(tmp_path, cache, count)
    assert "belongs to user 65534" in err, err
    assert index.read_bytes() == before and index.stat().st_uid == 65534


def test_a_busy_index_holds_a_build_up_once_at_most(tmp_path: Path, _private_cache: Path) -> None:
    cache, count = _private_cache, 600
    project(tmp_path, "s", count)
    finished(kiln_at(tmp_path, "build", "build.py", cache=cache))
    shutil.rmtree(tmp_path / "kiln-out")
    for name in [*entries(cache)][: count // 2]:  # half of them must be stored again
        db = sqlite3.connect(index_path(cache))
        db.execute("DELETE FROM entries WHERE name = ?", (name,))
        db.commit()
        db.close()
    holder = sqlite3.connect(index_path(cache), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another program holds the write lock throughout
    try:
        started = time.monotonic()
        err = finished(kiln_at(tmp_path, "build", "build.py", cache=cache), timeout=60)
        took = time.monotonic() - started
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert f"{count // 2} built, {count // 2} cached" in err, err
    assert "busy for more than" in err, err
    assert took < 30, took  # one wait of the busy timeout, not one per batch
    shutil.rmtree(tmp_path / "kiln-out")
    again = finished(kiln_at(tmp_path, "build", "build.py", cache=cache))
    assert f"0 built, {count} cached" in again, again


def test_a_row_that_is_not_its_keys_entry_is_a_miss(tmp_path: Path, _private_cache: Path) -> None:
    cache, count = _private_cache, 2
    runs = project(tmp_path, "s", count)
    finished(kiln_at(tmp_path, "build", "build.py", cache=cache))
    (first, a), (second, b) = sorted(entries(cache).items())
    db = sqlite3.connect(index_path(cache))
    with db:  # each row now holds the other's entry: a foreign entry under each name
        db.execute("UPDATE entries SET data = ? WHERE name = ?", (b, first))
        db.execute("UPDATE entries SET data = ? WHERE name = ?", (a, second))
    db.close()
    assert json.loads(a)["key"] == first
    shutil.rmtree(tmp_path / "kiln-out")
    err = finished(kiln_at(tmp_path, "build", "build.py", cache=cache))
    assert f"{count} built" in err, err
    assert all(p.read_text() == "xx" for p in runs.iterdir())  # each ran again
    assert tree(tmp_path / "kiln-out") == {
        f"genfiles/tiny/t{i}.txt": f"s {i}\n".encode() for i in range(count)
    }


def test_eviction_walks_the_cache_only_when_it_may_be_over_its_bound(
    tmp_path: Path, _private_cache: Path
) -> None:
    """A build that stored entries walks the cache (and sweeps what killed writers left
    in ``tmp/``) only when the index's accounting says the cache may have outgrown its
    bound, or it never walked: not on every build."""
    cache = _private_cache
    project(tmp_path, "a", 10)
    finished(kiln_at(tmp_path, "build", "build.py", cache=cache))  # the first walk
    stale = cache / "v1" / "tmp" / "w-1-0123abcd-0"  # what a killed writer left, 2 h ago
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_bytes(b"partial")
    os.utime(stale, (time.time() - 7200, time.time() - 7200))
    project(tmp_path, "b", 10)  # new entries, well within the default bound: no walk
    finished(kiln_at(tmp_path, "build", "build.py", cache=cache))
    assert stale.exists()
    project(tmp_path, "c", 10)  # past a bound of 1 KiB: the walk evicts, and sweeps
    finished(kiln_at(tmp_path, "build", "build.py", "--cache-max-size", "1K", cache=cache))
    assert not stale.exists()
    db = sqlite3.connect(index_path(cache))
    used = sum(n for (n,) in db.execute("SELECT length(data) FROM entries"))
    meta = dict(db.execute("SELECT name, value FROM meta"))
    db.close()
    assert used <= 1024 and meta["added"] == 0 and meta["total"] <= 1024, meta


def test_rows_of_the_wrong_type_are_neither_counted_nor_a_crash(
    tmp_path: Path, _private_cache: Path
) -> None:
    """An index someone wrote into holds rows kiln never would (a text where a time
    goes, no data): `kiln cache stats` and `gc` skip them, with no traceback."""
    cache = _private_cache
    project(tmp_path, "w", 2)
    finished(kiln_at(tmp_path, "build", "build.py", cache=cache))
    first = sorted(entries(cache))[0]
    db = sqlite3.connect(index_path(cache))
    with db:
        db.execute("UPDATE entries SET used = 'yesterday' WHERE name = ?", (first,))
    db.close()
    for command in (["cache", "stats"], ["cache", "gc"]):
        finished(kiln_at(tmp_path, *command, cache=cache))


class _Rows(list[Any]):
    def fetchone(self) -> Any:
        return self[0] if self else None


def test_a_build_that_creates_the_index_meanwhile_is_seen_whole_or_not_at_all(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two builds open a new index at once; the second finishes creating it right
    after the first read which tables it has. The first sees the index whole or not
    at all (never its tables missing with its id set: "another program's database")."""
    import threading

    import kiln.cache.index as index_module
    from kiln.cache.index import CacheIndex

    monkeypatch.setattr(index_module, "BUSY_S", 30.0)  # the other build waits, never gives up
    path = str(tmp_path / "index.db")
    said: dict[str, list[str]] = {"first": [], "other": []}
    fired: list[threading.Thread] = []

    def other_build() -> None:
        index = CacheIndex(path, lambda place, why: said["other"].append(why))
        index.put("other", b"o")
        index.flush()

    class Hooked(sqlite3.Connection):
        def execute(self, sql: str, *args: Any) -> Any:  # type: ignore[override]
            rows = _Rows(super().execute(sql, *args).fetchall())
            if "sqlite_master" in sql and not fired:
                fired.append(threading.Thread(target=other_build))
                fired[0].start()
                fired[0].join(1.0)  # done unless the first's read holds it off
            return rows

    connect = sqlite3.connect
    first_connection = iter([True])

    def hooked_connect(*args: Any, **kw: Any) -> sqlite3.Connection:
        factory = Hooked if next(first_connection, False) else sqlite3.Connection
        return connect(*args, **kw, factory=factory)

    monkeypatch.setattr(index_module.sqlite3, "connect", hooked_connect)
    first = CacheIndex(path, lambda place, why: said["first"].append(why))
    first.put("first", b"f")
    first.flush()
    fired[0].join(30)
    assert not fired[0].is_alive()
    assert said == {"first": [], "other": []}
    db = sqlite3.connect(path)
    assert sorted(r[0] for r in db.execute("SELECT name FROM entries")) == ["first", "other"]
    db.close()


def _clear(cache: Path) -> str:
    r = subprocess.run(
        [sys.executable, "-m", "kiln", "cache", "clear", "--cache-dir", str(cache)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 0, r.stderr
    return r.stderr


@pytest.mark.parametrize("index", ["open", "not yet made"])
def test_a_build_using_the_cache_goes_on_using_it_after_kiln_cache_clear(
    tmp_path: Path, index: str
) -> None:
    """``kiln cache clear`` in another process while a build holds the cache (its
    directories seen, its index open or not yet made, so that ``v1/`` goes): what
    the build stores afterwards, blobs and entries, is stored and found by the next
    build, without a warning."""
    import hashlib

    from kiln.cache.local import LocalCache

    cache, said = tmp_path / "cache", []
    running = LocalCache(cache, said.append)
    blob = tmp_path / "blob"

    def store(content: bytes) -> str:
        blob.write_bytes(content)
        digest = hashlib.sha256(content).hexdigest()
        assert running.put_file(blob, digest)
        return digest

    def entry(name: str) -> tuple[str, bytes]:
        key = hashlib.sha256(name.encode()).hexdigest()
        return key, json.dumps({"key": key, "name": name}).encode()

    store(b"before" * 1000)
    if index == "open":
        key, data = entry("before")
        running.put_entry(key, data)
        running.index.flush()
    assert "removed" in _clear(cache)
    assert (cache / "v1").exists() == (index == "open")
    after = store(b"after" * 1000)  # its tmp/ and cas/ directories are gone
    key, data = entry("after")
    running.put_entry(key, data)
    running.index.flush()
    running.log_build({"hits": 0})
    running.close()
    assert said == []
    later = LocalCache(cache, said.append)
    assert later.has_blob(after)
    assert later.get_entry(key) == data
    assert later.get_entry(entry("before")[0]) is None  # cleared
    assert said == []


def test_kiln_cache_clear_leaves_the_temporary_a_build_is_writing(tmp_path: Path) -> None:
    from kiln.cache.local import LocalCache

    cache = tmp_path / "cache"
    running = LocalCache(cache)
    fd, name = running.dir.new_tmp("w-")
    try:
        old_fd, old = running.dir.new_tmp("w-")
        os.close(old_fd)
        os.utime(old, (time.time() - 3600, time.time() - 3600))  # a killed build's
        _clear(cache)
        assert os.path.exists(name) and not os.path.exists(old)
    finally:
        os.close(fd)
