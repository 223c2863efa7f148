"""Digests of the code an action runs, for its key.

A user's code is every function and class whose source file is neither kiln's
nor part of the Python installation (the standard library, site-packages):
build modules, whether imported or loaded by path, and the user's helper
modules. Its digest is taken from bytecode — ``co_code``, constants (nested code
objects recursively), names and argument layout, not line numbers — so it is
stable for one Python version (the version is part of every digest) and moving a
function or editing a comment elsewhere changes nothing.

- A user function: its code, default values, closure values, and the globals its
  code names: user functions and classes by their digests (recursively), plain
  data by its canonical form, an object of a user class by its class and its
  attributes, anything else by its type. A user module it names (``helpers``
  in ``helpers.double(21)``) counts by the attributes of that module that the
  code may load, that is every name the code uses (``double``, and ``SCALE`` in
  ``helpers.SCALE``), each keyed by these same rules: so editing a helper reruns
  exactly the actions whose code reaches it, however deep.
- An installed package's module, function or class: its name and the version of
  the distribution that installed it (the standard library's: Python's version).
- A compiled extension module of the user's (a ``.so`` beside their code), its
  functions and its classes: also the SHA-256 of the extension's file, since
  its code has no bytecode to digest: rebuilding it reruns what reaches it.
- A user class: the functions (``__init__`` and every other method, static and
  class methods, properties) and the data attributes it defines itself. The
  global data that ``__init__`` reads is left out: ``__init__`` runs when the
  graph is defined, and what it keeps is in the instance's attributes, keyed by
  their own rules; the global data the other methods read is in.
- kiln's own code: kiln's version and the digest of its source (``kiln_code_digest``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.machinery
import os
import sys
import sysconfig
import types
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from kiln.base.errors import NotRegularFile, Unkeyable
from kiln.base.modnames import stable_module_name
from kiln.graph import BuildFile
from kiln.output_dir.digests import hash_file
from kiln.planning.canonical import canonical, dumps, qualname

# kiln's package directory (this module lies in kiln/planning/).
_KILN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_PY = f"python {sys.version_info[0]}.{sys.version_info[1]}"
_EXTENSIONS = tuple(importlib.machinery.EXTENSION_SUFFIXES)


# The layers above the engine read and show builds; they never make an action's output.
_NOT_IN_OUTPUTS = frozenset({"cli", "compare", "observe"})


@functools.cache
def kiln_code_digest() -> str:
    """The SHA-256 of the source of every kiln module that can shape what an action
    produces (all but ``_NOT_IN_OUTPUTS``), by path below the package and content: the
    same on any machine that runs the same code, installed or in a checkout; it keys
    kiln's own actions (``kiln.planning.action_key``) and kiln's code that a user's
    action calls (``_version_of``), since a version string stays the same while the
    code under it changes. ``.py`` files that are regular files, through links too (an
    editable install or a runfiles tree links every file), none whose name starts with
    a dot (an editor's lock file); a file that cannot be read counts by its name and
    the error, so the digest still follows every other file. Read once per process
    (about 10 ms). Where there is no source to read (a zipped or a bytecode-only
    install) it is made anew in each process: nothing kiln's code made is then taken
    for the result of an earlier process, and a Dask worker is never taken for one
    running the same kiln."""
    root = Path(_KILN_DIR)
    digest = hashlib.sha256()
    found = 0
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] in _NOT_IN_OUTPUTS or any(p.startswith(".") for p in rel.parts):
            continue
        if not path.is_file():  # a FIFO, a dangling link, a directory named x.py
            continue
        digest.update(f"{rel.as_posix()}\0{_file_digest(str(path))}\0".encode())
        found += 1
    return digest.hexdigest() if found else f"unread {uuid.uuid4().hex}"


@functools.cache
def library_dirs() -> tuple[str, ...]:
    """The directories whose code is not the user's: kiln's, the standard library's
    and the installed packages' (``is_user_file``'s ``library``)."""
    paths = sysconfig.get_paths()
    found = {_KILN_DIR}
    for name in ("stdlib", "platstdlib", "purelib", "platlib"):
        if name in paths:
            found.add(os.path.realpath(paths[name]) + os.sep)
            found.add(os.path.abspath(paths[name]) + os.sep)
    return tuple(sorted(found))


def is_user_file(filename: str, library: tuple[str, ...]) -> bool:
    """Whether code from ``filename`` is the user's (not kiln's, not installed)."""
    if filename.startswith("<"):  # <frozen ...>, <string>: built in, or untraceable
        return filename == "<string>" or filename.startswith("<ipython")
    return not filename.startswith(library)


def distribution_version(dist: str) -> str | None:
    """The installed version of the distribution ``dist``; None when it is not
    installed. importlib.metadata is imported here, when first asked: it imports
    email, zipfile and more, which a build that keys no library does not need."""
    import importlib.metadata

    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


@functools.cache
def _distributions() -> Mapping[str, list[str]]:
    import importlib.metadata  # as distribution_version: once a library is keyed

    return importlib.metadata.packages_distributions()


@functools.cache
def package_version(module: str) -> str:
    """What identifies the installed code of ``module``: Python's version for the
    standard library; else its distribution's name and version (several, when
    several install into one top-level package), else its ``__version__``."""
    top = module.split(".", 1)[0]
    if top in sys.stdlib_module_names or top == "builtins":
        return f"python {sys.version.split()[0]}"
    found = []
    for dist in sorted(set(_distributions().get(top, ()))):
        version = distribution_version(dist)
        if version is not None:
            found.append(f"{dist}=={version}")
    if found:
        return " ".join(found)
    version = getattr(sys.modules.get(top), "__version__", None)
    return f"{top}=={version}" if isinstance(version, str) else f"{top} (version unknown)"


def _no_file(f: BuildFile) -> str:
    raise Unkeyable(f"BuildFile '{f.path}'")


class CodeDigests:
    """Digests of functions, classes and code objects, each computed once.

    Invariant: a cached digest covers everything reachable from the object that
    the module docstring lists; a reference cycle is cut by naming the object.
    """

    def __init__(self) -> None:
        self._library = library_dirs()
        # (id, variant) -> (the object, kept alive so that its id stays its own; digest)
        self._done: dict[tuple[int, object], tuple[object, str]] = {}
        self._busy: set[tuple[int, object]] = set()
        self._cuts = 0  # reference cycles cut so far
        self._walk: dict[tuple[int, object], tuple[object, str]] = {}  # cut: this walk only
        self._extensions: dict[str, str] = {}  # a compiled extension's path -> its digest

    def is_user(self, obj: Any) -> bool:
        code = getattr(obj, "__code__", None)
        if isinstance(code, types.CodeType):
            return is_user_file(code.co_filename, self._library)
        if isinstance(obj, types.ModuleType):
            filename = getattr(obj, "__file__", None)
            return isinstance(filename, str) and is_user_file(
                os.path.abspath(filename), self._library
            )
        if isinstance(obj, type):
            filename = getattr(sys.modules.get(obj.__module__), "__file__", None)
            if filename is None:  # built into Python, or made at run time
                return obj.__module__ not in sys.builtin_module_names
            return is_user_file(os.path.abspath(filename), self._library)
        return False

    def of_class(self, cls: type, skip: frozenset[str] = frozenset()) -> str:
        """The digest of ``cls`` as defined by the user (its own attributes only, but
        the data attributes named in ``skip``)."""
        return self._cached((cls, skip), lambda: self._class(cls, skip))

    def of_value(self, value: Any, strict: bool = False, data_globals: bool = True) -> str:
        """What a referenced value contributes: see the module docstring. ``strict``:
        a value of no known kind raises Unkeyable instead of counting by its type;
        ``data_globals``: a function's global data is part of its digest."""
        if isinstance(value, types.FunctionType):
            if self.is_user(value):
                return self._cached(
                    (value, data_globals), lambda: self._function(value, strict, data_globals)
                )
            return f"fn {value.__module__}.{value.__qualname__} {_version_of(value)}"
        if isinstance(value, type):
            if self.is_user(value):
                return f"class {self.of_class(value)}"
            return f"{qualname(value)} {_version_of(value)}"
        if isinstance(value, types.ModuleType):
            return self.of_module(value, frozenset())
        if isinstance(value, types.MethodType):
            return f"method {self.of_value(value.__func__, strict)} of {type(value.__self__)}"
        if isinstance(value, functools.partial):
            args = [self.of_value(a, strict) for a in value.args]
            kwargs = {k: self.of_value(v, strict) for k, v in sorted(value.keywords.items())}
            return f"partial {self.of_value(value.func, strict)} {dumps([args, kwargs])}"
        if isinstance(value, types.BuiltinFunctionType | types.BuiltinMethodType):
            module = getattr(value, "__module__", None) or ""
            version = self.extension_bytes(module) or (package_version(module) if module else "")
            return f"builtin {module}.{value.__qualname__} {version}"
        if callable(value) and hasattr(value, "__dict__") and self.is_user(type(value)):
            return self._cached((value, "instance"), lambda: self._instance(value, strict))
        if not strict and hasattr(value, "__dict__") and self.is_user(type(value)):
            return self._cached((value, "object"), lambda: self._instance(value, strict))

        def nested(item: Any) -> str:
            if item is value:  # a callable canonical() cannot take apart: no loop
                raise Unkeyable(qualname(type(value)))
            return self.of_value(item, strict)

        try:
            return dumps(canonical(value, _no_file, nested))
        except Unkeyable:
            if strict:
                raise
            return f"<{qualname(type(value))}>"

    def of_module(
        self, module: types.ModuleType, names: frozenset[str], data_globals: bool = True
    ) -> str:
        """What a module named by code whose names are ``names`` contributes: an
        installed one its name and version; a user's, the attributes among ``names``
        it holds (its data too, with ``data_globals``), each by ``of_value``."""
        if not self.is_user(module):
            return f"module {module.__name__} {package_version(module.__name__)}"
        return self._cached(
            (module, (names, data_globals)), lambda: self._module(module, names, data_globals)
        )

    def extension_bytes(self, module: str) -> str | None:
        """The digest of the file of ``module`` when it is a user's compiled extension
        module (hashed once per build), else None."""
        filename = getattr(sys.modules.get(module), "__file__", None)
        if not isinstance(filename, str) or not filename.endswith(_EXTENSIONS):
            return None
        path = os.path.abspath(filename)
        if not is_user_file(path, self._library):
            return None
        found = self._extensions.get(path)
        if found is None:
            found = self._extensions[path] = f"extension {_file_digest(path)}"
        return found

    def _module(self, module: types.ModuleType, names: frozenset[str], data_globals: bool) -> str:
        h = hashlib.sha256(f"{_PY} module {stable_module_name(module.__name__)}".encode())
        compiled = self.extension_bytes(module.__name__)
        if compiled is not None:
            h.update(compiled.encode())
        scope = vars(module)
        for name in sorted(names.intersection(scope)):
            value = scope[name]
            if isinstance(value, types.ModuleType):
                text = self.of_module(value, names, data_globals)
            elif data_globals or _is_code_like(value):
                text = self.of_value(value)
            else:
                continue
            h.update(f"\0{name}={text}".encode())
        return h.hexdigest()

    def _cached(self, obj: Any, compute: Callable[[], str]) -> str:
        """``compute()``, once per object (``obj`` may be a tuple: object, variant).

        A digest whose computation cut a reference cycle depends on where the walk
        entered the cycle, so it is kept only until the outermost digest being
        computed is done: each root is digested afresh, and the same code always
        gets the same digest, whatever was keyed first."""
        target, variant = obj if isinstance(obj, tuple) else (obj, None)
        key = (id(target), variant)
        hit = self._done.get(key) or self._walk.get(key)
        if hit is not None and hit[0] is target:
            return hit[1]
        if key in self._busy:  # a reference cycle: name it
            self._cuts += 1
            return f"<cycle {getattr(target, '__qualname__', '?')}>"
        self._busy.add(key)
        cuts = self._cuts
        try:
            digest = compute()
        finally:
            self._busy.discard(key)
        (self._done if self._cuts == cuts else self._walk)[key] = (target, digest)
        if not self._busy:
            self._walk.clear()
        return digest

    def _instance(self, value: Any, strict: bool) -> str:
        """An object of a user class (callable, or data a function names): its class
        and its attributes."""
        return f"object {self.of_class(type(value))} {self.of_value(vars(value), strict)}"

    def _class(self, cls: type, skip: frozenset[str]) -> str:
        h = hashlib.sha256(f"{_PY} class {qualname(cls)}".encode())
        compiled = self.extension_bytes(cls.__module__)
        if compiled is not None:  # a class the extension defines
            h.update(compiled.encode())
        for name, attr in sorted(vars(cls).items()):
            if isinstance(attr, staticmethod | classmethod):
                attr = attr.__func__
            if isinstance(attr, property):
                parts = [attr.fget, attr.fset, attr.fdel]
                text = " ".join(self.of_value(p) if p else "-" for p in parts)
            elif isinstance(attr, types.FunctionType):
                text = self.of_value(attr, data_globals=name != "__init__")
            elif name.startswith("__") and name.endswith("__") or name in skip:
                continue  # __module__, __doc__, __dict__, __slots__, ...
            else:
                text = self.of_value(attr)
            h.update(f"\0{name}={text}".encode())
        return h.hexdigest()

    def _function(self, fn: types.FunctionType, strict: bool, data_globals: bool) -> str:
        h = hashlib.sha256(f"{_PY} fn {fn.__qualname__} {self._code(fn.__code__)}".encode())
        for value in fn.__defaults__ or ():
            h.update(f"\0default={self.of_value(value, strict)}".encode())
        for name, value in sorted((fn.__kwdefaults__ or {}).items()):
            h.update(f"\0kwdefault {name}={self.of_value(value, strict)}".encode())
        names = frozenset(_global_names(fn.__code__))
        for name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or (), strict=True):
            try:
                contents = cell.cell_contents
            except ValueError:
                text = "<empty>"
            else:
                try:
                    text = self._named(contents, names, strict, data_globals=True)
                except Unkeyable as e:
                    raise e.inside(f"closure value '{name}' of {fn.__qualname__}: ") from None
            h.update(f"\0closure {name}={text}".encode())
        scope = fn.__globals__
        for name in sorted(names.intersection(scope)):
            value = scope[name]
            if data_globals or _is_code_like(value):
                text = self._named(value, names, False, data_globals)
                h.update(f"\0global {name}={text}".encode())
        return h.hexdigest()

    def _named(self, value: Any, names: frozenset[str], strict: bool, data_globals: bool) -> str:
        """``of_value`` of a value that code whose names are ``names`` reaches by name:
        a module counts by the attributes those names may load."""
        if isinstance(value, types.ModuleType):
            return self.of_module(value, names, data_globals)
        return self.of_value(value, strict)

    def _code(self, code: types.CodeType) -> str:
        return self._cached(code, lambda: _code_digest(code))


