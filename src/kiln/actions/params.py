"""Parameter archives (``.irpa``): how a build asks for them, and where they are.

An importer asked for parameters (``onnx_import(..., params=...)``,
``torch_export(..., params=...)``) writes the model's weights into an archive under
``params/<entrypoint>/`` beside the program, which names each weight by
``SCOPE::NAME`` instead of holding it. ``ParamsMeta`` on the program records its
archives, so that ``compile`` can list them in the manifest and ``verify`` and
``benchmark`` can load them without being told (``module_archives``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kiln.base.errors import BuildDefinitionError
from kiln.graph import BuildContext, BuildFile, BuildMeta, FileNamespace

DEFAULT_SCOPE = "model"
# A scope is written into tool flags (``--parameters=SCOPE=FILE``): no "=" or spaces.
_SCOPE = re.compile(r"[A-Za-z0-9_.\-]+\Z")


@dataclass(frozen=True)
class Params:
    """What to externalize, and under which scope.

    ``threshold=None`` (the default) puts every floating-point weight in the archive,
    whatever its size, and keeps integer and boolean constants (shapes, indices) in
    the program: so the program text does not depend on the weights' values, and a
    weights-only change leaves it byte-identical. ``threshold=N`` externalizes every
    initializer of at least N elements, any dtype, as ``iree-import-onnx
    --num-elements-threshold`` does (smaller ones stay in the program).
    """

    scope: str = DEFAULT_SCOPE
    threshold: int | None = None


def params_spec(value: Any, where: str) -> Params | None:
    """``params=`` as given (None/False, True, a ``Params``, or a mapping with
    ``scope`` and ``threshold``) as a checked ``Params``, or None for none."""
    if value is None or value is False:
        return None
    if value is True:
        return Params()
    if isinstance(value, Mapping):
        unknown = sorted(set(value) - {"scope", "threshold"})
        if unknown:
            raise BuildDefinitionError(
                f"{where}: params has unknown key(s) {unknown}; known: scope, threshold"
            )
        value = Params(**value)
    if not isinstance(value, Params):
        raise BuildDefinitionError(
            f"{where}: params must be True, a kiln Params(scope=, threshold=) or a dict "
            f"with those keys; got {value!r}"
        )
    _check_scope(value.scope, where)
    threshold = value.threshold
    if threshold is not None and (
        isinstance(threshold, bool) or not isinstance(threshold, int) or threshold < 0
    ):
        raise BuildDefinitionError(
            f"{where}: params threshold must be None or a number of elements >= 0, "
            f"got {threshold!r}"
        )
    return value


def _check_scope(scope: Any, where: str) -> None:
    if not isinstance(scope, str) or not _SCOPE.match(scope):
        raise BuildDefinitionError(
            f"{where}: parameter scope {scope!r} must be a non-empty name of letters, "
            "digits, '_', '.' and '-'"
        )


class ParamsMeta(BuildMeta):
    """The parameter archives a program (``.mlir``) needs at run time, as
    ``(scope, archive)`` pairs, set by the action that wrote both."""

    KEY = "kiln.params"

    def __init__(self) -> None:
        super().__init__()
        self.archives: list[tuple[str, BuildFile]] = []


def allocate_archive(context: BuildContext, name: str) -> BuildFile:
    """The archive beside the program ``name``: ``params/<context>/<stem>.irpa``."""
    stem = name.rsplit("/", 1)[-1]
    stem = stem.rsplit(".", 1)[0] if "." in stem else stem
    folder = name.rsplit("/", 1)[0] + "/" if "/" in name else ""
    return context.allocate_file(f"{folder}{stem}.irpa", FileNamespace.PARAMS)


def program_archives(program: BuildFile) -> list[tuple[str, BuildFile]]:
    """The archives a program needs (none when it was not built with params)."""
    return list(ParamsMeta.get(program).archives)


def module_archives(module: BuildFile) -> list[tuple[str, BuildFile]]:
    """The archives of the program a compiled ``module`` was compiled from in this
    build (the compile's ``input_file``), or none."""
    found: list[tuple[str, BuildFile]] = []
    for action in module.deps:
        source = getattr(action, "input_file", None)
        if isinstance(source, BuildFile):
            found += program_archives(source)
    return found


def parameters_arg(
    context: BuildContext,
    module: BuildFile,
    parameters: Sequence[Any] | None,
    where: str,
) -> list[tuple[str, BuildFile]]:
    """The archives a check or benchmark of ``module`` loads: ``parameters`` (files,
    or ``(scope, file)`` pairs; a bare file is in scope ``model``) when given, else
    those of the module's program (``module_archives``)."""
    if parameters is None:
        return module_archives(module)
    if isinstance(parameters, str | BuildFile):
        parameters = [parameters]
    out = []
    for item in parameters:
        scope, file = item if isinstance(item, tuple) and len(item) == 2 else (DEFAULT_SCOPE, item)
        _check_scope(scope, where)
        if not isinstance(file, str | BuildFile):
            raise BuildDefinitionError(
                f"{where}: parameters must be archive files or (scope, file) pairs; got {item!r}"
            )
        out.append((scope, context.file(file)))
    return out
