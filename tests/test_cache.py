"""The local shared cache, through the CLI: hits into fresh output directories,
damaged blobs, concurrent builds, eviction, ``kiln cache``, and what is never cached."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cache_build import blob, entries, module_text, rewrite_entries, runs, tree, write_tool
from httpserver import HTTPTestServer
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.cache.entry import INLINE_MAX

pytestmark = pytest.mark.in_process


@pytest.fixture
def cache(_private_cache: Path) -> Path:
    return _private_cache


@pytest.fixture
def project(tmp_path: Path, write_module: Callable[..., Path]) -> Callable[..., Path]:
    def make(names: list[str], size: int = 3000) -> Path:
        tool = write_tool(tmp_path)
        return write_module(module_text(tool, tmp_path / "counter", names, size))

    return make


def build(kiln: Callable[..., Any], out: str, *args: str, ok: bool = True) -> Any:
    r = kiln("build", "build.py", "--output-dir", out, *args)
    if ok:
        assert r.returncode == 0, r.stderr
    return r


def test_a_fresh_output_dir_is_served_from_the_cache_byte_for_byte(
    tmp_path: Path, cache: Path, project: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    project(["m1", "m2"])
    first = build(kiln, "o1")
    assert sorted(runs(tmp_path / "counter")) == ["m1", "m1-sum", "m2", "m2-sum"]
    assert "4 built" in first.stderr
    second = build(kiln, "o2")
    assert len(runs(tmp_path / "counter")) == 4, second.stderr  # nothing ran
    assert "kiln: done: 0 built, 4 cached, 0 up to date" in second.stderr
    assert second.stderr.count("] cached: Running") == 4
    first_tree = tree(tmp_path / "o1")
    assert tree(tmp_path / "o2") == first_tree and len(first_tree) == 4
    served = tmp_path / "o2/bin/m1/m1.bin"
    assert served.stat().st_nlink == 1  # a copy, never a hard link into the cache
    assert oct(served.stat().st_mode & 0o777) == oct(0o666 & ~_umask())
    stored = blob(cache, served.read_bytes())
    assert stored.is_file() and stored.stat().st_ino != served.stat().st_ino
    served.write_bytes(b"edited in place")
    assert stored.read_bytes() == first_tree["bin/m1/m1.bin"]

    # The served actions were recorded: the next build of o2 restores only what changed.
    third = build(kiln, "o2")
    assert "0 built, 1 cached, 3 up to date" in third.stderr
    assert tree(tmp_path / "o2") == first_tree
    assert "0 built, 4 up to date" in build(kiln, "o2").stderr
    assert len(runs(tmp_path / "counter")) == 4


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def test_the_manifest_records_which_outputs_came_from_the_cache(
    tmp_path: Path, project: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    project(["m1"])
    build(kiln, "o1")
    build(kiln, "o2")

    def cached(out: str) -> dict[str, bool]:
        data = json.loads((tmp_path / out / "manifest.json").read_text())
        return {o["path"]: o["cached"] for o in data["entrypoints"]["m1"]["outputs"]}

    assert cached("o1") == {"bin/m1/m1.bin": False, "genfiles/m1/m1.sum": False}
    assert cached("o2") == {"bin/m1/m1.bin": True, "genfiles/m1/m1.sum": True}
    build(kiln, "o2")  # a no-op keeps the origin of what it did not touch
    assert cached("o2") == {"bin/m1/m1.bin": True, "genfiles/m1/m1.sum": True}
    build(kiln, "o2", "--no-cache")
    assert cached("o2") == {"bin/m1/m1.bin": True, "genfiles/m1/m1.sum": True}
    (tmp_path / "o2/bin/m1/m1.bin").unlink()
    build(kiln, "o2", "--no-cache")  # m1.bin was made by running its action now
    assert cached("o2") == {"bin/m1/m1.bin": False, "genfiles/m1/m1.sum": True}


@pytest.mark.parametrize("damage", ["corrupt", "truncate"])
def test_a_damaged_blob_is_a_miss_removed_and_reported_once(
    tmp_path: Path,
    cache: Path,
    project: Callable[..., Path],
    kiln: Callable[..., Any],
    damage: str,
) -> None:
    project(["m1"], size=200_000)
    build(kiln, "o1")
    good = (tmp_path / "o1/bin/m1/m1.bin").read_bytes()
    stored = blob(cache, good)
    stored.chmod(0o644)
    if damage == "corrupt":
        stored.write_bytes(good[:1000] + b"X" + good[1001:])
    else:
        stored.write_bytes(good[: len(good) // 2])

    r = build(kiln, "o2")
    warnings = [line for line in r.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1, r.stderr
    assert str(stored) in warnings[0] and "damaged" in warnings[0]
    assert runs(tmp_path / "counter").count("m1") == 2  # the action ran again
    assert (tmp_path / "o2/bin/m1/m1.bin").read_bytes() == good
    assert "1 built, 1 cached" in r.stderr  # m1.sum's blob was whole
    assert stored.read_bytes() == good  # put back whole by the run

    again = build(kiln, "o3")
    assert "warning" not in again.stderr
    assert "0 built, 2 cached" in again.stderr


def test_concurrent_builds_share_one_cache(
    tmp_path: Path, cache: Path, project: Callable[..., Path]
) -> None:
    names = [f"m{i}" for i in range(6)]
    project(names, size=50_000)
    env = {**os.environ, "NO_COLOR": "1"}
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "kiln", "build", "build.py", "--output-dir", f"o{i}", "-j", "2"],
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(4)
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        assert "warning" not in err
    expected = tree(tmp_path / "o0")
    assert len(expected) == 12
    for i in range(1, 4):
        assert tree(tmp_path / f"o{i}") == expected
    r = subprocess.run(
        [sys.executable, "-m", "kiln", "build", "build.py", "--output-dir", "fresh"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert "0 built, 12 cached" in r.stderr, r.stderr
    assert tree(tmp_path / "fresh") == expected
    assert list((cache / "v1" / "tmp").iterdir()) == []  # no temporaries left behind
    for path, data in expected.items():  # small outputs live in their entries
        if len(data) > INLINE_MAX:
            assert blob(cache, data).read_bytes() == data, path
        else:
            assert not blob(cache, data).exists(), path


def test_eviction_keeps_the_cache_within_its_size_least_recently_used_first(
    tmp_path: Path, cache: Path, project: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    project(["a", "b", "c"], size=20_000)
    build(kiln, "o1", "a")
    time.sleep(0.05)
    build(kiln, "o1", "b")
    time.sleep(0.05)
    build(kiln, "o2", "a")  # a hit: a is now used more recently than b
    time.sleep(0.05)
    r = build(kiln, "o1", "c", "--cache-max-size", "45K")
    usage = sum(
        p.stat().st_size for p in (cache / "v1").rglob("*") if p.parent.parent.name in ("ac", "cas")
    )
    assert usage <= 45 * 1024, r.stderr
    a, b, c = (tmp_path / f"o1/bin/{n}/{n}.bin" for n in "abc")
    assert blob(cache, a.read_bytes()).exists()
    assert blob(cache, c.read_bytes()).exists()
    assert not blob(cache, b.read_bytes()).exists()

    stats = kiln("cache", "stats")
    assert stats.returncode == 0, stats.stderr
    assert f"cache: {cache}" in stats.stdout
    assert "2 hits (0 remote), 0 misses" in stats.stdout  # the build of o2
    assert "0 hits (0 remote), 2 misses, 2 stored" in stats.stdout


def test_small_outputs_live_in_their_entry_and_are_checked_when_served(
    tmp_path: Path, cache: Path, project: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    """An output of at most 2 KiB is kept in its action-cache entry (one file, not
    two); it is served byte for byte, and damaged data in the entry is a miss."""
    project(["m1"], size=100)
    build(kiln, "o1")
    small = (tmp_path / "o1/bin/m1/m1.bin").read_bytes()
    assert len(small) == 100
    assert not (cache / "v1" / "cas").exists()  # no blob for either output
    assert not (cache / "v1" / "ac").exists()  # nor a file per entry: rows of the index
    found = entries(cache)
    assert len(found) == 2
    datas = [o.get("data") for e in found.values() for o in json.loads(e)["outputs"]]
    assert all(isinstance(d, str) for d in datas)
    assert "0 built, 2 cached" in build(kiln, "o2").stderr
    assert tree(tmp_path / "o2") == tree(tmp_path / "o1")

    def wrong_bytes(entry: bytes) -> bytes:  # the right size, the wrong bytes
        data = json.loads(entry)
        for out in data["outputs"]:
            out["data"] = base64.b64encode(b"x" * out["size"]).decode()
        return json.dumps(data).encode()

    assert rewrite_entries(cache, wrong_bytes) == 2
    r = build(kiln, "o3")
    assert "2 built" in r.stderr and "does not match its digest" in r.stderr, r.stderr
    assert tree(tmp_path / "o3") == tree(tmp_path / "o1")
    assert runs(tmp_path / "counter").count("m1") == 2
    assert "0 built, 2 cached" in build(kiln, "o4").stderr  # the run stored good entries
    assert tree(tmp_path / "o4") == tree(tmp_path / "o1")


def test_cache_stats_gc_and_clear(
    tmp_path: Path, cache: Path, project: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    empty = kiln("cache", "stats")
    assert empty.returncode == 0 and "entries: 0" in empty.stdout
    assert "no builds recorded yet" in empty.stdout
    project(["m1", "m2"])
    build(kiln, "o1")
    stats = kiln("cache", "stats")
    # 'kiln cache' alone, or with the cache's options only, is 'kiln cache stats'.
    alone = kiln("cache")
    assert alone.returncode == 0 and alone.stdout == stats.stdout
    assert kiln("cache", "--cache-dir", str(cache)).stdout == stats.stdout
    # The 64-byte .sum outputs are kept in their entries: 2 blobs, not 4.
    assert "entries: 4" in stats.stdout and "blobs: 2" in stats.stdout
    size = re.search(r"size: ([\d.]+) KiB of 10.0 GiB", stats.stdout)
    assert size and 6.0 < float(size[1]) < 9.0, stats.stdout  # 2 × 3,000 + 2 × 64 bytes + JSON
    gc = kiln("cache", "gc")
    assert gc.returncode == 0 and "removed 0 file(s)" in gc.stderr
    gc = kiln("cache", "gc", "--max-size", "0")
    assert gc.returncode == 0 and "removed 6 file(s)" in gc.stderr, gc.stderr
    assert "entries: 0" in kiln("cache", "stats").stdout
    build(kiln, "o2")
    assert kiln("cache", "clear").returncode == 0
    # What is left is the index, emptied in place (builds may have it open).
    left = sorted(p.relative_to(cache).as_posix() for p in (cache / "v1").rglob("*"))
    assert [p for p in left if not p.startswith("v1/index.db")] == []
    assert "entries: 0" in kiln("cache", "stats").stdout
    assert "4 built" in build(kiln, "o3").stderr
    bad = kiln("cache", "gc", "--max-size", "lots")
    assert bad.returncode == 2 and "--max-size" in bad.stderr and "not a size" in bad.stderr
    unknown = kiln("cache", "stat")
    assert unknown.returncode == 2 and "invalid choice: 'stat'" in unknown.stderr


def test_no_cache_reads_and_writes_nothing(
    tmp_path: Path, cache: Path, project: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    project(["m1"])
    build(kiln, "o1", "--no-cache")
    assert list(cache.iterdir()) == []
    build(kiln, "o2")
    assert "2 built" in build(kiln, "o3", "--no-cache").stderr
    assert len(runs(tmp_path / "counter")) == 6


def test_cache_dir_option_and_bad_sizes(
    tmp_path: Path, cache: Path, project: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    project(["m1"])
    build(kiln, "o1", "--cache-dir", "elsewhere")
    assert (tmp_path / "elsewhere" / "v1" / "index.db").is_file()
    assert list(cache.iterdir()) == []
    bad = build(kiln, "o2", "--cache-max-size", "ten", ok=False)
    assert bad.returncode == 2 and "--cache-max-size" in bad.stderr
    bad = kiln("build", "build.py", env={"KILN_CACHE_MAX_SIZE": "ten"})
    assert bad.returncode == 2 and "KILN_CACHE_MAX_SIZE" in bad.stderr


def test_an_unusable_cache_dir_is_reported_once_and_the_build_goes_on(
    tmp_path: Path, project: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    project(["m1", "m2"])
    (tmp_path / "not-a-dir").write_text("a file where the cache should be")
    r = build(kiln, "o1", "--cache-dir", "not-a-dir")
    warnings = [line for line in r.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and "not-a-dir" in warnings[0], r.stderr
    assert "4 built" in r.stderr
    assert (tmp_path / "not-a-dir").read_text() == "a file where the cache should be"


USER_ACTIONS = """
import sys
from pathlib import Path

