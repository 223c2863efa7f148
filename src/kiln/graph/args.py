"""Command-line options declared by build modules (``cl_arg``).

A ``cl_arg(...)`` used as a parameter default of an ``@entrypoint`` function
becomes an option of ``kiln build``; when the entrypoint runs, the parameter
receives the option's value from the namespace of the current command line
(held in a ``ContextVar``).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any, TypeVar

from kiln.base.errors import BuildDefinitionError
from kiln.graph import DefinitionSite

_ARGS: ContextVar[argparse.Namespace | None] = ContextVar("kiln_args", default=None)


@contextlib.contextmanager
def argument_namespace_context(ns: argparse.Namespace) -> Iterator[argparse.Namespace]:
    """Make ``ns`` the namespace that ``cl_arg`` defaults resolve from."""
    token = _ARGS.set(ns)
    try:
        yield ns
    finally:
        _ARGS.reset(token)


def current_args_namespace() -> argparse.Namespace | None:
    return _ARGS.get()


class ClArgRef:
    """A parameter default that takes its value from the option with ``dest``."""

    def __init__(self, dest: str):
        self.dest = dest

    def resolve(self, ns: argparse.Namespace | None) -> Any:
        if ns is not None and hasattr(ns, self.dest):
            return getattr(ns, self.dest)
        return self.fallback()

    def fallback(self) -> Any:
        raise BuildDefinitionError(f"command-line option '{self.dest}' is not defined")


class ClArg(ClArgRef):
    """A command-line option definition; its settings are ``add_argument`` keywords."""

    def __init__(self, name: str, dest: str, **settings: Any):
        super().__init__(dest)
        self.name = name
        self.settings = settings
        self.def_site = DefinitionSite.capture()

    @property
    def flag(self) -> str:
        return f"--{self.name}"

    def fallback(self) -> Any:
        return self.settings.get("default")

    def define_arg(self, parser: argparse.ArgumentParser | Any) -> None:
        kw = {k: v for k, v in self.settings.items() if v is not None}
        parser.add_argument(self.flag, dest=self.dest, **kw)

    def same_as(self, other: ClArg) -> bool:
        return self.name == other.name and self.settings == other.settings


def cl_arg(
    name: str,
    *,
    action: str | None = None,
    default: Any = None,
    type: Callable[[str], Any] | None = None,  # noqa: A002 - mirrors argparse
    help: str | None = None,  # noqa: A002
) -> Any:
    """Declare (or share) a command-line option ``--name``; use it as a default value."""
    if name.startswith("-"):
        raise BuildDefinitionError(f"cl_arg name '{name}' must not start with dashes")
    return ClArg(name, name.replace("-", "_"), action=action, default=default, type=type, help=help)


def cl_arg_ref(dest: str) -> Any:
    """A default that reads an option defined elsewhere (by kiln or another cl_arg)."""
    return ClArgRef(dest)


def extract_cl_arg_defs(fn: Callable[..., Any]) -> Iterator[ClArg]:
    for param in inspect.signature(fn).parameters.values():
        if isinstance(param.default, ClArg):
            yield param.default


_F = TypeVar("_F", bound=Callable[..., Any])


def expand_cl_arg_defaults(fn: _F) -> _F:
    """Wrap ``fn`` so that ClArgRef defaults resolve from the current namespace."""
    sig = inspect.signature(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        bound.apply_defaults()
        ns = _ARGS.get()
        for name, value in bound.arguments.items():
            if isinstance(value, ClArgRef):
                bound.arguments[name] = value.resolve(ns)
        return fn(*bound.args, **bound.kwargs)

    return wrapper  # type: ignore[return-value]


def check_cl_args(defs: list[ClArg], reserved: dict[str, str]) -> list[ClArg]:
    """The distinct option definitions of ``defs``; a conflict is a definition error.

    ``reserved`` maps the option flags no module may declare (those iree.build has
    itself) to what they do.
    """
    seen: dict[str, ClArg] = {}
    for d in defs:
        if d.flag in reserved:
            raise BuildDefinitionError(
                f"cl_arg '{d.name}' at {d.def_site} clashes with {d.flag}, an option of "
                f"kiln's that iree.build has too ({reserved[d.flag]}); rename it"
            )
        first = seen.setdefault(d.dest, d)
        if first is not d and not first.same_as(d):
            raise BuildDefinitionError(
                f"option {d.flag} is defined twice with different settings: at "
                f"{first.def_site} and at {d.def_site}; define it once at module level "
                "and use that cl_arg in both entrypoints"
            )
    return list(seen.values())
