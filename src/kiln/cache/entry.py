"""Action-cache entries: what an action produced, as the local and the remote cache
store it under ``ac/``.

Format ``kiln-ac/1`` (UTF-8 JSON, one object)::

    {
      "format": "kiln-ac/1",
      "key": "<the action key>",
      "action": "<description of the action, for people reading the cache>",
      "outputs": [
        {"path": "bin/mnist/mnist_cpu-host.vmfb", "sha256": "<64 hex>", "size": 1234,
         "mode": 420},
        {"path": "gen/graph/n0_0.txt", "sha256": "<64 hex>", "size": 81, "mode": 420,
         "data": "<base64 of the 81 bytes>"}
      ]
    }

``path`` is the output's file key: its namespace (``gen``, ``params``, ``bin``,
``platform_bin``) and its path in the build graph, so an entry names nothing of the
machine or output directory that made it. ``mode`` is the permission bits; of
them, a served output takes only whether it is executable (``served_mode``):
whatever an entry says, kiln never serves a setuid, setgid, sticky or group- or
world-writable file. An entry is at most ``MAX_ENTRY_SIZE`` bytes: a larger one is
not stored, and one read larger is not read further (a miss). ``data``
(optional, for outputs of at most ``INLINE_MAX`` bytes) is the output's content in
base64: served from the entry itself, checked against ``sha256`` like a blob, so
that a small output costs one file in the cache, not two. A reader that ignores
``data`` (an older kiln) looks for the blob in the CAS instead: at worst a miss.
Anything that does not parse as this format, or names another key, is not an
entry: a miss.

A withdrawal (what ``--check-reproducible`` leaves under the key of an action it
found not reproducible) is an entry with no outputs and the reason::

    {"action": "...", "format": "kiln-ac/1", "key": "<the action key>",
     "not_reproducible": "<what differed>", "outputs": []}

It serves nothing: a lookup that finds it is a miss (an older kiln reads an entry
without outputs as no entry, a miss too), and a build that then runs the action
does not put its results in its place; only a check that finds the action
reproducible again replaces it (``kiln.cache.build_cache``).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

FORMAT = "kiln-ac/1"
# Outputs up to this size are kept in their entry (``data``) rather than as blobs.
INLINE_MAX = 2048
# The largest entry kiln writes or reads (thousands of outputs fit).
MAX_ENTRY_SIZE = 16 << 20
# What a withdrawal keeps of why (the start of the check's finding).
WHY_MAX = 1000
_text = json.encoder.encode_basestring_ascii  # a JSON string, as json.dumps writes it
_SAFE_KEY = re.compile(r"[A-Za-z0-9_.-]{1,128}\Z")
_DIGEST = re.compile(r"[0-9a-f]{64}\Z")


def key_name(key: str) -> str:
    """The file and URL name of an action key: the key itself when it is a safe name
    (kiln's keys are hex digests), else its SHA-256, so no key can name a path."""
    if _SAFE_KEY.match(key) and not key.startswith("."):
        return key
    return hashlib.sha256(key.encode()).hexdigest()


def is_digest(text: str) -> bool:
    return bool(_DIGEST.match(text))


def is_entry_name(name: str) -> bool:
    """Whether ``name`` is one ``key_name`` makes (what kiln names an entry file)."""
    return bool(_SAFE_KEY.match(name)) and not name.startswith(".")


def served_mode(recorded: int, umask: int) -> int:
    """The mode of an output served from a cache whose entry recorded ``recorded``:
    read and write for the owner, executable if it was, readable by others as the
    ``umask`` allows; never setuid, setgid, sticky, group- or world-writable."""
    if recorded & 0o111:
        return (0o755 & ~umask) | 0o700
    return (0o644 & ~umask) | 0o600


@dataclass(frozen=True)
class CachedOutput:
    """One output file of a cached action; ``data``, when known, is its content
    (unchecked: whoever serves it checks it against ``sha256``)."""

    path: str
    sha256: str
    size: int
    mode: int
    data: bytes | None = None


@dataclass(frozen=True)
class CacheEntry:
    """What the action with ``key`` produced; or, when ``not_reproducible`` is set
    (why), that it must not be served: a withdrawal, with no outputs. Invariant:
    every digest is 64 hex digits, every path is unique, and an entry has outputs
    exactly when it is no withdrawal."""

    key: str
    action: str
    outputs: tuple[CachedOutput, ...]
    not_reproducible: str | None = None

    @classmethod
    def withdrawal(cls, key: str, action: str, why: str) -> CacheEntry:
        """The withdrawal of ``key``: found not reproducible (``why``)."""
        return cls(key, action, (), why[:WHY_MAX] or "its outputs differed")

    def encode(self) -> bytes:
        """The entry's bytes: ``json.dumps`` of its object with sorted keys, written
        out directly (one per action the cache stores: the generic encoder's dict,
        sort and dispatch were a third of what storing a small output cost)."""
        outputs = ", ".join(map(_encode_output, self.outputs))
        why = self.not_reproducible
        marked = "" if why is None else f'"not_reproducible": {_text(why)}, '
        return (
            f'{{"action": {_text(self.action)}, "format": "{FORMAT}", '
            f'"key": {_text(self.key)}, {marked}"outputs": [{outputs}]}}'
        ).encode()

    @classmethod
    def decode(cls, key: str, blob: bytes) -> CacheEntry | None:
        """The entry in ``blob`` if it is a well-formed entry for ``key``, else None."""
        try:
            data = json.loads(blob)
            if data.get("format") != FORMAT or data.get("key") != key:
                return None
            why = data.get("not_reproducible")
            if why is not None:
                return cls.withdrawal(key, str(data.get("action", "")), str(why))
            outputs = tuple(_output(o) for o in data["outputs"])
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        if not outputs or len({o.path for o in outputs}) != len(outputs):
            return None
        return cls(key, str(data.get("action", "")), outputs)


def _encode_output(out: CachedOutput) -> str:
    """One output's JSON object, its keys sorted as ``json.dumps(sort_keys=True)``
    sorts them."""
    data = "" if out.data is None else f'"data": "{base64.b64encode(out.data).decode()}", '
    return (
        f'{{{data}"mode": {int(out.mode)}, "path": {_text(out.path)}, '
        f'"sha256": {_text(out.sha256)}, "size": {int(out.size)}}}'
    )


def _output(item: Any) -> CachedOutput:
    data = item.get("data")
    try:
        content = None if data is None else base64.b64decode(str(data), validate=True)
    except binascii.Error as e:
        raise ValueError(f"bad data in cache entry: {e}") from e
    out = CachedOutput(
        str(item["path"]), str(item["sha256"]), int(item["size"]), int(item["mode"]), content
    )
    if not is_digest(out.sha256) or out.size < 0 or not 0 <= out.mode <= 0o7777:
        raise ValueError(f"bad output in cache entry: {item!r}")
    if content is not None and len(content) != out.size:
        raise ValueError(f"bad data in cache entry: {len(content)} bytes, not {out.size}")
    return out