COUNTER = Path(__file__).parent / "counter"

class Stamp(BuildAction):
    def __init__(self, out, **kw):
        super().__init__(**kw)
        self.out = out
        out.deps.add(self)

    def _invoke(self):
        with open(COUNTER, "a") as f:
            f.write(self.desc + "\\n")
        self.out.get_fs_path().write_text("stamp")
        self.out.get_fs_path().chmod(0o750)

class Uncacheable(Stamp):
    cacheable = False

class Always(Stamp):
    always_run = True

@entrypoint
def stamps():
    context = BuildContext.current()
    outs = []
    for cls in (Stamp, Uncacheable, Always):
        out = context.allocate_file(cls.__name__ + ".txt")
        cls(out, desc=cls.__name__, executor=context.executor)
        outs.append(out)
    return outs
"""


def test_cacheable_false_and_always_run_are_never_cached(
    tmp_path: Path, cache: Path, write_module: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    write_module(USER_ACTIONS)
    build(kiln, "o1")
    r = build(kiln, "o2")
    assert "2 built, 1 cached" in r.stderr
    ran = runs(tmp_path / "counter")
    assert sorted(ran) == ["Always", "Always", "Stamp", "Uncacheable", "Uncacheable"]
    assert len(entries(cache)) == 1  # Stamp's
    served = tmp_path / "o2/genfiles/stamps/Stamp.txt"
    # Served with kiln's modes: the execute bit kept, the rest from the umask (0o022).
    assert served.read_text() == "stamp" and served.stat().st_mode & 0o777 == 0o755
    before = sorted(cache.rglob("*"))
    explain = kiln("explain", "build.py", "--output-dir", "o3")
    lines = sorted(explain.stdout.splitlines())
    assert lines == [
        "Always: marked always-run",
        "Stamp: never built; would be served from cache",
        "Uncacheable: never built",
    ]
    assert sorted(cache.rglob("*")) == before  # explain writes nothing to the cache


FETCH = """
@entrypoint
def get(url=cl_arg("url", default=""), sha=cl_arg("sha", default="")):
    return fetch_http(name="blob.bin", url=url, sha256=sha)
