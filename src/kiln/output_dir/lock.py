"""One build at a time per output directory.

``OUTPUT_DIR/.kiln/lock`` is held with ``flock`` for the whole build and holds
the owner's pid. The kernel drops the lock when its process dies, so a lock
left by a dead build never blocks. Taking the lock claims the output directory
(``kiln.output_dir.ownership.claim_output_dir``); the lock file is never opened through a link,
and a lock taken on a file that ``kiln clean`` removed meanwhile is taken again.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable
from pathlib import Path
from types import TracebackType

from kiln.base.errors import OutputDirLocked, StateError
from kiln.output_dir.ownership import claim_output_dir, open_own_file

__all__ = ["OutputDirLocked", "OutputLock"]  # OutputDirLocked: re-exported from kiln.base.errors


class OutputLock:
    """Context manager holding the output directory's lock."""

    def __init__(self, output_dir: Path, *, wait: bool, notify: Callable[[str], None]):
        self.path = output_dir.absolute() / ".kiln" / "lock"  # messages name it in full
        self.wait = wait
        self.notify = notify
        self._fd: int | None = None

    def __enter__(self) -> OutputLock:
        while True:
            fd = self._acquire()
            try:
                current = os.lstat(self.path).st_ino
            except FileNotFoundError:
                current = -1
            if current == os.fstat(fd).st_ino:
                break
            os.close(fd)  # ``kiln clean`` removed the file we waited on: lock the new one
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as e:  # a full disk, a quota: closing the file drops the lock
            os.close(fd)
            raise StateError(
                f"cannot write the lock file {self.path}: {e.strerror}; "
                f"free space on the file system of {self.path.parent.parent} or choose "
                "another with --output-dir"
            ) from e
        self._fd = fd
        return self

    def _acquire(self) -> int:
        try:
            claim_output_dir(self.path.parent.parent)
            fd = open_own_file(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise StateError(
                f"cannot write to the output directory {self.path.parent.parent}: "
                f"{e.strerror}; choose another with --output-dir or fix its permissions"
            ) from e
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
            where = self.path.parent.parent
            if not self.wait:
                os.close(fd)
                raise OutputDirLocked(
                    f"another kiln build (pid {holder}) is using {where}; "
                    "wait for it, or drop --no-wait to queue behind it"
                ) from None
            self.notify(f"waiting for the kiln build (pid {holder}) using {where} to finish")
            fcntl.flock(fd, fcntl.LOCK_EX)
        return fd

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):  # a pid left behind is harmless
                os.ftruncate(self._fd, 0)
            os.close(self._fd)
            self._fd = None
