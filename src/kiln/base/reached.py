"""What a run of an action's code reached that was not known before it ran: the
modules it imported and, while a model factory runs (``watching_opens``), the
files it opened for reading. Plain data, collected where the code runs (a worker
process, or kiln's own); ``kiln.planning.run_deps`` keeps the project's among them with
the action's record and checks them on the next build, as Ninja's depfiles
record the headers a compile read.

- Modules: the entries of ``sys.modules`` that appeared while the code ran
  (``ModuleWatch``), each with its file. In a worker process, which runs one
  action, that is exactly what the action imported. In kiln's own process
  ``sys.modules`` is shared by every thread: the dispatcher attributes every
  module imported since the build started to every in-process action that
  finishes after the import (``kiln.engine.dispatch``), which may count a
  module for an action that never used it, never the other way round.
- Files: the audit hook sees every ``open()`` and ``os.open()`` of the thread
  that entered ``watching_opens`` (a ``ContextVar``: a thread the factory starts
  is not seen), for reading (``r`` or ``r+``), of a path that names a file:
  not a descriptor, not ``/proc``, ``/sys`` or ``/dev``, not module code
  (``.py``, ``.pyc``, extensions: counted as modules), not the files the factory
  was given (keyed already), and, in a recorded run, not under the worker's own
  ``HOME`` and ``TMPDIR`` (kiln's scratch directory: ``kiln.base.action_env``).
"""

from __future__ import annotations

import contextlib
import functools
import importlib.machinery
import os
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from kiln.base.errors import ToolError

_PSEUDO = ("/proc/", "/sys/", "/dev/")
_CODE_SUFFIXES = (*importlib.machinery.all_suffixes(), ".pyc")


@dataclass
class Reached:
    """Modules imported (``(name, file)``) and files opened (absolute paths) by one
    run; neither filtered to the project's yet (``kiln.planning.run_deps`` does that)."""

    modules: list[tuple[str, str]] = field(default_factory=list)
    files: list[str] = field(default_factory=list)

    def note_failure(self, error: BaseException) -> None:
        """Add the files of the code that ``error`` (and what it was raised from)
        went through: a module whose import failed is no longer in ``sys.modules``,
        and the fix of any of them may mend the failure."""
        seen = {path for _, path in self.modules}
        for path in _traceback_files(error):
            if path not in seen:
                seen.add(path)
                self.modules.append(("", path))

    def as_data(self) -> tuple[list[tuple[str, str]], list[str]]:
        """Plain lists, as a worker's reply carries them."""
        return self.modules, self.files

    @classmethod
    def from_data(cls, data: Any) -> Reached:
        """What ``as_data`` gave, checked (a worker's reply is data, not trusted)."""
        try:
            modules, files = data
            found = cls(
                [(str(n), str(f)) for n, f in modules if type(n) is str and type(f) is str],
                [f for f in files if type(f) is str],
            )
        except (TypeError, ValueError):
            return cls()
        return found


def _traceback_files(error: BaseException, most: int = 16) -> list[str]:
    """The source files of the frames of ``error``'s traceback and of those it was
    raised from or while handling (``most`` exceptions at most)."""
    found: list[str] = []
    chain: list[BaseException] = []
    e: BaseException | None = error
    while e is not None and e not in chain and len(chain) < most:
        chain.append(e)
        tb = e.__traceback__
        while tb is not None:
            path = tb.tb_frame.f_code.co_filename
            if not path.startswith("<"):
                found.append(os.path.abspath(path))
            tb = tb.tb_next
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return found


class ModuleWatch:
    """The modules imported since it was made.

    Invariant: ``loaded`` lists every module in ``sys.modules`` now that was not
    there when the watch was made, has a file and is one ``keep(name, file)``
    keeps (all, without ``keep``); it rescans ``sys.modules`` only when its size
    or last entry changed since the last scan (a build of many in-process
    actions that import nothing pays nothing per action)."""

    def __init__(self, keep: Callable[[str, str], bool] | None = None) -> None:
        self._keep = keep or (lambda name, path: True)
        self._before = frozenset(sys.modules)
        self._seen: tuple[int, str | None] = (len(self._before), _last_name())
        self._found: list[tuple[str, str]] = []
        self._lock = threading.Lock()  # in-process actions finish on several threads

    def loaded(self) -> list[tuple[str, str]]:
        with self._lock:
            now = (len(sys.modules), _last_name())
            if now != self._seen:
                modules = dict(sys.modules)  # one atomic copy: other threads import too
                keep = self._keep
                self._found = [
                    (name, path)
                    for name, module in modules.items()
                    if name not in self._before
                    and (path := _file_of(module)) is not None
                    and keep(name, path)
                ]
                self._seen = now
            return list(self._found)