"""


def test_fetch_http_with_a_digest_is_served_from_the_cas_without_the_network(
    tmp_path: Path, write_module: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    body = os.urandom(300_000)
    sha = hashlib.sha256(body).hexdigest()
    write_module(FETCH)
    with HTTPTestServer() as server:
        url = server.serve("/m.bin", body)
        build(kiln, "o1", "--url", url, "--sha", sha)
        assert server.count("/m.bin") == 1
    # The server is gone: the same URL, and a mirror's, come from the CAS.
    same = build(kiln, "o2", "--url", url, "--sha", sha)
    assert "cached: Fetch http" in same.stderr
    mirror = build(kiln, "o3", "--url", "http://127.0.0.1:9/mirror/m.bin", "--sha", sha)
    assert "0 built, 1 cached" in mirror.stderr
    for out in ("o2", "o3"):
        assert (tmp_path / out / "genfiles/get/blob.bin").read_bytes() == body
    # Without the digest the download is not content-addressed: it must fetch (and fail).
    failed = build(kiln, "o4", "--url", "http://127.0.0.1:9/m.bin", ok=False)
    assert failed.returncode == 1


def test_the_live_display_counts_what_the_cache_served(
    tmp_path: Path, project: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    from rich.console import Console

    from kiln.base.events import CACHED, BuildEvent
    from kiln.observe.live import RichReporter

    project(["m1", "m2"])
    build(kiln, "o1")
    live = build(kiln, "o2", "--console", "live", "-v")
    assert "\x1b[" in live.stderr
    assert live.stderr.count("cached: Running") == 4
    assert "0 built, 4 cached, 0 up to date" in live.stderr

    reporter = RichReporter(io.StringIO())
    reporter.handle(BuildEvent(CACHED, desc="Running x"))  # only counted: no graph needed
    screen = Console(record=True, width=80, file=io.StringIO())
    screen.print(reporter)
    assert "1 served from cache" in screen.export_text()


def test_entries_that_are_not_well_formed_are_misses() -> None:
    from kiln.cache.entry import CachedOutput, CacheEntry, key_name

    good = CacheEntry("k1", "Running x", (CachedOutput("gen/x", "a" * 64, 3, 0o644),))
    assert CacheEntry.decode("k1", good.encode()) == good
    assert CacheEntry.decode("k2", good.encode()) is None  # another key's entry
    data = json.loads(good.encode())
    for broken in (
        {**data, "format": "kiln-ac/0"},
        {**data, "outputs": []},
        {**data, "outputs": [{**data["outputs"][0], "sha256": "../../etc/passwd"}]},
        {**data, "outputs": [{**data["outputs"][0], "mode": 0o1000000}]},
        {**data, "outputs": [data["outputs"][0], data["outputs"][0]]},
        {**data, "outputs": "x"},
    ):
        assert CacheEntry.decode("k1", json.dumps(broken).encode()) is None, broken
    assert CacheEntry.decode("k1", b"\xff not json") is None
    assert key_name("ab" * 32) == "ab" * 32
    assert key_name("../../x") == hashlib.sha256(b"../../x").hexdigest()


_TEXT = st.text(st.characters(codec="utf-8"), max_size=40)
_OUTPUT = st.builds(
    lambda path, digest, size, mode, data: (path, digest, size, mode, data),
    _TEXT,
    _TEXT,
    st.integers(0, 1 << 40),
    st.integers(0, 0o7777),
    st.none() | st.binary(max_size=64),
)


@settings(max_examples=300, deadline=None)
@given(key=_TEXT, action=_TEXT, outputs=st.lists(_OUTPUT, max_size=4))
def test_an_entry_is_written_as_json_dumps_writes_it(
    key: str, action: str, outputs: list[tuple[str, str, int, int, bytes | None]]
) -> None:
    """Entries written by any kiln are read by any other (and by remote caches):
    kiln's own encoder writes exactly the bytes ``json.dumps(sort_keys=True)`` does,
    whatever the strings hold (quotes, control characters, non-ASCII)."""
    from kiln.cache.entry import CachedOutput, CacheEntry

    entry = CacheEntry(key, action, tuple(CachedOutput(*o) for o in outputs))
    expected = {
        "format": "kiln-ac/1",
        "key": key,
        "action": action,
        "outputs": [
            {"path": p, "sha256": d, "size": n, "mode": m}
            | ({} if data is None else {"data": base64.b64encode(data).decode()})
            for p, d, n, m, data in outputs
        ],
    }
    assert entry.encode() == json.dumps(expected, sort_keys=True).encode()


def test_sizes_and_the_default_cache_dir(tmp_path: Path) -> None:
    from kiln.cache import default_cache_dir, parse_size

    assert parse_size("10G") == parse_size("10GiB") == 10 << 30
    assert parse_size("2KB") == 2000 and parse_size("1.5k") == 1536 and parse_size("7") == 7
    with pytest.raises(ValueError, match="not a size"):
        parse_size("ten")
    assert default_cache_dir({"KILN_CACHE_DIR": "/c"}) == Path("/c")
    assert default_cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/kiln")
    assert default_cache_dir({"XDG_CACHE_HOME": "rel"}) == Path.home() / ".cache" / "kiln"


def test_a_blob_replaced_by_a_link_is_never_followed(
    tmp_path: Path, cache: Path, project: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    project(["m1"])
    build(kiln, "o1")
    good = (tmp_path / "o1/bin/m1/m1.bin").read_bytes()
    stored = blob(cache, good)
    elsewhere = tmp_path / "elsewhere.bin"
    elsewhere.write_bytes(good)  # the right bytes, but not the cache's file
    stored.unlink()
    stored.symlink_to(elsewhere)
    r = build(kiln, "o2")
    assert "1 built, 1 cached" in r.stderr  # m1.bin ran again; m1.sum's blob was whole
    assert runs(tmp_path / "counter").count("m1") == 2
    assert (tmp_path / "o2/bin/m1/m1.bin").read_bytes() == good
    assert elsewhere.read_bytes() == good
    assert not stored.is_symlink() and stored.read_bytes() == good  # replaced by the run


SOURCE_PROJECT = """\
from kiln import *

