"""Withdrawals: the keys ``--check-reproducible`` found not reproducible, as one
build's caches know them (``kiln.cache.build_cache``).

A withdrawal is an entry under the key with no outputs and the reason
(``kiln.cache.entry``). ``Withdrawals`` is what one build met of them, or made:
such a key is never served, and nothing is stored under it again but what a check
vouches for. ``write`` puts one into a local and a remote cache.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import TYPE_CHECKING

from kiln.cache.entry import CacheEntry
from kiln.cache.local import LocalCache

if TYPE_CHECKING:  # imported only by a build that has a remote cache
    from kiln.cache.remote import RemoteCache


class Withdrawals:
    """The keys withdrawn that one build met or made, and why. Invariant: a key is
    here from the moment a lookup met its withdrawal (or the build withdrew it)
    until a save that a check vouches for replaced it. Safe from several threads."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._why: dict[str, str] = {}

    def servable(self, entry: CacheEntry) -> CacheEntry | None:
        """``entry``, or None when it is a withdrawal (then remembered)."""
        if entry.not_reproducible is None:
            return entry
        self.add(entry.key, entry.not_reproducible)
        return None

    def add(self, key: str, why: str) -> None:
        with self._lock:
            self._why[key] = why

    def why(self, key: str) -> str | None:
        """Why ``key`` is withdrawn; None when this build knows of no withdrawal."""
        with self._lock:
            return self._why.get(key)

    def replaced(self, key: str) -> None:
        """A save that a check vouched for put results in place of ``key``'s withdrawal."""
        with self._lock:
            self._why.pop(key, None)


def write(
    data: bytes,
    key: str,
    local: LocalCache | None,
    remote: RemoteCache | None,
    warn: Callable[[str], None],
) -> None:
    """Put the withdrawal ``data`` of ``key`` into ``remote`` and ``local`` (None: not
    usable; an OSError is the caller's); ``warn`` when the remote takes no uploads
    from this build, so that it may still serve what it has."""
    if remote is not None and remote.uploads and not remote.disabled:
        remote.put_entry(key, data)
    if remote is not None and (not remote.uploads or remote.disabled):
        warn(
            f"warning: cannot withdraw from the remote cache {remote.shown} what was found "
            "not reproducible (it takes no uploads from this build); it may still serve "
            "it to other builds"
        )
    if local is not None:
        local.put_entry(key, data)
