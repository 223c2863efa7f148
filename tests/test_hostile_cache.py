"""The cache directory as a trust boundary (docs/reliability.md, "Trust model",
"Every surface is a boundary"): kiln uses a directory as its cache only when it is
kiln's, deletes only its own entries there, follows no link and opens nothing but
regular files in it, and serves outputs with its own modes. Through the CLI, on
real files, links, FIFOs and devices; run as root in CI."""

from __future__ import annotations

import io
import json
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import needs
import pytest
from cache_build import (
    index_path,
    module_text,
    rewrite_entries,
    runs,
    to_entry_files,
    tree,
    write_tool,
)

Kiln = Callable[..., Any]


pytestmark = pytest.mark.in_process  # the tests where a hang could hide take kiln_subprocess


@pytest.fixture
def project(tmp_path: Path, write_module: Callable[..., Path]) -> Path:
    """Two models (``m.bin`` of 3,000 bytes: a blob; ``m.sum`` of 64: kept inline)."""
    tool = write_tool(tmp_path)
    write_module(module_text(tool, tmp_path / "counter", ["m1", "m2"]))
    return tmp_path / "counter"


def build(kiln: Kiln, out: str, cache: str = "cache", *args: str, ok: bool = True) -> Any:
    r = kiln("build", "build.py", "--output-dir", out, "--cache-dir", cache, *args, timeout=60)
    if ok:
        assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr, r.stderr
    return r


def snapshot(root: Path) -> dict[str, object]:
    """Every path under ``root`` (links not followed) with what it is and holds."""
    found: dict[str, object] = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            path = Path(top, name)
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                found[str(path.relative_to(root))] = ("link", os.readlink(path))
            elif stat.S_ISREG(st.st_mode):
                found[str(path.relative_to(root))] = path.read_bytes()
            else:
                found[str(path.relative_to(root))] = stat.S_IFMT(st.st_mode)
    return found


def victim(tmp_path: Path) -> Path:
    """A user's directory that a planted link points at; it must never change."""
    home = tmp_path / "victim"
    (home / "docs").mkdir(parents=True)
    (home / "docs" / "thesis.txt").write_text("years of work\n")
    (home / ".bashrc").write_text("export PATH=/usr/bin\n")
    return home


# -- ownership ----------------------------------------------------------------------


