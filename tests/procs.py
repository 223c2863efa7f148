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
    except FileNotFoundError:
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
