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
        ``owner``'s classes (a user's subclass of an action calls ``super().__init__``)."""
        inits: set[CodeType] = set()
        if owner is not None:
            for klass in type(owner).__mro__:
                code = getattr(vars(klass).get("__init__"), "__code__", None)
                if code is not None:
                    inits.add(code)
        frame = sys._getframe(1)
        while frame.f_back is not None and (
            frame.f_code.co_filename.startswith(_KILN_DIR) or frame.f_code in inits
        ):
            frame = frame.f_back
        return cls(frame.f_code.co_filename, frame.f_lineno)

    def __str__(self) -> str:
        return f"{self.filename}:{self.lineno}"
