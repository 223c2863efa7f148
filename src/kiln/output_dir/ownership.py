"""Whose the output directory is, and how kiln opens its own files there and
reads outputs (the trust model is in ``kiln.output_dir``'s docstring)."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import re
import sqlite3
import stat
import time
from collections.abc import Callable, Collection
from pathlib import Path

from kiln.base.errors import NotRegularFile, StateError, UsageError
from kiln.output_dir.prefilled import USER_FILES, is_prefilled, list_user_files
from kiln.output_dir.writing import NOFOLLOW, atomic_write, file_kind, is_temporary, link_text

KILN_DIR = ".kiln"
MARKER = "format"
FORMAT_NAME = "kiln-output"
FORMAT_VERSION = 1
NAME_MAX = 255
PATH_MAX = 4096
STATE_DB = "state.db"
# The names kiln gives in .kiln/ (besides its marker, its temporaries and the
# copies of a damaged state): what a kiln from before the marker left there.
_OWN_NAMES = frozenset(
    {"lock", STATE_DB, "state.db-wal", "state.db-shm", "logs", "tmp", USER_FILES}
)
_CORRUPT_COPY = re.compile(r"state\.db\.corrupt-\d{8}-\d{6}")
# A lone surrogate: what ``os.fsdecode`` makes of a byte that is not UTF-8
# (U+DC80-U+DCFF), or one a string spelled itself; UTF-8 cannot encode either.
_SURROGATE = re.compile("[\ud800-\udfff]")


def non_utf8(path: str) -> str | None:
    """What in ``path`` is not UTF-8 text (``byte 0xff``), or None. The output
    directory's paths and the output names are recorded as text (the state,
    the manifest, the logs), so they must be UTF-8."""
    bad = _SURROGATE.search(path)
    if bad is None:
        return None
    code = ord(bad.group())
    return f"byte 0x{code - 0xDC00:02x}" if code >= 0xDC80 else f"lone surrogate U+{code:04X}"


# -- ownership -------------------------------------------------------------------


def _refuse(root: Path, why: str) -> UsageError:
    return UsageError(
        f"refusing to use {root} as the output directory: {why}; kiln writes only into "
        "a new, empty or kiln-made directory: choose another with --output-dir"
    )


def output_dir_state(root: Path) -> str:
    """``missing``, ``empty``, ``prefilled`` (``kiln.output_dir.prefilled``) or ``kiln`` for an
    output directory kiln may use; raise
    UsageError (naming it and ``--output-dir``) for any other, StateError when it
    cannot be a directory. Reads only."""
    bad = non_utf8(str(root))
    if bad is not None:
        raise UsageError(
            f"refusing to use {str(root)!r} as the output directory: its path holds the "
            f"{bad}, which is not UTF-8, and kiln records the paths there as UTF-8 text; "
            "choose another with --output-dir (or rename the directory)"
        )
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
    try:
        why = marker_problem(kiln_dir, FORMAT_NAME, FORMAT_VERSION)
    except FileNotFoundError:
        if _unmarked_is_kilns(kiln_dir):
            return  # killed while claiming it, or made by a kiln before the marker
        raise _refuse(
            root, f"{kiln_dir} has no {MARKER} and holds files kiln did not make"
        ) from None
    if why is not None:
        raise _refuse(root, why)


def marker_problem(kiln_dir: Path, format_name: str, format_version: int) -> str | None:
    """Why the marker in ``kiln_dir`` (``MARKER``, holding ``NAME/VERSION``) does not
    mark a directory of ``format_name`` that this kiln reads (``format_version`` or
    older), or None when it does. FileNotFoundError when there is no marker: what
    that means (a claim killed before its marker, or one under way) is the caller's
    to judge. Used for the output directory and the cache alike."""
    marker = kiln_dir / MARKER
    try:
        text = read_regular(marker, limit=256).decode(errors="replace").strip()
    except FileNotFoundError:
        raise
    except (NotRegularFile, OSError) as e:
        return f"its marker {marker} is unreadable ({e})"
    name, _, version = text.partition("/")
    if name != format_name or not version.isdigit():
        return f"its marker {marker} says {text[:40]!r}, not {format_name}"
    if int(version) > format_version:
        return f"it was made by a newer kiln (format {version})"
    return None


def _unmarked_is_kilns(kiln_dir: Path) -> bool:
    """Whether ``kiln_dir``, a ``.kiln/`` without the marker, is kiln's: every name in
    it is one kiln gives, matched whole, and it is what a claim killed before its
    marker leaves (kiln's temporaries, the list of the user's files) or holds a
    kiln state database. A name of kiln's alone proves nothing: another program's
    ``.kiln/`` may hold a ``lock`` or a ``state.db``."""
    names = set(os.listdir(kiln_dir))
    if not all(n in _OWN_NAMES or is_corrupt_copy(n) or is_temporary(n) for n in names):
        return False
    if {n for n in names if not is_temporary(n)} <= {USER_FILES}:
        return USER_FILES not in names or _is_user_files(kiln_dir / USER_FILES)
    return STATE_DB in names and _is_state_db(kiln_dir / STATE_DB)


def _is_user_files(path: Path) -> bool:
    """Whether ``path`` holds what kiln writes as ``user-files``: a JSON list of paths."""
    try:
        found = json.loads(read_regular(path, limit=64 << 20))
    except (NotRegularFile, OSError, ValueError):
        return False
    return isinstance(found, list) and all(isinstance(p, str) for p in found)


def _is_state_db(path: Path) -> bool:
    """Whether ``path`` is a regular file holding a kiln state database (its ``meta``
    says ``app`` = ``kiln``). Read through the descriptor opened here, in SQLite's
    immutable mode: nothing is created, locked or written."""
    try:
        fd = open_regular(path)
    except (NotRegularFile, OSError):
        return False
    try:
        uri = f"file:/proc/self/fd/{fd}?mode=ro&immutable=1"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
            rows = db.execute("SELECT value FROM meta WHERE name = 'app'").fetchall()
    except sqlite3.Error:
        return False
    finally:
        os.close(fd)
    return rows == [("kiln",)]


def is_corrupt_copy(name: str) -> bool:
    """Whether ``name`` is one ``corrupt_copy_name`` gives (and kiln may remove)."""
    return _CORRUPT_COPY.fullmatch(name) is not None


def check_takeover(root: Path, writes: Callable[[], Collection[str]]) -> None:
    """Refuse to take over a filled directory (``prefilled``) that holds a file the
    build would write (``writes()``: paths relative to ``root``, asked only for such a
    directory: not on every build): such a directory was
    built by another tool (iree.build writes no marker when it fetches nothing), not
    filled with inputs by hand, and every action writing there would fail on a file
    that is not kiln's. Reads only; nothing for a directory of another state."""
    if output_dir_state(root) != "prefilled":
        return
    taken = sorted(set(list_user_files(root)) & set(writes()))
    if taken:
        more = f" (and {len(taken) - 1} more)" if len(taken) > 1 else ""
        raise UsageError(
            f"refusing to take over {root} as the output directory: it holds {taken[0]}"
            f"{more}, which this build writes, so it was built by another tool (iree.build?), "
            "not filled with your inputs; kiln never writes over a file it did not make: "
            "choose another --output-dir (or remove those files to keep the rest as inputs)"
        )


