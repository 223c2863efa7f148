"""Action logs: what a subprocess prints goes straight to a file, never through
kiln's memory, and a failure shows a tail of it bounded in bytes and lines.

Logs live in ``OUTPUT_DIR/.kiln/logs/<output path>.log`` (one per action, named
after its first output, replaced each time the action runs).
"""

from __future__ import annotations

import fcntl
import os
import stat
from pathlib import Path

from kiln.errors import ActionFailed

TAIL_BYTES = 8 << 10
TAIL_LINES = 20


def log_path(output_dir: Path, graph_path: str) -> Path:
    """Where the log of the action producing ``graph_path`` goes."""
    return output_dir / ".kiln" / "logs" / f"{graph_path}.log"


def open_log(path: Path | str, header: str = "") -> int:
    """Create or empty the log at ``path``, write ``header``, and return a descriptor
    open for writing.

    The one place kiln opens a log: it never follows a symlink at ``path``
    (``O_NOFOLLOW``), never blocks on a FIFO, and writes only to a regular file.
    """
    target = Path(path)
    flags = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, flags, 0o644)
    except OSError as e:
        reason = "it is a symbolic link" if os.path.islink(target) else e.strerror
        raise ActionFailed(f"cannot write the log {target}: {reason}") from e
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise ActionFailed(f"cannot write the log {target}: it is not a regular file")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
        os.ftruncate(fd, 0)
        os.write(fd, header.encode())
    except OSError as e:
        os.close(fd)
        raise ActionFailed(f"cannot write the log {target}: {e.strerror}") from e
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_tail(path: Path | str, max_bytes: int = TAIL_BYTES, max_lines: int = TAIL_LINES) -> str:
    """The last ``max_lines`` lines of the log, at most ``max_bytes`` of it; what is left
    out (earlier lines, or the start of one huge line) is said once, in a first line."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            start = max(0, size - max_bytes)
            f.seek(start)
            data = f.read(max_bytes)
    except OSError as e:
        return f"[cannot read the log {path}: {e.strerror}]"
    data = data.rstrip(b"\n")
    skipped = start
    lines = data.split(b"\n")
    if start and len(lines) > 1:  # the first line read is a piece of a longer one
        skipped += len(lines[0]) + 1
        lines = lines[1:]
    if len(lines) > max_lines:
        skipped += sum(len(line) + 1 for line in lines[:-max_lines])
        lines = lines[-max_lines:]
    text = b"\n".join(lines).decode(errors="replace")
    if skipped:
        text = f"[... {skipped} earlier bytes not shown; the whole output is in {path}]\n{text}"
    return text
