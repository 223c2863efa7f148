"""Process groups and pidfds: the one place kiln signals a group of processes
(a command and what it started, a worker and its children) and watches a process
end without a thread per process."""

from __future__ import annotations

import contextlib
import os
import signal


def kill_group(pid: int, sig: int = signal.SIGKILL) -> None:
    """Signal the process group led by ``pid``; one already gone, or not kiln's to
    signal, is left alone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


def pidfd(pid: int) -> int | None:
    """A pidfd of ``pid`` (readable once it exited; immune to the pid's reuse), or
    None where the kernel or Python has none (then callers poll or wait)."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None
