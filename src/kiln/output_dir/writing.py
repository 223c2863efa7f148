"""Writing in the output directory and the cache: temporaries beside their
targets, committed by rename; what reaches the disk; removing what an action
left half-written (the trust model is in ``kiln.output_dir``'s docstring)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import re
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, cast

from kiln.base.errors import ActionFailed, ConfinementError, NotRegularFile

TMP_PREFIX = ".kiln-tmp-"
_MAX_TMP_EXT = 16
# The whole name ``temporary_for`` gives: the target's extension (a suffix of at
# most ``_MAX_TMP_EXT`` bytes) at most follows the tag.
_TMP_NAME = re.compile(
    rf"{re.escape(TMP_PREFIX)}(?P<key>[0-9a-f]{{10}})-[0-9a-f]{{8}}"
    rf"(?:\.[^./]{{1,{_MAX_TMP_EXT - 1}}})?"
)
NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


def file_kind(mode: int) -> str:
    """What a non-regular file is, for messages."""
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def link_text(path: Path | str) -> str:
    with contextlib.suppress(OSError):
        return f"{path} (a symbolic link to {os.readlink(path)})"
    return f"{path} (a symbolic link)"


# -- writing ---------------------------------------------------------------------


def _tmp_key(name: str) -> str:
    return hashlib.sha256(os.fsencode(name)).hexdigest()[:10]


def temporary_for(target: Path, unique: bool = True) -> Path:
    """A temporary name beside ``target``; short whatever ``target``'s name is, and
    with its extension (tools such as compilers read it). ``unique``: a fresh name;
    else always the same one for ``target`` (a command that writes its ``{out}``
    into the output writes the same bytes every time)."""
    ext = target.suffix if len(os.fsencode(target.suffix)) <= _MAX_TMP_EXT else ""
    tag = os.urandom(4).hex() if unique else "0" * 8
    return target.with_name(f"{TMP_PREFIX}{_tmp_key(target.name)}-{tag}{ext}")


def is_temporary(name: str) -> bool:
    return _TMP_NAME.fullmatch(name) is not None


def _commit(tmp: Path, target: Path) -> None:
    """The rename makes the temporary the target (replacing a link or FIFO there,
    never following it); only a regular file is committed (NotRegularFile)."""
    mode = os.lstat(tmp).st_mode
    if not stat.S_ISREG(mode):
        raise NotRegularFile(f"{tmp} is {file_kind(mode)}, not a regular file")
    os.replace(tmp, target)


def sync_filesystem(path: Path | str) -> str | None:
    """Have everything written to the filesystem of ``path`` reach the disk (the
    end of a build that wrote outputs): ``syncfs``, else ``sync``. What went wrong,
    if the kernel says writing failed (an I/O error, a full disk), else None."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        return f"cannot open {path}: {e.strerror}"
    try:
        syncfs = _syncfs()
        if syncfs is None:
            os.sync()
        elif syncfs(fd) != 0:
            import ctypes

            return os.strerror(ctypes.get_errno())
        return None
    finally:
        os.close(fd)


@functools.cache
def _syncfs() -> Callable[[int], int] | None:
    """libc's ``syncfs`` (Linux), looked up when first needed."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        return cast("Callable[[int], int]", ctypes.CDLL(None, use_errno=True).syncfs)
    except (AttributeError, OSError):
        return None


@contextlib.contextmanager
def atomic_output(path: Path | str, *, create: bool = True, unique: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success commit it onto ``path``, on
    any failure remove it. The parent directory must exist (``OutputTree`` made it).

    With ``create`` the temporary exists, empty; without, the writer (a subprocess)
    creates it. What the writer leaves must be a regular file. ``unique=False``:
    the temporary's name is always the same for ``path`` (``temporary_for``); what
    an earlier writer left there is removed first.
    """
    target = Path(path)
    tmp = temporary_for(target, unique)
    if not unique:
        remove_quietly(tmp)
    if create:
        os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | NOFOLLOW, 0o666))
    try:
        yield tmp
        try:
            _commit(tmp, target)
        except FileNotFoundError:
            if os.path.lexists(tmp) or not os.path.isdir(target.parent):
                raise
            raise ActionFailed(f"finished without writing its output {target}") from None
        except NotRegularFile as e:
            raise ConfinementError(
                f"the temporary output for {target} was not a regular "
                f"file ({e}); nothing was written"
            ) from None
    except BaseException:
        remove_quietly(tmp)
        raise