def corrupt_copy_name() -> str:
    """The name in ``.kiln/`` of the copy of a damaged state database, moved aside now."""
    return f"state.db.corrupt-{time.strftime('%Y%m%d-%H%M%S')}"


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
        fd = os.open(path, flags | NOFOLLOW | os.O_NONBLOCK, mode)
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


def open_regular(
    path: Path | str, *, follow: bool = False, flags: int = os.O_RDONLY, mode: int = 0o666
) -> int:
    """A descriptor of ``path`` (opened with ``flags``, read-only unless told, and
    ``mode`` for a file it creates) if it is a regular file; else NotRegularFile,
    and what is there is left as it was. Never blocks on a FIFO; with ``follow``
    false never follows a final symlink."""
    flags |= os.O_NONBLOCK | os.O_CLOEXEC | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, mode)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise NotRegularFile(f"{path} is a symbolic link, not a regular file") from None
        if e.errno in (errno.ENXIO, errno.EISDIR):  # a FIFO or socket; a directory
            st = os.lstat(path)
            raise NotRegularFile(f"{path} is {file_kind(st.st_mode)}, not a regular file") from None
        raise
    kind = os.fstat(fd).st_mode
    if not stat.S_ISREG(kind):
        os.close(fd)
        raise NotRegularFile(f"{path} is {file_kind(kind)}, not a regular file")
    os.set_blocking(fd, True)
    return fd


def read_regular(path: Path | str, limit: int = -1) -> bytes:
    """The bytes of ``path`` (at most ``limit``) if it is a regular file."""
    with os.fdopen(open_regular(path), "rb") as f:
        return f.read(limit)