def test_a_directory_that_is_not_a_kiln_cache_is_refused(
    tmp_path: Path, project: Path, kiln: Kiln
) -> None:
    p = tmp_path / "p"
    (p / "v1" / "api").mkdir(parents=True)
    (p / "v1" / "api" / "s.json").write_text('{"user": "data"}')
    digest = "ab" + "0" * 62
    (p / "v1" / "cas" / "ab").mkdir(parents=True)
    (p / "v1" / "cas" / "ab" / digest).write_text("a user's file with a digest's name")
    before = snapshot(p)
    for args in (
        ["cache", "clear", "--cache-dir", "p"],
        ["cache", "gc", "--max-size", "0", "--cache-dir", "p"],
        ["cache", "stats", "--cache-dir", "p"],
        ["build", "build.py", "--cache-dir", "p"],
        ["explain", "build.py", "--cache-dir", "p"],
        ["build", "build.py", "--dry-run", "--cache-dir", "p"],
    ):
        r = kiln(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert f"refusing to use {p} as the cache" in r.stderr, r.stderr
        assert "--cache-dir" in r.stderr and "Traceback" not in r.stderr
    r = kiln("build", "build.py", env={"KILN_CACHE_DIR": str(p)})
    assert r.returncode == 2 and "KILN_CACHE_DIR" in r.stderr, r.stderr
    assert snapshot(p) == before
    assert not (tmp_path / "kiln-out").exists()  # refused before anything was made
    assert runs(project) == []


@pytest.mark.parametrize(
    ("held", "ours"),
    [
        (".kiln-tmp-0123456789-abcdef01", True),  # a claim killed before its marker
        (".kiln-tmp-0123456789-abcdef01 notes", False),
        (".kiln-tmp-mine", False),
        ("format.bak", False),
    ],
)
def test_a_marker_folder_without_its_marker_is_kilns_only_when_a_claim_left_it(
    held: str, ours: bool, tmp_path: Path, project: Path, kiln: Kiln
) -> None:
    (tmp_path / "c" / ".kiln").mkdir(parents=True)
    (tmp_path / "c" / ".kiln" / held).write_text("kiln-cache/1\n")
    before = snapshot(tmp_path / "c")
    r = kiln("build", "build.py", "--cache-dir", "c", timeout=60)
    if ours:
        assert r.returncode == 0, r.stderr
        assert (tmp_path / "c" / ".kiln" / "format").read_text() == "kiln-cache/1\n"
    else:
        assert r.returncode == 2 and f"refusing to use {tmp_path / 'c'} as the cache" in r.stderr
        assert snapshot(tmp_path / "c") == before


# (--cache-dir, --output-dir, how the two overlap); "link" is a link to kiln-out.
OVERLAPS = [
    ("kiln-out", "kiln-out", "are the same directory"),
    ("kiln-out/cache", "kiln-out", "the cache is inside the output directory"),
    ("kiln-out/genfiles/cache", "kiln-out", "the cache is inside the output directory"),
    ("c", "c/out", "the output directory is inside the cache"),
    (".", "kiln-out", "the output directory is inside the cache"),
    ("link", "kiln-out", "are the same directory"),
    ("link/cache", "kiln-out", "the cache is inside the output directory"),
    ("kiln-out/../kiln-out/cache", "sub/../kiln-out", "the cache is inside the output directory"),
    ("env:kiln-out/cache", "kiln-out", "the cache is inside the output directory"),
]


@pytest.mark.parametrize(("cache", "out", "how"), OVERLAPS)
def test_the_cache_and_the_output_directory_never_overlap(
    tmp_path: Path, project: Path, kiln: Kiln, cache: str, out: str, how: str
) -> None:
    """Refused as a usage error naming both, on every build: the first, the next
    ones, after ``kiln clean``; decided by the paths, not by what either holds."""
    (tmp_path / "link").symlink_to("kiln-out")
    (tmp_path / "sub").mkdir()
    env = {"KILN_CACHE_DIR": str(tmp_path / cache[4:])} if cache.startswith("env:") else None
    args = [] if env else ["--cache-dir", cache]

    def refused() -> None:
        r = kiln("build", "build.py", "--output-dir", out, *args, env=env, timeout=60)
        assert r.returncode == 2, r.stderr
        assert how in r.stderr and "Traceback" not in r.stderr, r.stderr
        shown = cache[4:] if env else cache
        assert f"cache directory {tmp_path / shown} " in r.stderr, r.stderr
        assert f"output directory {tmp_path / out} " in r.stderr, r.stderr

    refused()
    assert not (tmp_path / "kiln-out").exists() and runs(project) == []
    refused()
    # The same output directory, built with a cache elsewhere, then cleaned.
    build(kiln, out, "elsewhere")
    refused()
    assert kiln("clean", "--output-dir", out).returncode == 0
    refused()
    explained = kiln("explain", "build.py", "--output-dir", out, *args, env=env)
    assert explained.returncode == 2 and how in explained.stderr, explained.stderr
    assert len(runs(project)) == 4


def test_the_cache_is_marked_and_an_older_kilns_cache_is_adopted(
    tmp_path: Path, project: Path, kiln: Kiln
) -> None:
    build(kiln, "o1", "fresh")
    assert (tmp_path / "fresh/.kiln/format").read_text() == "kiln-cache/1\n"
    (tmp_path / "empty").mkdir()
    build(kiln, "o2", "empty")
    assert (tmp_path / "empty/.kiln/format").is_file()
    # A cache made before the marker (and before the index): v1/ with kiln's names
    # alone, each entry a file; its entries are read.
    assert len(to_entry_files(tmp_path / "fresh")) == 4
    shutil.rmtree(tmp_path / "fresh/.kiln")
    r = build(kiln, "o3", "fresh")
    assert "0 built, 4 cached" in r.stderr, r.stderr
    assert (tmp_path / "fresh/.kiln/format").is_file()
    # An output directory is kiln's, but not a cache; a newer format is not this kiln's.
    r = build(kiln, "o4", "o1", ok=False)
    assert r.returncode == 2 and "not kiln-cache" in r.stderr, r.stderr
    (tmp_path / "fresh/.kiln/format").write_text("kiln-cache/9\n")
    r = build(kiln, "o5", "fresh", ok=False)
    assert r.returncode == 2 and "newer kiln" in r.stderr, r.stderr


def test_gc_and_clear_remove_only_kilns_own_entries(
    tmp_path: Path, project: Path, kiln: Kiln
) -> None:
    build(kiln, "o1")
    cache = tmp_path / "cache"
    to_entry_files(cache)  # as an older kiln left them: evicted and cleared as well
    cas, ac = cache / "v1" / "cas", cache / "v1" / "ac"
    sub = next(p for p in cas.iterdir())
    foreign = {
        sub / ("ff" + "1" * 62): "a digest's name in the wrong directory",
        sub / "notes.txt": "not a digest",
        ac / "README": "a file where a directory goes",
        cache / "v1" / "mine" / "keep.txt": "outside kiln's layout",
        cache / "v1" / "tmp" / "user.txt": "not one of kiln's temporaries",
        next(ac.iterdir()) / "Notes.txt": "an entry's form, the wrong directory",
    }
    for path, text in foreign.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    r = kiln("cache", "gc", "--max-size", "0", "--cache-dir", "cache")
    assert r.returncode == 0 and "removed 6 file(s)" in r.stderr, r.stderr
    for path, text in foreign.items():
        assert path.read_text() == text
        assert f"skipped {path}" in r.stderr or path.parent.name == "mine", r.stderr
    build(kiln, "o2")
    r = kiln("cache", "clear", "--cache-dir", "cache")
    assert r.returncode == 0 and "(7 file(s) removed)" in r.stderr, r.stderr  # 6 + builds.log
    assert all(path.read_text() == text for path, text in foreign.items())
    assert (cache / ".kiln/format").is_file()
    stats = kiln("cache", "stats", "--cache-dir", "cache")
    assert "entries: 0" in stats.stdout and "blobs: 0" in stats.stdout


def _near_misses(cache: Path) -> tuple[dict[Path, str], list[Path]]:
    """Files and empty directories a user put among kiln's, each named as kiln's
    names begin (a shard's two characters, a digest one character short or long,
    a temporary's ``w-``) but not as kiln names anything; dated two days back, so
    that no age spares them."""
    v1 = cache / "v1"
    digest = next(p for p in (v1 / "cas").rglob("*") if p.is_file()).name
    name = next(p for p in (v1 / "ac").rglob("*") if p.is_file()).name
    cas, ac, tmp = v1 / "cas" / digest[:2], v1 / "ac" / name[:2], v1 / "tmp"
    files = {
        cas / (digest[:2] + "notes.txt"): "a shard's prefix",
        cas / (digest + "0"): "a digest and one more character",
        cas / digest[:-1]: "a digest one character short",
        cas / (digest[:2] + "g" * 62): "64 characters, not hex",
        cas / (digest[:2] + digest[2:].upper()): "hex in capitals",
        cas / (digest + ".bak"): "a digest and an extension",
        cas / (digest + "\n"): "a digest and a newline",
        ac / (name + "~"): "an entry's backup",
        ac / (name + " copy"): "an entry's copy",
        ac / (name[:2] + "x" * 127): "longer than any entry name",
        tmp / "w-notes.txt": "a temporary's prefix",
        tmp / "tmp-something": "a temporary's look",
        tmp / "b-1-deadbeef-1.part": "a temporary and an extension",
        tmp / "w-1-deadbeef-1 copy": "a temporary's copy",
        tmp / "w-1-DEADBEEF-1": "a tag in capitals",
        tmp / "w-1-deadbeef": "no serial",
        tmp / "w-1-deadbeef-1\n": "a temporary and a newline",
        v1 / "cas" / "ab": "a file named as a shard, where a shard's directory goes",
    }
    dirs = [v1 / "cas" / "mine", v1 / "cas" / "abc", v1 / "ac" / "notes", v1 / "cas" / "a"]
    old = time.time() - 2 * 86400
    for path, text in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        os.utime(path, (old, old))
    for path in dirs:
        path.mkdir(exist_ok=True)
    return files, dirs


@pytest.mark.parametrize("command", ["gc", "clear"])
def test_gc_and_clear_remove_only_whole_kiln_names(
    command: str, tmp_path: Path, project: Path, kiln: Kiln
) -> None:
    """Not a prefix, not a pattern's start: kiln removes a file in its cache only when
    the whole name is one kiln gives (a full lowercase SHA-256 in its shard, an entry
    name in its shard, a temporary of kiln's exact form), and a directory only when
    it is a shard kiln made, empty."""
    build(kiln, "o1")
    cache = tmp_path / "cache"
    to_entry_files(cache)
    files, dirs = _near_misses(cache)
    args = ["gc", "--max-size", "0"] if command == "gc" else ["clear"]
    r = kiln("cache", *args, "--cache-dir", "cache")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert "removed 6 file(s)" in r.stderr or "(7 file(s) removed)" in r.stderr, r.stderr
    for path, text in files.items():
        assert path.read_text() == text, path
        assert f"skipped {path}" in r.stderr, (path, r.stderr)
    assert all(path.is_dir() for path in dirs)
    stats = kiln("cache", "stats", "--cache-dir", "cache")
    assert "entries: 0" in stats.stdout and "blobs: 0" in stats.stdout


# -- confinement: links -------------------------------------------------------------


def _plant_links(cache: Path, place: str, home: Path) -> list[Path]:
    """Replace ``place`` of the cache's layout by links into ``home``; the links."""
    v1 = cache / "v1"
    if place.startswith("v1/ac"):
        to_entry_files(cache)  # entries as an older kiln kept them
    if place.startswith("v1/index.db"):
        (v1 / place[3:]).unlink(missing_ok=True)
        (v1 / place[3:]).symlink_to(home / ".bashrc")
        return [v1 / place[3:]]
    if place in ("v1", "v1/cas", "v1/ac", "v1/tmp"):
        real = cache / place
        real.rename(real.with_name(real.name + "-real"))
        real.symlink_to(home)
        return [real]
    if place == "v1/builds.log":
        (v1 / "builds.log").unlink()
        (v1 / "builds.log").symlink_to(home / ".bashrc")
        return [v1 / "builds.log"]
    if place in ("v1/cas/XX", "v1/ac/XX"):
        links = []
        for sub in list((cache / place[:-3]).iterdir()):
            shutil.rmtree(sub)
            (home / sub.name).mkdir(exist_ok=True)
            sub.symlink_to(home / sub.name)
            links.append(sub)
        return links
    assert place == "blob"
    links = []
    for sub in (v1 / "cas").iterdir():
        for f in sub.iterdir():
            f.unlink()
            f.symlink_to(home / "docs" / "thesis.txt")
            links.append(f)
    return links


@pytest.mark.parametrize(
    "place",
    [
        "v1",
        "v1/cas",
        "v1/ac",
        "v1/tmp",
        "v1/builds.log",
        "v1/cas/XX",
        "v1/ac/XX",
        "blob",
        "v1/index.db",
        "v1/index.db-wal",
        "v1/index.db-shm",
    ],
)
def test_no_write_or_delete_in_the_cache_follows_a_link(
    place: str,
    tmp_path: Path,
    project: Path,
    kiln_subprocess: Kiln,
    write_module: Callable[..., Path],
) -> None:
    kiln = kiln_subprocess
    build(kiln, "o1")
    expected = tree(tmp_path / "o1")
    home = victim(tmp_path)
    links = _plant_links(tmp_path / "cache", place, home)
    before = snapshot(home)
    # A build that reads, stores (m3 is new) and evicts (the bound forces a gc), then
    # every cache command.
    write_module(module_text(tmp_path / "tool.py", project, ["m1", "m2", "m3"]))
    r = build(kiln, "o2", "cache", "--cache-max-size", "1K")
    built = tree(tmp_path / "o2")
    assert {k: built[k] for k in expected} == expected
    assert "skipped" in r.stderr and "symbolic link" in r.stderr, r.stderr
    for args in (["stats"], ["gc", "--max-size", "0"], ["clear"]):
        c = kiln("cache", *args, "--cache-dir", "cache", timeout=60)
        assert c.returncode == 0 and "Traceback" not in c.stderr, c.stderr
    assert snapshot(home) == before, place  # nothing written, nothing deleted there
    assert all(link.is_symlink() or place == "blob" for link in links)


# -- confinement: what is not a regular file ----------------------------------------


def _blob_paths(cache: Path) -> list[Path]:
    return [f for sub in (cache / "v1" / "cas").iterdir() for f in sub.iterdir()]


def _entry_paths(cache: Path) -> list[Path]:
    """The entries, as files of the layout an older kiln kept."""
    return to_entry_files(cache)


def _make(kind: str, path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        os.mknod(path, stat.S_IFCHR | 0o600, os.makedev(1, 3))  # /dev/null's numbers
    elif kind == "file":
        path.write_text("a file where kiln keeps a directory")
    else:
        path.mkdir()
        (path / "inside.txt").write_text("a user's file")


@pytest.mark.parametrize(
    "kind, place",
    [
        ("fifo", "builds.log"),
        ("fifo", "blob"),
        ("fifo", "entry"),
        ("device", "blob"),
        ("device", "builds.log"),
        ("file", "blob dir"),
        ("dir", "blob"),
        ("dir", "entry"),
        ("fifo", "tmp"),
        ("fifo", "index"),
        ("device", "index"),
        ("dir", "index"),
    ],
)
def test_what_is_not_a_regular_file_is_skipped_never_opened(
    kind: str, place: str, tmp_path: Path, project: Path, kiln_subprocess: Kiln
) -> None:
    kiln = kiln_subprocess
    if kind == "device":
        needs.root("making a device node needs root")
    cache = tmp_path / "cache"
    build(kiln, "o1")
    expected = tree(tmp_path / "o1")
    targets = {
        "builds.log": lambda: [cache / "v1" / "builds.log"],
        "blob": lambda: _blob_paths(cache),
        "entry": lambda: _entry_paths(cache),
        "index": lambda: [index_path(cache)],
        "blob dir": lambda: list((cache / "v1" / "cas").iterdir()),
        "tmp": lambda: [cache / "v1" / "tmp"],
    }[place]()
    for path in targets:
        _make(kind, path)
    started = time.monotonic()
    r = build(kiln, "o2", "cache", "--cache-max-size", "1K")
    assert tree(tmp_path / "o2") == expected
    for args in (["stats"], ["gc", "--max-size", "0"], ["clear"]):
        c = kiln("cache", *args, "--cache-dir", "cache", timeout=60)
        assert c.returncode == 0 and "Traceback" not in c.stderr, c.stderr
    assert time.monotonic() - started < 50  # never a hang on a FIFO or a device
    if kind in ("fifo", "device") and place in ("builds.log", "tmp", "index"):
        assert all(not p.is_file() for p in targets)  # left as they were, reported
        assert "skipped" in r.stderr + c.stderr
    if kind == "dir":
        assert all((p / "inside.txt").read_text() == "a user's file" for p in targets)


# -- while a build runs; a read-only cache ------------------------------------------

SLOW = """
import sys
@entrypoint
def slow():
    code = ("import time, sys; time.sleep(0.05); "
            "open(sys.argv[1], 'wb').write(bytes(5000) + sys.argv[2].encode())")
    return [run_command(name=f"s{i}.bin", command=[sys.executable, "-c", code, "{out}", str(i)])
            for i in range(64)]
"""


def test_cache_clear_during_a_build_ends_both_cleanly(
    tmp_path: Path, write_module: Callable[..., Path]
) -> None:
    from kiln.cli.main import run_cli

    write_module(SLOW)
    cache = tmp_path / "cache"
    proc = subprocess.Popen(
        [sys.executable, "-m", "kiln", "build", "build.py", "-j", "8", "--cache-dir", "cache"],
        cwd=tmp_path,
        env={**os.environ, "NO_COLOR": "1"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    clears = 0
    while proc.poll() is None:  # as fast as it goes: into every moment of the build
        err = io.StringIO()
        code = run_cli(
            ["cache", "clear", "--cache-dir", str(cache)], stdout=io.StringIO(), stderr=err
        )
        assert code == 0 and "Traceback" not in err.getvalue(), err.getvalue()
        clears += 1
    out, err_text = proc.communicate(timeout=60)
    assert proc.returncode == 0 and "Traceback" not in err_text, err_text
    assert len(out.split()) == 64 and clears > 1


def test_a_claim_completing_while_the_cache_is_looked_at_is_seen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The moment ``kiln cache clear`` (or another build) finds ``.kiln`` but not yet
    its marker, and the claiming build then writes it: the directory is kiln's,
    never refused as another program's (exit 2 once in CI, racing a build)."""
    from kiln.cache import claim
    from kiln.output_dir import ownership

    root = tmp_path / "cache"
    claim.claim_cache_dir(root)
    real = ownership.read_regular
    looks: list[Path] = []

    def marker_not_yet_there(path: Path, limit: int) -> bytes:
        looks.append(path)
        if len(looks) == 1:  # the first look comes before the claim's rename
            raise FileNotFoundError(path)
        return real(path, limit=limit)

    monkeypatch.setattr(ownership, "read_regular", marker_not_yet_there)
    assert claim.cache_dir_state(root) == "kiln"
    assert len(looks) == 2


@pytest.fixture
def read_only_cache(tmp_path: Path) -> Iterator[Path]:
    """A tmpfs mounted at ``cache`` (root only; CI runs as root), remounted read-only
    by the test."""
    mnt = tmp_path / "cache"
    mnt.mkdir()
    r = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True, text=True
    )
    if r.returncode != 0:
        needs.missing(f"cannot mount a tmpfs (needs root): {r.stderr.strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_gc_and_clear_on_a_read_only_cache_are_messages(
    tmp_path: Path, project: Path, kiln: Kiln, read_only_cache: Path
) -> None:
    build(kiln, "o1")
    subprocess.run(["mount", "-o", "remount,ro", str(read_only_cache)], check=True)
    before = snapshot(read_only_cache)
    for args in (["gc", "--max-size", "0"], ["clear"]):
        r = kiln("cache", *args, "--cache-dir", "cache")
        assert r.returncode == 1 and "Read-only file system" in r.stderr, r.stderr
        assert "Traceback" not in r.stderr
    assert "entries: 4" in kiln("cache", "stats", "--cache-dir", "cache").stdout
    r = build(kiln, "o2")  # served from the read-only cache
    assert "0 built, 4 cached" in r.stderr, r.stderr
    assert snapshot(read_only_cache) == before


# -- served modes -------------------------------------------------------------------

MODES = """
import os
from kiln.executor import BuildAction

class Tool(BuildAction):
    def __init__(self, out, mode, **kw):
        super().__init__(**kw)
        self.out, self.mode = out, mode
        out.deps.add(self)
    def _invoke(self):
        path = self.out.get_fs_path()
        path.write_text("#!/bin/sh\\necho " + "x" * {size} + "\\n")
        os.chmod(path, self.mode)

@entrypoint
def tools():
    ctx = BuildContext.current()
    outs = []
    for name, mode in (("run.sh", 0o750), ("data.txt", 0o640)):
        out = ctx.allocate_file(name)
        Tool(out, mode, desc=f"Making {{name}}", executor=ctx.executor)
        outs.append(out)
    return outs
"""


def _modes_changed(entry: bytes, mode_of: Callable[[int], int]) -> bytes:
    data = json.loads(entry)
    for out in data["outputs"]:
        out["mode"] = mode_of(out["mode"])
    return json.dumps(data).encode()


def _tamper_modes(entries: list[Path], mode_of: Callable[[int], int]) -> None:
    for path in entries:
        path.chmod(0o644)
        path.write_bytes(_modes_changed(path.read_bytes(), mode_of))


@pytest.mark.parametrize("size", [10, 5000])  # kept in the entry; a blob
def test_served_outputs_get_kilns_modes_whatever_the_entry_says(
    size: int, tmp_path: Path, write_module: Callable[..., Path], kiln: Kiln
) -> None:
    write_module(MODES.format(size=size))
    build(kiln, "o1")
    changed = rewrite_entries(
        tmp_path / "cache",
        lambda e: _modes_changed(e, lambda m: m | 0o7777 if m & 0o100 else 0o6666),
    )
    assert changed == 2
    build(kiln, "o2")
    umask = os.umask(0o022)
    os.umask(umask)
    served = tmp_path / "o2" / "genfiles" / "tools"
    assert stat.S_IMODE((served / "run.sh").stat().st_mode) == (0o755 & ~umask) | 0o700
    assert stat.S_IMODE((served / "data.txt").stat().st_mode) == (0o644 & ~umask) | 0o600
    assert (served / "run.sh").read_text().startswith("#!/bin/sh")


def test_outputs_served_from_the_remote_get_kilns_modes(
    tmp_path: Path, write_module: Callable[..., Path], kiln: Kiln, nginx_cache: Any
) -> None:
    write_module(MODES.format(size=5000))
    build(kiln, "o1", "a", "--remote-cache", nginx_cache.url)
    _tamper_modes(nginx_cache.files("ac"), lambda m: 0o6777)
    r = build(kiln, "o2", "b", "--remote-cache", nginx_cache.url)
    assert "0 built, 2 cached" in r.stderr, r.stderr
    served = tmp_path / "o2" / "genfiles" / "tools"
    for name in ("run.sh", "data.txt"):
        mode = stat.S_IMODE((served / name).stat().st_mode)
        assert not mode & (stat.S_ISUID | stat.S_ISGID | stat.S_ISVTX | 0o022), oct(mode)
        assert mode & 0o700 == 0o700  # the entry says executable: kept, for the owner
