"""``import iree.build`` resolved to kiln while kiln loads and runs a build.

Build modules written for IREE's ``iree.build`` import it (``from iree.build import
*``, ``from iree.build.executor import BuildAction``), and so do the action
libraries they use (iree-turbine's ``build_actions``, shortfin's ``utils``), which
no edit of the user's module reaches. While kiln runs, a finder at the front of
``sys.meta_path`` answers ``iree.build`` and ``iree.build.<name>`` with kiln's
compatible modules: the files of ``kiln/iree_build/`` executed under those names,
which hold kiln's own objects (``iree.build.executor.BuildAction`` is
``kiln.graph.BuildAction``). kiln's worker processes install it too (``install``)
when the build that sends them work has it.

Nothing outside kiln's run is changed: ``activated`` counts its users (nested
and concurrent runs share one finder), and when the last one ends the process is
as it was, but for kiln's own modules:

- entries of ``sys.modules`` named ``iree.build``/``iree.build.*`` that were there
  before (IREE's own package), and the ``build`` attribute of the ``iree``
  package, are set aside for the run and put back after it;
- modules imported before the run that hold IREE's iree.build objects (a library
  first imported against IREE's package) are set aside too, so that the build
  imports them afresh against kiln, and are put back after;
- modules first imported during the run that hold kiln's objects are taken out of
  ``sys.modules`` (and their parent package) when it ends, so that a later import
  loads them against whatever ``iree.build`` is then.

The process-wide finder is shared by every thread, so one lock (``_LOCK``) guards
installing and removing it.
"""

from __future__ import annotations

import contextlib
import importlib.machinery
import importlib.util
import os
import sys
import threading
import warnings
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from pathlib import Path
from types import ModuleType
from typing import Any

# Set to 1 (or give --no-iree-build-shim) to let build modules import IREE's own package.
NO_SHIM_ENV = "KILN_NO_IREE_BUILD_SHIM"
PACKAGE = "iree.build"
# iree.build's modules (iree-base-compiler 3.13), each a file of kiln/iree_build/.
SUBMODULES = frozenset(
    {
        "args",
        "compile_actions",
        "console",
        "executor",
        "lang",
        "main",
        "metadata",
        "net_actions",
        "onnx_actions",
        "target_machine",
        "test_actions",
    }
)
_HERE = Path(__file__).resolve().parent.parent / "iree_build"
_ABSENT = object()
_LOCK = threading.Lock()
# Whether the run in this context wants the shim (None: not decided, see ``wanted``).
_WANTED: ContextVar[bool | None] = ContextVar("kiln_iree_build_shim", default=None)


def wanted() -> bool:
    """Whether a build run now should have the shim: as the command running in this
    context decided, else unless ``KILN_NO_IREE_BUILD_SHIM`` is set."""
    decided = _WANTED.get()
    if decided is not None:
        return decided
    return os.environ.get(NO_SHIM_ENV, "").strip() in ("", "0")


def active() -> bool:
    """Whether ``iree.build`` imports resolve to kiln in this process now."""
    return any(isinstance(f, _Finder) for f in sys.meta_path)


@contextlib.contextmanager
def activated(enabled: bool | None = None) -> Iterator[None]:
    """While the block runs, ``iree.build`` imports resolve to kiln (unless
    ``enabled`` is False, or None and ``wanted()`` says no)."""
    on = wanted() if enabled is None else enabled
    token = _WANTED.set(on)
    try:
        if not on:
            yield
            return
        with _LOCK:
            finder = next((f for f in sys.meta_path if isinstance(f, _Finder)), None)
            if finder is None:
                finder = _Finder()
                finder.install()
            finder.users += 1
        try:
            yield
        finally:
            with _LOCK:
                finder.users -= 1
                if finder.users == 0:
                    finder.uninstall()
    finally:
        _WANTED.reset(token)


def install() -> None:
    """Make ``iree.build`` resolve to kiln for the rest of this process (a worker
    process running one action of a build that has the shim)."""
    if not active():
        finder = _Finder()
        finder.install()
        finder.users = 1


def _is_alias(name: str) -> bool:
    return name == PACKAGE or name.startswith(PACKAGE + ".")


