"""Writing outputs so that a half-written file never takes an output's name."""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
from collections.abc import Iterator
from pathlib import Path

TMP_MARK = "kiln-tmp-"
# The names kiln's writers give a temporary while writing the file NAME: this
# module's, the downloader's and the IREE tools' (``tempfile`` adds 8 characters).
_TMP_NAME = re.compile(
    rf"\.(?P<a>.+)\.{TMP_MARK}\w{{8}}.*|\.(?P<b>.+)\.\w{{8}}\.part|(?P<c>.+)\.\w{{8}}\.tmp"
)


def _read_umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# Read once, at import, before kiln starts threads (the umask is process-wide).
_UMASK = _read_umask()


def make_readable(path: Path | str) -> None:
    """Give a finished temporary the mode a plainly created file would get:
    ``mkstemp`` makes files only their owner can read."""
    os.chmod(path, 0o666 & ~_UMASK)


@contextlib.contextmanager
def atomic_output(path: Path | str) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it onto ``path`` on success,
    remove it on any failure."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    # The temporary name keeps the extension: tools such as compilers read it.
    fd, tmp = tempfile.mkstemp(
        prefix=f".{target.name}.{TMP_MARK}", suffix=target.suffix, dir=target.parent
    )
    os.close(fd)
    try:
        yield Path(tmp)
        make_readable(tmp)
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
                name = match["a"] or match["b"] or match["c"]
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