@entrypoint
def shout():
    text = source_file("data/words.txt")
    return run_command(name="loud.txt", inputs=[text],
                       command=["sh", "-c", "tr a-z A-Z < {inputs[0]} > {out}"])
"""


def test_a_checkout_elsewhere_is_served_from_the_cache(tmp_path: Path, cache: Path) -> None:
    """Source files are keyed by their path under the build module's directory, so
    the same project checked out at another path reuses what the first built."""
    results = []
    for checkout in ("a/project", "b/elsewhere/project"):
        root = tmp_path / checkout
        (root / "data").mkdir(parents=True)
        (root / "data/words.txt").write_text("hello\n")
        (root / "build.py").write_text(SOURCE_PROJECT)
        env = {**os.environ, "NO_COLOR": "1", "KILN_CACHE_DIR": str(cache)}
        results.append(
            subprocess.run(
                [sys.executable, "-m", "kiln", "build", "build.py"],
                cwd=root,
                capture_output=True,
                text=True,
                timeout=120,
                env=env,
            )
        )
        assert results[-1].returncode == 0, results[-1].stderr
    assert "1 built" in results[0].stderr
    assert "0 built, 1 cached" in results[1].stderr, results[1].stderr
    served = tmp_path / "b/elsewhere/project/kiln-out/genfiles/shout/loud.txt"
    assert served.read_text() == "HELLO\n"


BARE_FETCH = """
@entrypoint
def get(url=cl_arg("url", default="")):
    return fetch_http(name="blob.bin", url=url)
"""


def test_fetch_http_without_a_digest_never_goes_through_the_cache(
    tmp_path: Path, cache: Path, write_module: Callable[..., Path], kiln: Callable[..., Any]
) -> None:
    """What a bare URL serves may change: each new output directory fetches it again,
    and nothing of it is stored in the cache."""
    write_module(BARE_FETCH)
    with HTTPTestServer() as server:
        url = server.serve("/latest.bin", b"version 1")
        first = build(kiln, "o1", "--url", url)
        server.serve("/latest.bin", b"version 2")
        second = build(kiln, "o2", "--url", url)
        assert server.count("/latest.bin") == 2
    assert "cached" not in second.stderr and "Fetching URL" in second.stderr, second.stderr
    assert (tmp_path / "o1/genfiles/get/blob.bin").read_bytes() == b"version 1"
    assert (tmp_path / "o2/genfiles/get/blob.bin").read_bytes() == b"version 2"
    assert "Fetching URL" in first.stderr
    assert not blob(cache, b"version 1").exists()
