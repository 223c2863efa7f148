"""Loading build modules, by file path or by import name."""

from __future__ import annotations

import contextlib
import importlib
import importlib.machinery
import importlib.util
import marshal
import os
import sys
import sysconfig
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import CodeType, ModuleType
from typing import TypeVar

from kiln.base.bytecode import user_code
from kiln.base.errors import BuildDefinitionError, BuildInterrupted, UsageError
from kiln.base.iree_shim import activated as iree_build_shim
from kiln.base.modnames import (
    build_module_name,
    hidden_build_modules,
    hide_build_module,
    hide_build_modules,
    is_build_module_name,
)
from kiln.graph.entrypoints import Entrypoint

_T = TypeVar("_T")
# kiln's own package directory: frames below it are not the user's.
_KILN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def load_build_module(spec: str | os.PathLike[str], as_module: bool = False) -> ModuleType:
    """Import the build module ``spec`` (a ``.py`` path, or a module name with ``-m``).

    A module loaded by path is registered for pickling by value, so the thunks
    of its process actions reach worker processes that cannot import it. While it
    loads, its ``iree.build`` imports (and its libraries') give kiln's compatible
    API (``kiln.base.iree_shim``), unless ``KILN_NO_IREE_BUILD_SHIM`` is set.
    """
    with iree_build_shim():
        return _load(os.fspath(spec), as_module)


def _load(spec: str, as_module: bool) -> ModuleType:
    if as_module:
        if not all(part.isidentifier() for part in spec.split(".")):
            raise UsageError(
                f"-m {spec!r}: not a module name; give an absolute dotted name "
                "(package.module) of a module on the Python path, or a .py file"
            )
        # Finding pkg.mod imports pkg: the user's code, guarded as the module is.
        found = guarded(spec, lambda: _find_module(spec))
        if found is None:
            raise UsageError(f"build module '{spec}' not found on the Python path")
        return guarded(spec, lambda: importlib.import_module(spec))
    path = Path(spec).resolve()
    if not path.is_file():
        raise UsageError(f"build module {spec} does not exist; pass a .py file or -m MODULE")
    # Unique per path; keys spell it without the path (``kiln.base.modnames``).
    name = build_module_name(path)
    module_spec = importlib.util.spec_from_file_location(
        name, path, loader=_SourceCheckedLoader(name, str(path))
    )
    if module_spec is None or module_spec.loader is None:
        raise UsageError(f"cannot load {spec} as a Python module")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    # Its directory first, so that its siblings import as when Python runs it; its
    # own file name imports from the rest of the path (``random.py`` is never what
    # kiln's or a library's ``import random`` gets).
    hide_build_module(path)
    sys.path.insert(0, str(path.parent))
    loader = module_spec.loader
    with user_code():
        guarded(str(path), lambda: loader.exec_module(module))
    import cloudpickle

    cloudpickle.register_pickle_by_value(module)
    return module


def _find_module(name: str) -> importlib.machinery.ModuleSpec | None:
    try:
        return importlib.util.find_spec(name)
    except ModuleNotFoundError:
        return None


@contextlib.contextmanager
def loaded_for_command(spec: str, as_module: bool = False) -> Iterator[ModuleType]:
    """The build module ``spec``, loaded for one command: when the block ends, what
    loading it put into the process goes again (its ``sys.path`` entry, its own
    modules and its siblings' in ``sys.modules``, its pickle-by-value mark), so
    that a process running the command line many times does not grow and the next
    run loads the module as it is then; its file name is another module's again."""
    path_before, modules_before = list(sys.path), set(sys.modules)
    hidden_before = hidden_build_modules()
    module: ModuleType | None = None
    try:
        module = load_build_module(spec, as_module)
        yield module
    finally:
        if module is not None and not as_module:
            import cloudpickle

            with contextlib.suppress(ValueError):
                cloudpickle.unregister_pickle_by_value(module)
        hide_build_modules(hidden_before)
        user_dirs = [p for p in sys.path if p not in path_before]
        if module is not None and getattr(module, "__file__", None):
            user_dirs.append(os.path.dirname(os.path.abspath(module.__file__ or "")))
        sys.path[:] = path_before
        for name in set(sys.modules) - modules_before:
            if _is_users(name, sys.modules[name], spec if as_module else None, user_dirs):
                del sys.modules[name]


