"""The remote cache against a real nginx (WebDAV ``PUT``) on 127.0.0.1: shared
results, read-only consumers, and remotes that are down or serve wrong bytes."""

from __future__ import annotations

import base64
import json
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cache_build import module_text, runs, tree, write_tool
from nginx import NginxCache, free_port

pytestmark = pytest.mark.in_process


@pytest.fixture
def project(tmp_path: Path, write_module: Callable[..., Path]) -> Path:
    tool = write_tool(tmp_path)
    write_module(module_text(tool, tmp_path / "counter", ["m1", "m2"], size=100_000))
    return tmp_path / "counter"


def build(kiln: Callable[..., Any], out: str, cache: str, *args: str, **kw: Any) -> Any:
    r = kiln("build", "build.py", "--output-dir", out, "--cache-dir", cache, *args, **kw)
    assert r.returncode == 0, r.stderr
    return r


def warnings(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if "warning" in line]


def test_a_fresh_machine_builds_nothing_that_the_remote_has(
    tmp_path: Path, project: Path, nginx_cache: NginxCache, kiln: Callable[..., Any]
) -> None:
    first = build(kiln, "o1", "cache-a", "--remote-cache", nginx_cache.url)
    assert "4 built" in first.stderr and not warnings(first.stderr)
    assert len(nginx_cache.files("ac")) == 4 and len(nginx_cache.files("cas")) == 4

    # Another machine: an empty local cache, a new output directory; the URL from the
    # environment.
    second = build(kiln, "o2", "cache-b", env={"KILN_REMOTE_CACHE": nginx_cache.url})
    assert "0 built, 4 cached" in second.stderr, second.stderr
    assert len(runs(project)) == 4
    expected = tree(tmp_path / "o1")
    assert tree(tmp_path / "o2") == expected
    stats = kiln("cache", "stats", "--cache-dir", "cache-b")
    assert "4 hits (4 remote), 0 misses" in stats.stdout

    # The local cache is in front: with the remote gone, it still serves everything.
    nginx_cache.close()
    third = build(kiln, "o3", "cache-b", "--remote-cache", nginx_cache.url)
    assert "0 built, 4 cached" in third.stderr and not warnings(third.stderr)
    assert tree(tmp_path / "o3") == expected


def test_a_read_only_consumer_uploads_nothing(
    tmp_path: Path,
    project: Path,
    nginx_cache: NginxCache,
    kiln: Callable[..., Any],
    write_module: Callable[..., Path],
) -> None:
    build(kiln, "o1", "cache-a", "--remote-cache", nginx_cache.url)
    stored = nginx_cache.files("ac") + nginx_cache.files("cas")
    # The consumer builds one more model than the producer did.
    write_module(module_text(tmp_path / "tool.py", project, ["m1", "m2", "m3"], size=100_000))
    r = build(kiln, "o2", "cache-b", "--remote-cache", nginx_cache.url, "--remote-cache-upload=no")
    assert "2 built, 4 cached" in r.stderr and not warnings(r.stderr)
    assert nginx_cache.files("ac") + nginx_cache.files("cas") == stored
    assert sorted(runs(project)).count("m3") == 1


def test_an_unreachable_remote_is_reported_once_and_the_build_goes_on(
    tmp_path: Path, project: Path, kiln: Callable[..., Any]
) -> None:
    url = f"http://127.0.0.1:{free_port()}/cache"  # nothing listens there
    started = time.monotonic()
    r = build(kiln, "o1", "cache-a", "--remote-cache", url)
    took = time.monotonic() - started
    [warning] = warnings(r.stderr)
    assert url in warning and "connection refused" in warning
    assert "4 built" in r.stderr and took < 30
    assert "0 built, 4 cached" in build(kiln, "o2", "cache-a", "--remote-cache", url).stderr


