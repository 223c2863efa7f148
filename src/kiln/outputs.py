"""The output directory: whose it is, and how kiln writes, reads and removes there.

Every file kiln writes goes through this module, so the trust model holds by
construction rather than writer by writer:

- **Ownership.** kiln uses an output directory only when it is new, empty,
  holding only its namespace folders with a user's files (``kiln.prefilled``:
  those stay the user's), or marked as kiln's by ``.kiln/format``
  (``kiln-output/1``). ``claim_output_dir`` is the one function that creates
  ``.kiln/``; everything else finds it there.
- **Confinement.** Below the output root kiln never writes through a symbolic
  link: directories are made component by component with ``lstat`` checks
  (``OutputTree``), kiln's own files are opened with ``O_NOFOLLOW``, temporaries
  with ``O_EXCL``, and outputs are committed by ``rename``, which replaces a
  link instead of following it.
- **Regular files only.** Outputs are read with ``O_NOFOLLOW | O_NONBLOCK`` and
  an ``fstat`` check (``open_regular``): a symlink, FIFO, socket, device or
  directory is never read and never blocks.

Temporaries: one scheme, ``.kiln-tmp-<10 hex of the name's digest>-<8 random
hex><extension>`` beside the file they become, at most 45 bytes whatever the
output's name, so a name of NAME_MAX bytes still has a temporary. A command's
temporary (its ``{out}``) has eight zeros for the random part: always the same
name, so that a command that writes its own output path writes the same bytes.

Durability: a temporary becomes the output by rename, so a killed build never
leaves a half-written file under an output's name. What reaches the disk is
settled once per build, not per file: ``sync_filesystem`` before the build says
it is done (one ``syncfs``, a few milliseconds after thousands of outputs, where
an ``fsync`` per output cost each command a disk wait). A power cut in the middle
of a build can leave an output shorter than what was recorded; the state's stat
key (size, mtime, inode, ctime) then differs, and the next build reruns it.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import hashlib
import json
import os
import re
import stat
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, cast

from kiln.errors import ActionFailed, ConfinementError, NotRegularFile, StateError, UsageError
from kiln.prefilled import USER_FILES, is_prefilled, list_user_files

KILN_DIR = ".kiln"
MARKER = "format"
FORMAT_NAME = "kiln-output"
FORMAT_VERSION = 1
NAME_MAX = 255
PATH_MAX = 4096
TMP_PREFIX = ".kiln-tmp-"
_TMP_NAME = re.compile(rf"{re.escape(TMP_PREFIX)}(?P<key>[0-9a-f]{{10}})-[0-9a-f]{{8}}.*")
_MAX_TMP_EXT = 16
# What a kiln made before the marker existed keeps in .kiln/ (adopted as kiln's).
_LEGACY_NAMES = frozenset(
    {"lock", "state.db", "state.db-wal", "state.db-shm", "logs", "tmp", USER_FILES}
)
_NOFOLLOW = os.O_NOFOLLOW | os.O_CLOEXEC


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


# -- ownership -------------------------------------------------------------------


def _refuse(root: Path, why: str) -> UsageError:
    return UsageError(
        f"refusing to use {root} as the output directory: {why}; kiln writes only into "
        "a new, empty or kiln-made directory: choose another with --output-dir"
    )


def output_dir_state(root: Path) -> str:
    """``missing``, ``empty``, ``prefilled`` (``kiln.prefilled``) or ``kiln`` for an
    output directory kiln may use; raise
    UsageError (naming it and ``--output-dir``) for any other, StateError when it
    cannot be a directory. Reads only."""
    try:
        st = os.stat(root)
    except FileNotFoundError:
        return "missing"
    except OSError as e:
        raise StateError(
            f"cannot write to the output directory {root}: {e.strerror}; "
            "choose another with --output-dir"
        ) from e
    if not stat.S_ISDIR(st.st_mode):
        raise StateError(
            f"cannot write to the output directory {root}: Not a directory; "
            "choose another with --output-dir"
        )
    kiln_dir = root / KILN_DIR
    try:
        kst = os.lstat(kiln_dir)
    except FileNotFoundError:
        with os.scandir(root) as entries:
            if next(entries, None) is None:
                return "empty"
        if is_prefilled(root):
            return "prefilled"
        raise _refuse(
            root, f"it is not empty and is not a kiln output directory (no {KILN_DIR}/{MARKER})"
        ) from None
    if not stat.S_ISDIR(kst.st_mode):
        what = link_text(kiln_dir) if stat.S_ISLNK(kst.st_mode) else f"{kiln_dir} is not"
        raise _refuse(
            root, f"{what} a directory kiln made" if "link" not in what else f"{what} is not kiln's"
        )
    _check_marker(root, kiln_dir)
    return "kiln"


def _check_marker(root: Path, kiln_dir: Path) -> None:
    marker = kiln_dir / MARKER
    try:
        text = read_regular(marker, limit=256).decode(errors="replace").strip()
    except FileNotFoundError:
        names = set(os.listdir(kiln_dir))
        if all(
            n in _LEGACY_NAMES or n.startswith(("state.db.corrupt-", TMP_PREFIX)) for n in names
        ):
            return  # made by a kiln before the marker, or killed writing it: adopted
        raise _refuse(root, f"{kiln_dir} holds files kiln did not make") from None
    except (NotRegularFile, OSError) as e:
        raise _refuse(root, f"its marker {marker} is unreadable ({e})") from None
    name, _, version = text.partition("/")
    if name != FORMAT_NAME or not version.isdigit():
        raise _refuse(root, f"its marker {marker} is not kiln's ({text[:40]!r})")
    if int(version) > FORMAT_VERSION:
        raise _refuse(root, f"it was made by a newer kiln (format {version})")


def claim_output_dir(root: Path) -> Path:
    """Make ``root`` kiln's (creating it if new) and return its ``.kiln`` directory.
    The only function that creates ``.kiln/``."""
    root = Path(root).absolute()
    state = output_dir_state(root)
    kiln_dir = root / KILN_DIR
    try:
        if state == "missing":
            os.makedirs(root, exist_ok=True)
        if state != "kiln":
            with contextlib.suppress(FileExistsError):
                os.mkdir(kiln_dir)
        if state == "prefilled":  # what is there stays the user's
            with atomic_write(kiln_dir / USER_FILES, "w") as f:
                json.dump(list_user_files(root), f)
        if not os.path.lexists(kiln_dir / MARKER):
            with atomic_write(kiln_dir / MARKER, "w") as f:
                f.write(f"{FORMAT_NAME}/{FORMAT_VERSION}\n")
    except OSError as e:
        raise StateError(
            f"cannot write to the output directory {root}: {e.strerror}; "
            "choose another with --output-dir or fix its permissions"
        ) from e
    own_dir_checked(kiln_dir)
    return kiln_dir


def own_dir_checked(path: Path) -> None:
    """Raise StateError unless ``path`` (one of kiln's own directories) is a real one."""
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode):
        what = link_text(path) if stat.S_ISLNK(st.st_mode) else f"{path} ({file_kind(st.st_mode)})"
        raise StateError(
            f"kiln's directory {what} is not a directory; kiln never writes "
            "through links: remove it"
        )


