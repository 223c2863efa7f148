"""kiln's version, in its own module so that the core reads it without importing
the package's public facade; and the digest of kiln's own code, which keys kiln's
own actions (``kiln.planning.action_key``): a version string stays the same while
the code under it changes, and a result made by other code is another result."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path

__version__ = "0.1.0"

# The layers above the engine read and show builds; they never make an action's output.
_NOT_IN_OUTPUTS = frozenset({"cli", "compare", "observe"})


@functools.cache
def code_digest() -> str:
    """The SHA-256 of the source of every kiln module that can shape what an action
    produces (all but ``_NOT_IN_OUTPUTS``), by path below the package and content: the
    same on any machine that runs the same code, installed or in a checkout. Read
    once per process (about 10 ms); ``unread`` where the source cannot be read (a
    zipped install), and kiln's version alone keys its actions there."""
    root = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    try:
        files = sorted(
            (p.relative_to(root).as_posix(), p)
            for p in root.rglob("*.py")
            if p.relative_to(root).parts[0] not in _NOT_IN_OUTPUTS
        )
        for name, path in files:
            digest.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    except OSError:
        return "unread"
    return digest.hexdigest() if files else "unread"


def identity() -> str:
    """Which kiln this is, as a Dask worker is asked it: the version and the start of
    the code digest (two kilns of one version with other code build other results)."""
    return f"{__version__} (code {code_digest()[:12]})"
