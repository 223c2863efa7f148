"""``@entrypoint``: a function whose call declares part of the build graph."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable
from typing import Any

from kiln.base.bytecode import user_code
from kiln.base.errors import BuildDefinitionError
from kiln.graph import BuildContext, BuildEntrypoint, BuildFile, join_namespace
from kiln.graph.args import ClArg, expand_cl_arg_defaults, extract_cl_arg_defs
from kiln.graph.definition_site import DefinitionSite


class Entrypoint:
    """A named build function; calling it inside a context builds its subgraph."""

    def __init__(self, name: str, wrapped: Callable[..., Any], description: str | None = None):
        _check_name(name, wrapped)
        self.name = name
        self.description = description or (wrapped.__doc__ or "").strip().split("\n")[0]
        self.cl_arg_defs: list[ClArg] = list(extract_cl_arg_defs(wrapped))
        self._wrapped = expand_cl_arg_defaults(wrapped)
        functools.update_wrapper(self, wrapped)

    def __call__(self, *args: Any, **kwargs: Any) -> list[BuildFile] | None:
        parent = BuildContext.current()
        bep = BuildEntrypoint(join_namespace(parent.path, self.name), parent.executor, self)
        bep.registry.add_entrypoint(bep)
        with bep, user_code():  # what it imports writes no bytecode beside it
            results = self._wrapped(*args, **kwargs)
            if results is None:
                return None
            files = bep.files(self._check_results(results))
            bep.deps.update(files)
            bep.outputs.extend(files)
            return files

    def _check_results(self, results: Any) -> list[str | BuildFile]:
        """What the entrypoint returned, as a list of files or file names."""
        if isinstance(results, str | BuildFile):
            return [results]
        items = list(results) if isinstance(results, Iterable) else [results]
        if all(isinstance(item, str | BuildFile) for item in items):
            return items
        site = DefinitionSite.of_function(self)
        where = f" (at {site})" if site else ""
        raise BuildDefinitionError(
            f"entrypoint '{self.name}'{where} returned {results!r}; return None, a "
            "BuildFile, a file name, or a list of them"
        )

    def __repr__(self) -> str:
        return f"Entrypoint({self.name!r})"


def _check_name(name: object, wrapped: Callable[..., Any]) -> None:
    """An entrypoint's name is one component of the graph's paths (and of the output
    directory's): never empty, ``.``, ``..`` or with a ``/`` (a target could never
    name it, and it would be built under another entrypoint's directory)."""
    if isinstance(name, str) and name not in ("", ".", "..") and "/" not in name:
        return
    site = DefinitionSite.of_function(wrapped)
    where = f" (at {site})" if site else ""
    raise BuildDefinitionError(
        f"entrypoint name {name!r}{where} is not a name: give the function a name without "
        "'/' that is not empty, '.' or '..'"
    )


def entrypoint(f: Callable[..., Any] | None = None, *, description: str | None = None) -> Any:
    """Mark a function as a build entrypoint (``@entrypoint`` or
    ``@entrypoint(description=...)``)."""
    if f is None:
        return functools.partial(entrypoint, description=description)
    return Entrypoint(f.__name__, f, description=description)
