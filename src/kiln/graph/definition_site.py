"""Where in the user's build module a node was defined, for the messages that
tell the user what to change."""

from __future__ import annotations

import os
import sys
from types import CodeType, FrameType

# Frames in kiln's own files are skipped: the site is the user's line.
# kiln's package directory (this module lies in kiln/graph/).
_KILN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_CALLERS_SHOWN = 3


class DefinitionSite:
    """The user's file and line where a node was defined (first frame outside kiln)."""

    __slots__ = ("callers", "filename", "lineno")

    def __init__(
        self, filename: str, lineno: int, callers: tuple[tuple[str, int], ...] = ()
    ) -> None:
        self.filename = filename
        self.lineno = lineno
        # The user's lines that called the site's function directly (a helper that
        # declares an action is named with where each use of it is), innermost first.
        self.callers = callers

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
        return cls(frame.f_code.co_filename, frame.f_lineno, _callers(frame, kiln_dir))

    @classmethod
    def of_function(cls, function: object) -> DefinitionSite | None:
        """Where ``function`` (or what it wraps) is defined: its ``def`` line."""
        code = getattr(getattr(function, "__wrapped__", function), "__code__", None)
        return cls(code.co_filename, code.co_firstlineno) if code is not None else None

    def __str__(self) -> str:
        site = f"{self.filename}:{self.lineno}"
        if not self.callers:
            return site
        shown = (f"line {n}" if f == self.filename else f"{f}:{n}" for f, n in self.callers)
        return f"{site} (called from {', '.join(shown)})"


def _callers(frame: FrameType, kiln_dir: str) -> tuple[tuple[str, int], ...]:
    """The user's frames that called ``frame`` one from the other, up to the first of
    kiln's (an entrypoint's function is called by kiln: it has none)."""
    found: list[tuple[str, int]] = []
    caller = frame.f_back
    while caller is not None and len(found) < _CALLERS_SHOWN:
        name = caller.f_code.co_filename
        if name.startswith(kiln_dir) or name.startswith("<"):
            break
        here = (name, caller.f_lineno)
        if here != (found[-1] if found else (frame.f_code.co_filename, frame.f_lineno)):
            found.append(here)  # a comprehension's frame is on its caller's line
        caller = caller.f_back
    return tuple(found)


def _is_init_of(owner: object, code: CodeType) -> bool:
    """Whether ``code`` is the ``__init__`` of one of ``owner``'s classes."""
    for klass in type(owner).__mro__:
        init = vars(klass).get("__init__")
        if getattr(init, "__code__", None) is code:
            return True
    return False