def _last_name() -> str | None:
    return next(reversed(sys.modules), None)


def _file_of(module: Any) -> str | None:
    """A module's file, read from its namespace (a lazy module's ``__getattr__``
    would import it)."""
    namespace = getattr(module, "__dict__", None)
    path = namespace.get("__file__") if isinstance(namespace, dict) else None
    return os.path.abspath(path) if isinstance(path, str) else None


class _Opens:
    """The files opened for reading while a factory runs (see the module docstring)."""

    def __init__(self, exclude: Iterable[str], scratch: tuple[str, ...]) -> None:
        self.exclude = frozenset(os.path.abspath(p) for p in exclude)
        self.scratch = scratch
        self.files: list[str] = []

    def saw(self, args: tuple[Any, ...]) -> None:
        path, _, flags = args
        if isinstance(path, int) or (
            isinstance(flags, int) and flags & os.O_ACCMODE == os.O_WRONLY
        ):
            return  # a descriptor, or opened for writing only
        if not isinstance(path, str | bytes):
            return
        path = os.path.abspath(os.fsdecode(path))
        if (
            path.startswith(_PSEUDO)
            or path.endswith(_CODE_SUFFIXES)
            or path in self.exclude
            or (self.scratch and os.path.realpath(path).startswith(self.scratch))
            or path in self.files
        ):
            return
        self.files.append(path)


# The files opened by the factory running in this context; the run's collector.
_OPENS: ContextVar[_Opens | None] = ContextVar("kiln_reached_opens", default=None)
_RUN: ContextVar[Reached | None] = ContextVar("kiln_reached_run", default=None)


def _on_audit(event: str, args: tuple[Any, ...]) -> None:
    if event != "open":
        return
    opens = _OPENS.get()
    if opens is not None:
        with contextlib.suppress(Exception):  # an audit hook must never fail an open
            opens.saw(args)


@functools.cache
def _audit_hook_installed() -> bool:
    """Install the hook, once per process (it cannot be removed: only the worker
    processes that run a factory ever install it)."""
    sys.addaudithook(_on_audit)
    return True


@contextlib.contextmanager
def recording(found: Reached) -> Iterator[None]:
    """Collect into ``found`` what the code run in the block reaches, also when it
    raises: the modules it imports and the files that ``watching_opens`` sees (a
    worker runs its thunk in this)."""
    watch = ModuleWatch()
    token = _RUN.set(found)
    try:
        yield
    except BaseException as e:
        found.modules = watch.loaded()
        found.note_failure(e)
        raise
    else:
        found.modules = watch.loaded()
    finally:
        _RUN.reset(token)


def _scratch_dirs() -> tuple[str, ...]:
    """The directories of a worker's own (its ``HOME`` and ``TMPDIR``: kiln's)."""
    found = (os.environ.get(name) for name in ("HOME", "TMPDIR"))
    return tuple(os.path.join(os.path.realpath(d), "") for d in found if d)


@contextlib.contextmanager
def watching_opens(given: Iterable[str], what: str) -> Iterator[None]:
    """The files opened for reading in the block (but ``given``, keyed already) are
    dependencies of the run being recorded; outside a recorded run (nothing
    could check them on the next build) the first one is a
    ``ToolError`` naming it and ``what`` read it."""
    _audit_hook_installed()
    run = _RUN.get()
    opens = _Opens(given, _scratch_dirs() if run is not None else ())
    token = _OPENS.set(opens)
    try:
        yield
    finally:
        _OPENS.reset(token)
    if run is not None:
        run.files.extend(f for f in opens.files if f not in run.files)
    elif opens.files:
        raise ToolError(
            f"{what} read {opens.files[0]}, which it was not given: declare it "
            "(weights=[...] for a torch_export model) so that kiln keys its content"
        )