def _file_digest(path: str) -> str:
    """The SHA-256 of the file ``path``, or why there is none (then it matches no
    digest made when the file is back)."""
    try:
        return hash_file(path)
    except (OSError, NotRegularFile) as e:
        return f"<unreadable: {type(e).__name__}>"


def _version_of(value: Any) -> str:
    """The version of the installed code that defines ``value`` (a function or class);
    for kiln's own code (the iree.build names it provides too), the digest of its
    source as well: a user's action that calls a kiln helper reruns when it changes."""
    module = getattr(value, "__module__", None)
    if not isinstance(module, str):
        return "?"
    if _in_kiln(module):
        return f"{package_version(module)} kiln {kiln_code_digest()}"
    return package_version(module)


@functools.cache
def _in_kiln(module: str) -> bool:
    """Whether the module named ``module`` was loaded from kiln's package directory."""
    file = getattr(sys.modules.get(module), "__file__", None)
    return isinstance(file, str) and os.path.abspath(file).startswith(_KILN_DIR)


def _is_code_like(value: object) -> bool:
    return isinstance(value, types.FunctionType | type | types.ModuleType | functools.partial)


def _code_digest(code: types.CodeType) -> str:
    h = hashlib.sha256(code.co_code)
    layout = [
        code.co_argcount,
        code.co_posonlyargcount,
        code.co_kwonlyargcount,
        code.co_flags,
        code.co_names,
        code.co_varnames,
        code.co_freevars,
    ]
    h.update(repr(layout).encode())
    for const in code.co_consts:
        h.update(f"\0{_const_text(const)}".encode())
    return h.hexdigest()


def _const_text(const: object) -> str:
    """A constant as text; frozensets sorted, since their order follows string
    hashes, which differ between processes."""
    if isinstance(const, types.CodeType):
        return f"code {_code_digest(const)}"
    if isinstance(const, frozenset):
        return f"frozenset {sorted(_const_text(c) for c in const)}"
    if isinstance(const, tuple):
        return f"tuple {[_const_text(c) for c in const]}"
    return f"{type(const).__name__} {const!r}"


def _global_names(code: types.CodeType) -> set[str]:
    """Every name the code (and code nested in it) may load as a global."""
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _global_names(const)
    return names
