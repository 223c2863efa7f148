"""An output directory's ``.kiln/`` without kiln's marker (docs/reliability.md,
"Unmarked state folders"): kiln adopts it only when it is kiln's own, what a claim
killed before its marker leaves or a kiln from before the marker made (a kiln
state database), never because one of its names is one kiln gives. Another
program's ``.kiln/`` is refused, exit 2, nothing created, changed or removed, by
every command (``kiln clean`` above all). Through the CLI, on real files."""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.in_process

Kiln = Callable[..., Any]

MODULE = """
@entrypoint
def ep():
    return run_command(name="x.txt", command=["sh", "-c", "echo fresh > {out}"])
"""
TMP = ".kiln-tmp-0123456789-abcdef01"  # the form of kiln's temporaries


@pytest.fixture
def project(tmp_path: Path, write_module: Callable[..., Path]) -> Path:
    write_module(MODULE)
    return tmp_path


@pytest.fixture
def kiln_db(tmp_path: Path, kiln: Kiln, project: Path) -> Path:
    """A kiln state database, as a build leaves it."""
    r = kiln("build", "build.py", "--output-dir", "made", "--no-cache")
    assert r.returncode == 0, r.stderr
    db = tmp_path / "kiln-state.db"
    shutil.copy(tmp_path / "made" / ".kiln" / "state.db", db)
    shutil.rmtree(tmp_path / "made")
    return db


def _foreign_db(path: Path, app: str | None) -> None:
    """Another program's SQLite database (with a ``meta`` table when ``app``)."""
    db = sqlite3.connect(path)
    if app is None:
        db.execute("CREATE TABLE jobs(id INTEGER PRIMARY KEY, state TEXT)")
        db.execute("INSERT INTO jobs VALUES (1, 'queued')")
    else:
        db.execute("CREATE TABLE meta(name TEXT PRIMARY KEY, value TEXT NOT NULL)")
        db.execute("INSERT INTO meta VALUES ('app', ?)", (app,))
    db.commit()
    db.close()


def _snapshot(root: Path) -> dict[str, object]:
    """Every path under ``root`` with what it holds (links and FIFOs not opened)."""
    found: dict[str, object] = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top, name)
            st = path.lstat()
            key = str(path.relative_to(root))
            if path.is_symlink():
                found[key] = ("link", os.readlink(path))
            elif path.is_file():
                found[key] = (path.read_bytes(), st.st_mtime_ns)
            else:
                found[key] = (st.st_mode, st.st_mtime_ns)
    return found


def _foreign(kind: str, kiln_dir: Path, kiln_db: Path) -> None:
    """Another program's ``.kiln/``, each holding a name or more of kiln's."""
    kiln_dir.mkdir(parents=True)
    if kind == "only a foreign state.db":
        _foreign_db(kiln_dir / "state.db", app=None)
    elif kind == "only another app's state.db":
        _foreign_db(kiln_dir / "state.db", app="pottery")
    elif kind == "only a state.db that is not SQLite":
        (kiln_dir / "state.db").write_text("key = value\n")
    elif kind == "only lock":
        (kiln_dir / "lock").write_text("1234\n")
    elif kind == "only logs":
        (kiln_dir / "logs").mkdir()
        (kiln_dir / "logs" / "today.log").write_text("a log of mine\n")
    elif kind == "kiln's state.db beside a file of mine":
        shutil.copy(kiln_db, kiln_dir / "state.db")
        (kiln_dir / "config.toml").write_text("[tool]\n")
    elif kind == "lock, logs and tmp beside a file of mine":
        for name in ("logs", "tmp"):
            (kiln_dir / name).mkdir()
        (kiln_dir / "lock").write_text("")
        (kiln_dir / "settings.json").write_text("{}\n")
    elif kind == "a temporary's prefix":
        (kiln_dir / f"{TMP} notes").write_text("mine\n")
    elif kind == "a damaged copy's prefix":
        shutil.copy(kiln_db, kiln_dir / "state.db")
        (kiln_dir / "state.db.corrupt-my-backup").write_text("mine\n")
    elif kind == "user-files that are not kiln's list":
        (kiln_dir / "user-files").write_text("my list of users\n")
    elif kind == "state.db a link to kiln's":
        (kiln_dir / "state.db").symlink_to(kiln_db)
    elif kind == "state.db a FIFO":
        os.mkfifo(kiln_dir / "state.db")
    else:
        raise AssertionError(kind)