class _Finder:
    """Finds ``iree.build`` and its modules in ``kiln/iree_build/``; and ``iree``
    itself, as an empty namespace package, when no ``iree`` package is installed.

    Invariant: while it is on ``sys.meta_path``, ``sys.modules`` holds no module
    named ``iree.build*`` but those it loaded; ``_saved`` holds what it set aside.
    """

    def __init__(self) -> None:
        self.users = 0
        self._saved: dict[str, ModuleType] = {}
        self._saved_attrs: list[tuple[ModuleType, str, Any]] = []
        self._before: set[str] = set()
        self._made_iree = False

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == PACKAGE:
            return importlib.util.spec_from_file_location(
                fullname, _HERE / "__init__.py", submodule_search_locations=[]
            )
        if fullname.startswith(PACKAGE + ".") and fullname[len(PACKAGE) + 1 :] in SUBMODULES:
            return importlib.util.spec_from_file_location(
                fullname, _HERE / f"{fullname[len(PACKAGE) + 1 :]}.py"
            )
        if fullname == "iree" and importlib.machinery.PathFinder.find_spec("iree") is None:
            self._made_iree = True
            return importlib.machinery.ModuleSpec("iree", None, is_package=True)
        return None

    def install(self) -> None:
        saved = {n: m for n, m in sys.modules.items() if _is_alias(n)}
        for name in saved:
            del sys.modules[name]
        if saved:  # IREE's package was imported: what holds its objects waits too
            for name in _holders(sys.modules, _is_alias, exclude=set(saved)):
                saved[name] = sys.modules.pop(name)
        self._saved = saved
        for name in saved:
            self._detach(name, saved[name])
        self._before = set(sys.modules)
        sys.meta_path.insert(0, self)

    def uninstall(self) -> None:
        with contextlib.suppress(ValueError):
            sys.meta_path.remove(self)
        new = {n: sys.modules[n] for n in set(sys.modules) - self._before if n in sys.modules}
        doomed = [n for n in new if _is_alias(n)]
        doomed += _holders(new, _is_kiln_name, exclude=set(doomed))
        if self._made_iree and sys.modules.get("iree") is new.get("iree"):
            doomed.append("iree")
        for name in doomed:
            module = sys.modules.pop(name, None)
            if module is not None:
                self._detach(name, module, restore=False)
        for parent, attr, value in reversed(self._saved_attrs):
            if value is _ABSENT:
                with contextlib.suppress(AttributeError):
                    delattr(parent, attr)
            else:
                setattr(parent, attr, value)
        sys.modules.update(self._saved)
        self._saved, self._saved_attrs = {}, []

    def _detach(self, name: str, module: ModuleType, restore: bool = True) -> None:
        """Take ``module`` off its parent package's attributes (to be put back at the
        end when ``restore``), so that ``from parent import name`` imports afresh."""
        parent_name, _, attr = name.rpartition(".")
        parent = sys.modules.get(parent_name) if parent_name else None
        if parent is None or parent.__dict__.get(attr, _ABSENT) is not module:
            return
        if restore:
            self._saved_attrs.append((parent, attr, module))
        delattr(parent, attr)


def _is_kiln_name(name: str) -> bool:
    return name == "kiln" or name.startswith("kiln.") or _is_alias(name)


def _holders(modules: dict[str, ModuleType], owned: Any, exclude: set[str]) -> list[str]:
    """The modules of ``modules`` (not kiln's own, not a build module kiln loaded,
    not ``__main__``) whose globals hold a module (other than one of their own
    submodules), class or function whose module name ``owned`` accepts. Looking
    is silent: a library's deprecated global warns when its type is asked
    (torch 2.13's ``torch.distributed.reduce_op``), and the user did not touch it."""
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name, module in list(modules.items()):
            if name in exclude or _is_kiln_name(name) or name.startswith("kiln_build_"):
                continue
            if name == "__main__" or not isinstance(module, ModuleType):
                continue
            if any(owned(home) for home in _homes(name, module)):
                found.append(name)
    return found


def _homes(name: str, module: ModuleType) -> Iterator[str]:
    """The module names of what ``module``'s globals hold: modules (not its own
    submodules), classes and functions; a value that cannot say is skipped."""
    for value in list(getattr(module, "__dict__", {}).values()):
        home: Any
        try:
            if isinstance(value, ModuleType):
                home = value.__name__
                if home.startswith(name + "."):  # a package's own submodule: not held
                    continue
            elif isinstance(value, type) or callable(value):
                home = getattr(value, "__module__", None)
            else:
                continue
        except Exception:  # noqa: BLE001 - a library's odd object: not kiln's or IREE's
            continue
        if isinstance(home, str):
            yield home