def check_own_file(path: Path | str) -> None:
    """Raise StateError when kiln's own file ``path`` exists as anything but a regular
    file (SQLite, for one, would follow a link)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISREG(st.st_mode):
        what = link_text(path) if stat.S_ISLNK(st.st_mode) else f"{path} ({file_kind(st.st_mode)})"
        raise StateError(
            f"kiln's file {what} is not a regular file; kiln never writes through links: remove it"
        )


def open_own_file(path: Path | str, flags: int, mode: int = 0o644) -> int:
    """``os.open`` for kiln's own files: never follows a link, never blocks on a FIFO."""
    check_own_file(path)
    try:
        fd = os.open(path, flags | _NOFOLLOW | os.O_NONBLOCK, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            check_own_file(path)
        raise
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        check_own_file(path)
    os.set_blocking(fd, True)
    return fd


def clear_for_own_file(path: Path | str) -> None:
    """Make room for kiln's own file ``path`` (committed by rename, which replaces a
    link or FIFO without following it): an empty directory there is removed, any
    other directory is a StateError naming it."""
    try:
        if stat.S_ISDIR(os.lstat(path).st_mode):
            os.rmdir(path)
    except FileNotFoundError:
        pass
    except OSError as e:
        raise StateError(
            f"{path} is a directory ({e.strerror}), where kiln writes its own file: move it away"
        ) from None


# -- reading ---------------------------------------------------------------------


def open_regular(path: Path | str, *, follow: bool = False) -> int:
    """A read-only descriptor of ``path`` if it is a regular file; else NotRegularFile.
    Never blocks on a FIFO; with ``follow`` false never follows a final symlink."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotRegularFile(f"{path} is a symbolic link, not a regular file") from None
        if e.errno in (errno.ENXIO, errno.EISDIR):  # a socket; a directory
            st = os.lstat(path)
            raise NotRegularFile(f"{path} is {file_kind(st.st_mode)}, not a regular file") from None
        raise
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        raise NotRegularFile(f"{path} is {file_kind(mode)}, not a regular file")
    os.set_blocking(fd, True)
    return fd


def read_regular(path: Path | str, limit: int = -1) -> bytes:
    """The bytes of ``path`` (at most ``limit``) if it is a regular file."""
    with os.fdopen(open_regular(path), "rb") as f:
        return f.read(limit)


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
        os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | _NOFOLLOW, 0o666))
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
        fd = os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY | _NOFOLLOW, 0o666)
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
