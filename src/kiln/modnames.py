"""The import names of build modules loaded by path, and how keys spell them.

A build module loaded from a file gets a private name in ``sys.modules`` that is
unique to its path (two build modules with the same file name can be loaded in
one process). Keys must not depend on where the checkout lies, so wherever a
module's name goes into a key (action types, classes, functions) it is spelled
without that path tag: ``build_module_name`` makes the private name and
``stable_module_name`` turns it back into the file's own name.
"""

from __future__ import annotations

import hashlib
import os
import re
from pathlib import Path

_PREFIX = "kiln_build_"
_PRIVATE = re.compile(rf"{_PREFIX}[0-9a-f]{{12}}_")


def build_module_name(path: Path) -> str:
    """The name a build module loaded from the file ``path`` is imported as: text,
    whatever bytes the path holds (a byte that is not UTF-8 is spelled ``\\xff``,
    as keys spell it)."""
    tag = hashlib.sha256(os.fsencode(path)).hexdigest()[:12]
    stem = os.fsencode(path.stem).decode(errors="backslashreplace")
    return f"{_PREFIX}{tag}_{stem.replace('-', '_')}"


def is_build_module_name(name: str) -> bool:
    return _PRIVATE.match(name) is not None


def stable_module_name(name: str) -> str:
    """``name`` as keys spell it: a build module loaded by path by its file's stem,
    any other module as it is."""
    match = _PRIVATE.match(name)
    return name if match is None else name[match.end() :]