@contextlib.contextmanager
def atomic_write(path: Path | str, mode: str = "wb") -> Iterator[IO[Any]]:
    """Like ``atomic_output``, yielding the temporary opened for writing (``"wb"`` or
    ``"w"``, UTF-8)."""
    with atomic_output(path, create=False) as tmp:
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | NOFOLLOW, 0o666)
        with written(fd, mode, commit=lambda: True, discard=lambda: None) as f:
            yield f


@contextlib.contextmanager
def written(
    fd: int, mode: str, commit: Callable[[], bool], discard: Callable[[], object]
) -> Iterator[IO[Any]]:
    """The shape of every temporary-then-rename write: ``fd`` is a new temporary,
    open for writing, which the body writes through the file yielded (``"wb"``, or
    ``"w"`` for UTF-8 text); once the body succeeded and the file is closed,
    ``commit()`` gives it its place by rename and says whether it did; a temporary
    not committed is removed (``discard()``), whatever went wrong."""
    committed = False
    try:
        encoding = None if "b" in mode else "utf-8"
        with os.fdopen(fd, mode, encoding=encoding) as f:
            yield f
        committed = commit()
    finally:
        if not committed:
            discard()


# Free space on a disk below which it counts as full: this, or a twentieth of a
# smaller disk (a tmpfs of a few MiB).
LOW_SPACE = 64 << 20


def disk_full(directory: str | Path) -> str | None:
    """Why the disk of ``directory`` counts as full now (nearly no free space or no
    free inode), or None; None too when it cannot be told."""
    try:
        disk = os.statvfs(directory)
    except OSError:
        return None
    low = min(LOW_SPACE, disk.f_blocks * disk.f_frsize // 20)
    if disk.f_bavail * disk.f_frsize < low:
        return f"the disk of {directory} has less than {low >> 10} KiB free"
    if disk.f_files and not disk.f_favail:
        return f"the disk of {directory} has no free inode"
    return None


@functools.cache
def process_umask() -> int:
    """The process's umask, read once (Linux: from /proc, without changing it)."""
    with (
        contextlib.suppress(OSError, ValueError),
        open("/proc/self/status", encoding="ascii", errors="replace") as f,
    ):
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def remove_quietly(path: Path | str) -> None:
    """Unlink ``path`` if it is there (never follows a link: unlink removes the link)."""
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        os.unlink(path)


def temporaries(directory: str) -> dict[str, list[str]]:
    """kiln's temporaries in ``directory``, by the name-key of the file they were for."""
    found: dict[str, list[str]] = {}
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(directory):
            match = _TMP_NAME.fullmatch(entry.name)
            if match:
                found.setdefault(match["key"], []).append(os.path.join(directory, entry.name))
    return found


def remove_partial(path: Path | str) -> None:
    """Remove ``path`` and the temporaries its interrupted writer left beside it."""
    target = Path(path)
    for tmp in temporaries(str(target.parent)).get(_tmp_key(target.name), []):
        remove_quietly(tmp)
    remove_quietly(target)


class TemporarySweeper:
    """Removes the temporaries that writers killed in an earlier build left beside an
    output, before its action runs again. Each directory is listed once per build."""

    def __init__(self) -> None:
        self._listed: dict[str, dict[str, list[str]]] = {}

    def sweep(self, path: Path | str) -> None:
        directory, name = os.path.split(str(path))
        if directory not in self._listed:
            self._listed[directory] = temporaries(directory)
        for tmp in self._listed[directory].pop(_tmp_key(name), []):
            remove_quietly(tmp)
