"""Where a command's output goes: straight to files, never through kiln's memory.
A running command prints into a spool file (``LogSpools``); what it printed, if
anything, becomes its log (``open_log``), ``.kiln/logs/<output path>.log``."""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable
from pathlib import Path

from kiln.base.errors import ActionFailed, StateError
from kiln.output_dir.ownership import open_own_file


def open_log(path: Path | str, header: str = "") -> int:
    """Create the log at ``path`` (a new file in place of an old one), write ``header``,
    and return a descriptor open for writing. Its directory must exist
    (``Executor.log_path`` makes it, never through a link); the file is opened as
    kiln's own file (``kiln.output_dir.ownership.open_own_file``: no link followed, never a
    FIFO, regular only).
    """
    target = Path(path)
    try:
        fd = open_own_file(target, os.O_WRONLY | os.O_CREAT)
        if os.fstat(fd).st_size:
            # The last run's log goes, and a new file takes its name. Not truncated in
            # place: ext4 flushes a file truncated to zero when it is closed, a disk
            # write per action.
            os.close(fd)
            os.unlink(target)
            fd = open_own_file(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    except (OSError, StateError) as e:
        reason = e.strerror if isinstance(e, OSError) else str(e)
        raise ActionFailed(f"cannot write the log {target}: {reason}") from e
    try:
        os.write(fd, header.encode())
    except OSError as e:
        os.close(fd)
        raise ActionFailed(f"cannot write the log {target}: {e.strerror}") from e
    return fd


class LogSpools:
    """Files that running commands print into, one per command running, reused.

    A command's output streams into a spool file under ``.kiln/spool/`` (never into
    kiln's memory); when it ended, ``settle`` moves what it printed, if anything,
    into the action's log. A command that printed nothing costs no log file: in a
    build of many quiet commands that halves the files kiln creates.

    Invariant: a spool handed out by ``take`` is empty and at offset 0, and is
    used by one command at a time until ``settle`` gives it back.
    """

    def __init__(self, directory: Callable[[], Path]) -> None:
        self._directory = directory  # made on first use, never through a link
        self._lock = threading.Lock()
        self._free: list[int] = []
        self._made = 0
        self._closed = False

    def take(self) -> int:
        """An empty spool, open for writing, for one command."""
        with self._lock:
            if self._free:
                return self._free.pop()
            number = self._made
            self._made += 1
        path = self._directory() / str(number)
        try:
            fd = open_own_file(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
            if os.fstat(fd).st_size:  # left by a build that was killed
                os.ftruncate(fd, 0)
        except (OSError, StateError) as e:
            reason = e.strerror if isinstance(e, OSError) else str(e)
            raise ActionFailed(f"cannot write the command output spool {path}: {reason}") from e
        return fd

    def settle(
        self,
        spool: int,
        log: Callable[[], Path | str],
        header: Callable[[], str],
        old_log: Callable[[], Path | str | None],
    ) -> str | None:
        """After a command using ``spool`` ended: write ``header()`` and what it printed
        to its log, or, when it printed nothing, remove the log of an earlier run
        (``old_log``, if any); give the spool back. The log's path, or None when
        there is none."""
        reusable = False
        try:
            size = os.fstat(spool).st_size
            written = _copy_log(spool, size, Path(log()), header()) if size else None
            if size:
                os.ftruncate(spool, 0)
            os.lseek(spool, 0, os.SEEK_SET)
            reusable = True
            if written is None:
                stale = old_log()
                if stale is not None:
                    _remove_stale(Path(stale))
            return written
        finally:
            if reusable:
                self.give(spool)
            else:  # in an unknown state: never reused
                os.close(spool)

    def give(self, spool: int) -> None:
        """Give back a spool that is empty and at offset 0 (``settle`` does)."""
        with self._lock:
            if self._closed:
                os.close(spool)
            else:
                self._free.append(spool)

    def close(self) -> None:
        """The build ended: the spools not in use are closed; those in use are
        closed when given back."""
        with self._lock:
            self._closed = True
            free, self._free = self._free, []
        for fd in free:
            with contextlib.suppress(OSError):
                os.close(fd)


def _copy_log(spool: int, size: int, target: Path, header: str) -> str:
    """Write the log ``target``: ``header``, then the ``size`` bytes of ``spool``."""
    fd = open_log(target, header)
    try:
        offset = 0
        while offset < size:
            sent = os.sendfile(fd, spool, offset, size - offset)
            if not sent:
                break  # it shrank: cannot be, the command ended
            offset += sent
    except OSError as e:
        raise ActionFailed(f"cannot write the log {target}: {e.strerror}") from e
    finally:
        os.close(fd)
    return str(target)


def _remove_stale(log: Path) -> None:
    """Remove the log an earlier run of the action left (kiln's own file: ``unlink``
    never follows a link; its directory was checked when its path was made)."""
    try:
        os.unlink(log)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise ActionFailed(f"cannot remove the old log {log}: {e.strerror}") from e