def test_a_remote_serving_wrong_bytes_is_a_miss_and_never_reaches_the_output(
    tmp_path: Path, project: Path, nginx_cache: NginxCache, kiln: Callable[..., Any]
) -> None:
    build(kiln, "o1", "cache-a", "--remote-cache", nginx_cache.url)
    expected = tree(tmp_path / "o1")
    bad = b"not what the digest says" * 100
    for blob in nginx_cache.files("cas"):
        blob.write_bytes(bad)
    inline = 0
    for entry in nginx_cache.files("ac"):  # small outputs travel in their entry
        data = json.loads(entry.read_bytes())
        for out in data["outputs"]:
            if "data" in out:
                out["data"] = base64.b64encode(bad[: out["size"]]).decode()
                inline += 1
        entry.write_text(json.dumps(data))
    assert inline == 2  # the two 64-byte .sum outputs

    r = build(kiln, "o2", "cache-b", "--remote-cache", nginx_cache.url, "--remote-cache-upload=no")
    found = warnings(r.stderr)
    assert found and all(
        "another digest" in w or "does not match its digest" in w for w in found
    ), r.stderr
    assert "4 built" in r.stderr
    assert tree(tmp_path / "o2") == expected
    assert len(runs(project)) == 8
    assert not any(bad in p.read_bytes() for p in (tmp_path / "cache-b").rglob("*") if p.is_file())


def test_a_failing_remote_is_reported_once(
    tmp_path: Path, project: Path, nginx_cache: NginxCache, kiln: Callable[..., Any]
) -> None:
    # A directory where an entry's file should be: nginx answers PUTs with an error.
    for name in ("ac", "cas"):
        (nginx_cache.data / name).write_text("in the way")
    r = build(kiln, "o1", "cache-a", "--remote-cache", nginx_cache.url)
    [warning] = warnings(r.stderr)
    assert nginx_cache.url in warning and "HTTP 500" in warning, r.stderr
    assert "4 built" in r.stderr


def test_a_bad_remote_url_is_a_usage_error(
    tmp_path: Path, project: Path, kiln: Callable[..., Any]
) -> None:
    r = kiln("build", "build.py", "--remote-cache", "ftp://example.invalid/cache")
    assert r.returncode == 2 and "--remote-cache" in r.stderr and "http" in r.stderr
    assert runs(project) == []


def test_a_remote_that_never_answers_costs_a_bounded_wait(
    tmp_path: Path, project: Path, kiln: Callable[..., Any]
) -> None:
    with socket.socket() as silent:  # accepts connections (the kernel does), never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen(64)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        started = time.monotonic()
        r = build(kiln, "o1", "cache-a", "--remote-cache", url, "--remote-cache-timeout", "0.5")
        took = time.monotonic() - started
    [warning] = warnings(r.stderr)
    assert "no answer within 0.5 s" in warning, r.stderr
    assert "4 built" in r.stderr and took < 15


def test_a_remote_cache_is_never_asked_on_the_schedulers_thread(
    tmp_path: Path,
    nginx_cache: NginxCache,
    kiln: Callable[..., Any],
    write_module: Callable[..., Path],
) -> None:
    """Small lookups are made in-line on the scheduler's thread, but only when they
    read this machine's cache: with a remote cache set, a lookup may wait for its
    server, and waits happen on the worker threads."""
    from test_tiny_actions import MODULE, lanes

    write_module(MODULE, header=False)
    build(kiln, "o1", "cache-a", "tiny", "--remote-cache", nginx_cache.url)
    remote = build(
        kiln, "o2", "cache-b", "tiny", "--remote-cache", nginx_cache.url, "--events", "r.jsonl"
    )
    assert "0 built, 240 cached" in remote.stderr
    served = lanes(tmp_path / "r.jsonl", "cached")["tiny"]
    assert len(served) == 240 and "main" not in served, served
    # The same lookups from the local cache alone: in-line after the first windows.
    local = build(kiln, "o3", "cache-b", "tiny", "--events", "l.jsonl")
    assert "0 built, 240 cached" in local.stderr
    assert lanes(tmp_path / "l.jsonl", "cached")["tiny"].count("main") >= 80
