"""Run-time dependencies: the project's files that an action reached while it ran
and that its key does not cover, recorded with its result and checked on the next
build (what a Ninja depfile does for the headers a compile read).

What a run reached (``kiln.base.reached``: modules imported, files a model factory
opened) counts when it is the project's: a file that is neither kiln's nor
Python's nor an installed package's (``kiln.planning.code_key.is_user_file``; those are
keyed by their versions), and not a build module loaded by path (keyed by its
code), and not a ``.py`` file that the action's key digests already (an action's
``keyed_sources``: files, or folders whose ``.py`` files it digests, as
``torch_export`` does for a ``"package.module:factory"`` spec of the user's). Each
is recorded among the record's inputs (``kiln.state``) under a key of
its own, ``!imported:<absolute path>`` for a module's file (its source, or the
compiled extension's bytes), ``!opened:<absolute path>`` for a file read, with
the SHA-256 of the file as it was after the run; a file changed since the action
started (its mtime or ctime not before the start) is recorded as changed, so the
next build runs the action again (its result may come from either version).
Missing, not a regular file, unreadable: recorded as such, and compared as such.

The next build checks them after the key and the outputs (``kiln.engine.incremental``):
any that differs runs the action again, and ``kiln explain`` names the file. A
result with run-time dependencies is never put into or taken from the shared
cache (``kiln.engine.cache_step``): its key does not cover them, and another checkout
may hold other versions of those files.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping

from kiln.base.errors import NotRegularFile
from kiln.base.modnames import is_build_module_name
from kiln.base.reached import Reached
from kiln.planning.code_key import is_user_file, library_dirs

IMPORTED = "!imported:"
OPENED = "!opened:"
_WHAT = {IMPORTED: "which it imported while it ran", OPENED: "which it read while it ran"}
# What a file's digest is recorded as when there is none (never 64 hex digits).
DURING = "!changed while it ran"
_MISSING, _IRREGULAR, _UNREADABLE = "!missing", "!not a regular file", "!unreadable"
_STATES = {_MISSING: "is gone", _IRREGULAR: "is not a regular file", _UNREADABLE: "cannot be read"}


def is_run_dep(name: str) -> bool:
    """Whether ``name``, a key of a record's inputs, is a run-time dependency."""
    return name.startswith("!")


class RunDeps:
    """Records and checks run-time dependencies for one build. ``digest(path)`` is
    the state's digest cache (None: missing; raises ``NotRegularFile``).

    Invariant: ``stale`` reads each file at most once per build (as the build's
    source files), ``entries`` afresh after every run."""

    def __init__(self, digest: Callable[[str], str | None]) -> None:
        self._digest = digest
        self._library = library_dirs()
        self._now: dict[str, str] = {}

    def entries(
        self, reached: Reached, started_ns: int, keyed: tuple[str, ...] = ()
    ) -> dict[str, str]:
        """The record entries for what a run that started at ``started_ns`` (the
        wall clock's) reached: the project's files, each by its digest now, but the
        ``.py`` files of ``keyed`` (files and folders the key digests)."""
        found: dict[str, str] = {}
        folders = tuple(os.path.join(k, "") for k in keyed)
        for name, path in reached.modules:
            if path.endswith(".py") and (path in keyed or path.startswith(folders)):
                continue
            if self.is_project_module(name, path):
                found[IMPORTED + path] = self._after(path, started_ns)
        for path in reached.files:
            if is_user_file(path, self._library):
                found[OPENED + path] = self._after(path, started_ns)
        return found

    def is_project_module(self, name: str, path: str) -> bool:
        """Whether the module ``name`` from the file ``path`` counts (see above)."""
        return not is_build_module_name(name) and is_user_file(path, self._library)

    def stale(self, recorded: Mapping[str, str]) -> str | None:
        """Why the run-time dependencies ``recorded`` no longer hold (the first that
        changed, by name), or None when every file is as recorded."""
        for name in sorted(recorded):
            kind = IMPORTED if name.startswith(IMPORTED) else OPENED
            path = name[len(kind) :]
            was = recorded[name]
            shown = f"{_shown(path)}, {_WHAT[kind]},"
            if was == DURING:
                return f"{shown} changed while it ran"
            now = self._now.get(path)
            if now is None:
                now = self._now[path] = self._state(path)
            if now != was:
                return f"{shown} {_STATES.get(now, 'changed')}"
        return None

    def _after(self, path: str, started_ns: int) -> str:
        state = self._state(path)
        try:
            st = os.stat(path)
        except OSError:
            return state
        if max(st.st_mtime_ns, st.st_ctime_ns) >= started_ns:
            return DURING
        return state

    def _state(self, path: str) -> str:
        """The file's digest, or what stands for it when it has none."""
        try:
            digest = self._digest(path)
        except NotRegularFile:
            return _IRREGULAR
        except OSError:
            return _UNREADABLE
        return _MISSING if digest is None else digest


def _shown(path: str) -> str:
    """``path`` relative to the working directory when it lies below it."""
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return path if rel.startswith("..") else rel