FOREIGN = [
    "only a foreign state.db",
    "only another app's state.db",
    "only a state.db that is not SQLite",
    "only lock",
    "only logs",
    "kiln's state.db beside a file of mine",
    "lock, logs and tmp beside a file of mine",
    "a temporary's prefix",
    "a damaged copy's prefix",
    "user-files that are not kiln's list",
    "state.db a link to kiln's",
    "state.db a FIFO",
]


@pytest.mark.parametrize("kind", FOREIGN)
def test_an_unmarked_kiln_folder_is_refused_when_it_is_not_kilns(
    kind: str, tmp_path: Path, project: Path, kiln_db: Path, kiln: Kiln
) -> None:
    out = tmp_path / "out"
    _foreign(kind, out / ".kiln", kiln_db)
    (out / "genfiles" / "ep").mkdir(parents=True)
    (out / "genfiles" / "ep" / "x.txt").write_text("the other program's output\n")
    before = _snapshot(out)
    started = time.monotonic()
    for argv in (
        ["build", "build.py", "--no-cache"],
        ["build", "build.py", "--dry-run"],
        ["explain", "build.py"],
        ["clean"],
    ):
        r = kiln(*argv, "--output-dir", "out", timeout=60)
        assert r.returncode == 2, (argv, r.stderr)
        assert f"refusing to use {out} as the output directory" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr, r.stderr
        assert _snapshot(out) == before, argv
    assert time.monotonic() - started < 50  # a FIFO is never opened to wait on


@pytest.mark.parametrize(
    "left", ["nothing", "a temporary", "the user's files", "the user's files, a temporary"]
)
def test_a_claim_killed_before_its_marker_is_taken_up(
    left: str, tmp_path: Path, project: Path, kiln: Kiln
) -> None:
    """What a claim leaves when killed before it wrote the marker: ``.kiln/`` empty,
    the marker's temporary, and for a directory the user filled first, the list of
    the user's files (written before the marker)."""
    out = tmp_path / "out"
    (out / ".kiln").mkdir(parents=True)
    if "temporary" in left:
        (out / ".kiln" / TMP).write_text("kiln-out")
    if "user's files" in left:
        (out / "params").mkdir()
        (out / "params" / "w.bin").write_text("weights\n")
        (out / ".kiln" / "user-files").write_text(json.dumps(["params/w.bin"]))
    r = kiln("build", "build.py", "--output-dir", "out", "--no-cache")
    assert r.returncode == 0, r.stderr
    assert (out / ".kiln" / "format").read_text() == "kiln-output/1\n"
    assert (out / "genfiles" / "ep" / "x.txt").read_text() == "fresh\n"
    if "user's files" in left:
        r = kiln("clean", "--output-dir", "out")
        assert r.returncode == 0, r.stderr
        assert (out / "params" / "w.bin").read_text() == "weights\n"


def test_a_kiln_from_before_the_marker_is_taken_up(
    tmp_path: Path, project: Path, kiln: Kiln
) -> None:
    """A ``.kiln/`` of kiln's names alone whose state database is kiln's (the
    marker gone, as a kiln before it left the folder): adopted, its state used."""
    out = tmp_path / "out"
    r = kiln("build", "build.py", "--output-dir", "out", "--no-cache")
    assert r.returncode == 0, r.stderr
    for name in os.listdir(out / ".kiln"):  # what a kiln before the marker had not
        if name not in ("lock", "state.db", "tmp", "logs"):
            shutil.rmtree(out / ".kiln" / name, ignore_errors=True)
            (out / ".kiln" / name).unlink(missing_ok=True)
    (out / ".kiln" / "state.db.corrupt-20260101-120000").write_text("damaged\n")
    r = kiln("build", "build.py", "--output-dir", "out", "--no-cache")
    assert r.returncode == 0, r.stderr
    assert "0 built" in r.stderr, r.stderr  # its state was read: nothing ran again
    assert (out / ".kiln" / "format").read_text() == "kiln-output/1\n"
