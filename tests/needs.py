"""What a test needs that the test command provides (scripts/test installs kiln's
extras and the system programs, and CI runs it as root): missing, the test fails
in CI (``CI`` set), where that can only be a broken setup that would otherwise
pass unseen, and skips elsewhere, where a developer may lack it. The one place
for that rule: no test calls ``pytest.importorskip`` or skips on its own for
something scripts/test provides."""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
from types import ModuleType
from typing import NoReturn

import pytest


def missing(what: str) -> NoReturn:
    """Fail in CI, skip elsewhere, saying ``what`` is missing (at a module's top too)."""
    if os.environ.get("CI"):
        pytest.fail(f"{what}; CI must provide it (scripts/test does)", pytrace=False)
    pytest.skip(f"{what} (scripts/test provides it)", allow_module_level=True)


def module(name: str) -> ModuleType:
    """The module ``name``, imported; ``missing`` when it is not installed."""
    try:
        return importlib.import_module(name)
    except ImportError as e:
        missing(f"{name} is not installed ({e}): pip install -e '.[iree,dask,torch]'")


def installed(*names: str) -> None:
    """``missing`` unless each of ``names`` can be imported, found without importing
    it (torch, imported, would weigh on every later test of the process)."""
    for name in names:
        try:
            found = importlib.util.find_spec(name) is not None
        except ModuleNotFoundError:  # its parent package is missing
            found = False
        if not found:
            missing(f"{name} is not installed: pip install -e '.[iree,dask,torch]'")


def program(*names: str) -> str:
    """The path of the first of ``names`` on PATH; ``missing`` when none is."""
    for name in names:
        found = shutil.which(name)
        if found is not None:
            return found
    missing(f"{' or '.join(names)} is not installed")


def root(why: str) -> None:
    """``missing`` unless this runs as root (CI does); ``why`` it must."""
    if os.geteuid() != 0:
        missing(f"not root: {why}")
