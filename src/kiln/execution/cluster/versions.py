"""Which kiln and which tools built a result: what an action's key says, and what
the Dask worker that ran it has.

An action's key holds kiln's version (kiln's own code counts as its version:
``kiln.planning.action_key``) and the versions of the tools the action declares in
``keyed_tools``, the distributions whose versions its parameters hold
(``iree-base-compiler`` for a compile, ``iree-base-runtime`` for a verify or a
benchmark, ``torch``... for a torch export). What a worker builds enters this
build and the caches under that key, so it must have been built by the same:

- when kiln connects, every worker of the cluster says which kiln it runs
  (``kiln_version``); one that runs another, or cannot say, is refused at once;
- each task carries the versions its action's key holds (``expected``); the worker
  that takes it compares them with its own (``installed``) and does not run it
  when they differ, and sends its own back with every result;
- kiln takes a result only when the versions it came with are the ones the key
  holds (``differences``): a worker that joined the cluster since kiln connected,
  or one that runs an older kiln and says nothing, is refused too, naming the
  worker and both versions (``DaskClient``).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

from kiln._version import __version__
from kiln.planning.code_key import distribution_version, kiln_code_digest

KILN = "kiln"
NOT_INSTALLED = "not installed"
# (name, version) pairs: kiln's first, then the action's keyed tools, in order.
Versions = tuple[tuple[str, str], ...]


def kiln_version() -> str:
    """Which kiln this process runs, as every Dask worker is asked it (``Client.run``):
    the version and the start of the digest of its code (two kilns of one version with
    other code build other results: ``kiln_code_digest`` is in their actions' keys)."""
    return f"{__version__} (code {kiln_code_digest()[:12]})"


@functools.cache
def version_of(name: str) -> str:
    """This process's version of ``name``: kiln's, or an installed distribution's
    (read once per process, as the keys read it)."""
    if name == KILN:
        return kiln_version()
    return distribution_version(name) or NOT_INSTALLED


def keyed_tools(action: Any) -> tuple[str, ...]:
    """The distributions whose versions ``action``'s key holds (its ``keyed_tools``)."""
    declared = getattr(action, "keyed_tools", ())
    if isinstance(declared, str):
        declared = (declared,)
    return tuple(name for name in declared if isinstance(name, str) and name != KILN)


def expected(action: Any) -> Versions:
    """The versions ``action``'s key holds: kiln's and its keyed tools', here."""
    return tuple((name, version_of(name)) for name in (KILN, *keyed_tools(action)))


def installed(names: Iterable[str]) -> Versions:
    """This process's versions of ``names`` (what a worker sends back)."""
    return tuple((name, version_of(name)) for name in names)


def differences(wanted: Versions, found: Versions | None) -> str | None:
    """How the versions ``found`` where a result was built differ from the ones its
    key holds (``wanted``, this kiln's); None when they are the same. ``found`` None:
    the worker said nothing (a kiln older than this check)."""
    if found is None:
        return f"it did not say which kiln built it (a kiln older than this one, {kiln_version()})"
    try:
        have = {str(name): str(version) for name, version in found}
    except (TypeError, ValueError):
        return f"it sent versions kiln cannot read ({str(found)[:80]!r})"
    # Compared whole; what a worker sends is bounded where it is shown (a version is short).
    return (
        "; ".join(
            f"{name} {have.get(name, 'unknown')[:80]} there, {version} here"
            for name, version in wanted
            if have.get(name) != version
        )
        or None
    )
