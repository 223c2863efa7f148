"""Where in the user's build module a node was defined, for the messages that
tell the user what to change."""

from __future__ import annotations

import os
import sys
from types import CodeType

# Frames in kiln's own files are skipped: the site is the user's line.
_KILN_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep


class DefinitionSite:
    """The user's file and line where a node was defined (first frame outside kiln)."""

    __slots__ = ("filename", "lineno")

    def __init__(self, filename: str, lineno: int) -> None:
        self.filename = filename
        self.lineno = lineno

    @classmethod
    def capture(cls, owner: object = None) -> DefinitionSite:
        """The first caller outside kiln and outside the ``__init__`` methods of
        ``owner``'s classes (a user's subclass of an action calls ``super().__init__``).

        Called for every node of the graph: the walk compares file names only, and
        looks at ``owner``'s classes only for a frame of an ``__init__`` outside kiln."""
        frame = sys._getframe(1)
        kiln_dir = _KILN_DIR
        while frame.f_back is not None:
            code = frame.f_code
            if not code.co_filename.startswith(kiln_dir) and (
                owner is None or code.co_name != "__init__" or not _is_init_of(owner, code)
            ):
                break
            frame = frame.f_back
        return cls(frame.f_code.co_filename, frame.f_lineno)

    @classmethod
    def of_function(cls, function: object) -> DefinitionSite | None:
        """Where ``function`` (or what it wraps) is defined: its ``def`` line."""
        code = getattr(getattr(function, "__wrapped__", function), "__code__", None)
        return cls(code.co_filename, code.co_firstlineno) if code is not None else None

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno}"


def _is_init_of(owner: object, code: CodeType) -> bool:
    """Whether ``code`` is the ``__init__`` of one of ``owner``'s classes."""
    for klass in type(owner).__mro__:
        init = vars(klass).get("__init__")
        if getattr(init, "__code__", None) is code:
            return True
    return False
