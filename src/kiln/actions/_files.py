"""Writing outputs so that a half-written file never takes an output's name."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

TMP_MARK = "kiln-tmp-"


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
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