def _is_users(name: str, module: ModuleType, dotted: str | None, user_dirs: list[str]) -> bool:
    """Whether ``module``, imported while a build module loaded, is that build module,
    its package, or a module from the build module's directory (not a library)."""
    if is_build_module_name(name):
        return True
    if dotted is not None and (
        name == dotted.split(".")[0] or name.startswith(dotted.split(".")[0] + ".")
    ):
        return True
    where = getattr(module, "__file__", None) or ""
    return any(where.startswith(os.path.join(d, "")) for d in user_dirs if d)


class _SourceCheckedLoader(importlib.machinery.SourceFileLoader):
    """Loads a build module through bytecode cached by the hash of its source.

    Python's default cache trusts a ``.pyc`` whose source has the same size and
    mtime second as when it was written, so an edit that keeps both (a flag
    changed from ``bang`` to ``fail`` within a second) would build the old
    definition. A checked hash-based ``.pyc`` (PEP 552) is read only when the
    source's hash matches; Python's own imports accept it too.
    """

    def get_code(self, fullname: str) -> CodeType:
        source = self.get_data(self.path)
        source_hash = importlib.util.source_hash(source)
        cache = importlib.util.cache_from_source(self.path)
        header = importlib.util.MAGIC_NUMBER + (3).to_bytes(4, "little") + source_hash
        try:
            cached = self.get_data(cache)
        except OSError:
            cached = b""
        if cached[:16] == header:
            with contextlib.suppress(ValueError, EOFError, TypeError):
                code = marshal.loads(cached[16:])
                if isinstance(code, CodeType):
                    return code
        code = self.source_to_code(source, self.path)
        if not sys.dont_write_bytecode:
            with contextlib.suppress(OSError):
                self.set_data(cache, header + marshal.dumps(code))
        return code


def guarded(where: str, load: Callable[[], _T], doing: str = "loading build module") -> _T:
    """Run ``load`` (which runs the user's code); turn an error in the user's module
    into a definition error that names their file and line."""
    try:
        return load()
    except SyntaxError as e:
        text = (e.text or "").rstrip()
        raise BuildDefinitionError(
            f"{e.filename}:{e.lineno}: syntax error in build module: {e.msg}"
            + (f"\n    {text.strip()}" if text else "")
        ) from e
    except (BuildDefinitionError, BuildInterrupted):
        raise  # kiln's own: a definition error already says where; a signal stops the build
    except SystemExit as e:
        # An exit, even ``sys.exit(0)``, would end kiln with nothing built and a
        # status borrowed from the user's code.
        raise BuildDefinitionError(
            f"{user_line(e, where)}: the build module called sys.exit({e.code!r}) while "
            f"{doing} {where}; a build module must not exit: raise an exception instead"
        ) from e
    except KeyboardInterrupt as e:
        # Raised by the user's code: kiln's handler raises BuildInterrupted for a real signal.
        raise BuildDefinitionError(
            f"{user_line(e, where)}: the build module raised KeyboardInterrupt while "
            f"{doing} {where}; raise an ordinary exception instead"
        ) from e
    except Exception as e:
        raise BuildDefinitionError(
            f"{user_line(e, where)}: error while {doing} {where}: {type(e).__name__}: {e}"
        ) from e


def user_line(e: BaseException, where: str) -> str:
    """``file:line`` of the user's code that raised ``e``: the build module's own
    line rather than one deep in a library it called; ``where`` if none is known."""
    frames = traceback.extract_tb(e.__traceback__)
    user = [
        f
        for f in frames
        if not f.filename.startswith((_KILN_DIR, "<")) and "importlib" not in f.filename
    ]
    stdlib = sysconfig.get_paths()["stdlib"] + os.sep
    user = (
        [f for f in user if f.filename == where]
        or [f for f in user if not f.filename.startswith(stdlib)]
        or user
    )
    return f"{user[-1].filename}:{user[-1].lineno}" if user else where


def collect_entrypoints(module: ModuleType) -> dict[str, Entrypoint]:
    found = {ep.name: ep for ep in vars(module).values() if isinstance(ep, Entrypoint)}
    if not found:
        where = getattr(module, "__file__", module.__name__)
        if any(type(v).__module__ == "iree.build.executor" for v in vars(module).values()):
            raise BuildDefinitionError(
                f"build module {where}: its entrypoints are IREE's own iree.build's, "
                "which kiln cannot run: let kiln resolve iree.build (drop "
                "--no-iree-build-shim and KILN_NO_IREE_BUILD_SHIM), or import kiln"
            )
        raise BuildDefinitionError(
            f"build module {where} defines no entrypoints; mark a function with @entrypoint"
        )
    return found
