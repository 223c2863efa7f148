"""Writing outputs so that a half-written file never takes an output's name."""

from __future__ import annotations

import contextlib
import os
import re
from collections.abc import Iterator
from pathlib import Path

TMP_MARK = "kiln-tmp-"
# The names kiln's writers give a temporary while writing the file NAME: this
# module's and the downloader's (both add 8 random characters).
_TMP_NAME = re.compile(rf"\.(?P<a>.+)\.{TMP_MARK}\w{{8}}.*|\.(?P<b>.+)\.\w{{8}}\.part")


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# Read once, at import, before kiln starts threads (the umask is process-wide).
_UMASK = _read_umask()


def make_readable(path: Path | str) -> None:
    """Give a finished ``mkstemp`` temporary the mode a plainly created file would
    get: ``mkstemp`` makes files only their owner can read."""
    os.chmod(path, 0o666 & ~_UMASK)


@contextlib.contextmanager
def atomic_output(path: Path | str, *, create: bool = True) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` on success,
    remove it on any failure.

    With ``create`` the temporary exists, empty, with the mode a new file gets;
    without, the writer (a subprocess) creates it, which saves a file creation.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # The temporary name keeps the extension: tools such as compilers read it.
    tmp = target.with_name(f".{target.name}.{TMP_MARK}{os.urandom(4).hex()}{target.suffix}")
    if create:
        os.close(os.open(tmp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o666))
    try:
        yield tmp
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _temporaries(directory: str) -> dict[str, list[str]]:
    """The temporary files in ``directory``, by the name of the file they were for."""
    found: dict[str, list[str]] = {}
    with contextlib.suppress(FileNotFoundError, NotADirectoryError):
        for entry in os.scandir(directory):
            match = _TMP_NAME.fullmatch(entry.name)
            if match:
                name = match["a"] or match["b"]
                found.setdefault(name, []).append(os.path.join(directory, entry.name))
    return found


def _unlink_all(paths: list[str]) -> None:
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


def remove_partial(path: Path | str) -> None:
    """Remove ``path`` and the temporaries its interrupted writer left beside it."""
    target = Path(path)
    _unlink_all(_temporaries(str(target.parent)).get(target.name, []))
    target.unlink(missing_ok=True)


class TemporarySweeper:
    """Removes the temporaries that writers killed in an earlier build (kiln itself
    was killed) left beside an output, before its action runs again. Each
    directory is listed once, so a build pays O(entries) in all."""

    def __init__(self) -> None:
        self._listed: dict[str, dict[str, list[str]]] = {}

    def sweep(self, path: Path) -> None:
        directory = str(path.parent)
        if directory not in self._listed:
            self._listed[directory] = _temporaries(directory)
        _unlink_all(self._listed[directory].pop(path.name, []))
