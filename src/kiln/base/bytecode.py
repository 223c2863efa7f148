"""No ``__pycache__`` beside the user's sources: while the user's code runs in kiln's
process (a build module loading, an entrypoint called, an in-process action's
work), Python writes no bytecode.

kiln writes only into its output and cache directories, and what a user's module
imports is the user's tree. The windows nest and overlap (thread actions run side
by side), so they are counted: the flag is set while any is open and restored to
what it was when the last one closes. kiln's own modules imported outside them
keep their bytecode (a no-op build stays fast from a source checkout); one imported
inside is compiled on each run instead, a small cost.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from collections.abc import Iterator

_lock = threading.Lock()
_open = 0
_before = False


@contextlib.contextmanager
def user_code() -> Iterator[None]:
    """While the block runs (the user's code), Python writes no bytecode."""
    global _open, _before
    with _lock:
        if _open == 0:
            _before = sys.dont_write_bytecode
            sys.dont_write_bytecode = True
        _open += 1
    try:
        yield
    finally:
        with _lock:
            _open -= 1
            if _open == 0:
                sys.dont_write_bytecode = _before
