"""Process checks for the tests that kill builds: is a process gone, and which
processes of a test are still alive (tagged through their environment)."""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Callable
from pathlib import Path


def dead(pid: int) -> bool:
    """True once ``pid`` no longer runs (a zombie counts as dead)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:  # gone meanwhile: ENOENT, or ESRCH from a process being reaped
        return True


def tagged_processes(tag: str) -> list[int]:
    """Live processes whose environment carries ``KILN_TEST_TAG=tag``."""
    needle = f"KILN_TEST_TAG={tag}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                env = (entry / "environ").read_bytes().split(b"\0")
                if needle in env and not dead(int(entry.name)):
                    found.append(int(entry.name))
    return found


def wait_for(predicate: Callable[[], object], timeout: float, what: str) -> None:
    """Poll ``predicate`` until it is true; fail the test naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def wait_gone(*pids: int, timeout: float = 10) -> bool:
    """Wait until every one of ``pids`` is dead; False if one still runs after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not all(dead(p) for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def assert_dead(*pids: int, grace_s: float = 5.0) -> None:
    """Fail the test naming the survivors unless all of ``pids`` die within ``grace_s``."""
    assert wait_gone(*pids, timeout=grace_s), f"still running: {[p for p in pids if not dead(p)]}"


def wait_untagged(tag: str, timeout: float = 10) -> None:
    """Wait until no process carries ``KILN_TEST_TAG=tag``; fail naming those left."""
    deadline = time.monotonic() + timeout
    while left := tagged_processes(tag):
        assert time.monotonic() < deadline, f"processes left by the killed build: {left}"
        time.sleep(0.05)
