"""Action-cache entries: what an action produced, as the local and the remote cache
store it under ``ac/``.

Format ``kiln-ac/1`` (UTF-8 JSON, one object)::

    {
      "format": "kiln-ac/1",
      "key": "<the action key>",
      "action": "<description of the action, for people reading the cache>",
      "outputs": [
        {"path": "bin/mnist/mnist_cpu.vmfb", "sha256": "<64 hex>", "size": 1234,
         "mode": 420}
      ]
    }

``path`` is the output's file key: its namespace (``gen``, ``params``, ``bin``,
``platform_bin``) and its path in the build graph, so an entry names nothing of the
machine or output directory that made it. ``mode`` is the permission bits. Anything
that does not parse as this format, or names another key, is not an entry: a miss.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

FORMAT = "kiln-ac/1"
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


@dataclass(frozen=True)
class CachedOutput:
    """One output file of a cached action."""

    path: str
    sha256: str
    size: int
    mode: int


@dataclass(frozen=True)
class CacheEntry:
    """What the action with ``key`` produced. Invariant: every digest is 64 hex digits
    and every path is unique."""

    key: str
    action: str
    outputs: tuple[CachedOutput, ...]

    def encode(self) -> bytes:
        data = {
            "format": FORMAT,
            "key": self.key,
            "action": self.action,
            "outputs": [
                {"path": o.path, "sha256": o.sha256, "size": o.size, "mode": o.mode}
                for o in self.outputs
            ],
        }
        return json.dumps(data, sort_keys=True).encode()

    @classmethod
    def decode(cls, key: str, blob: bytes) -> CacheEntry | None:
        """The entry in ``blob`` if it is a well-formed entry for ``key``, else None."""
        try:
            data = json.loads(blob)
            if data.get("format") != FORMAT or data.get("key") != key:
                return None
            outputs = tuple(_output(o) for o in data["outputs"])
        except (ValueError, TypeError, KeyError, AttributeError):
            return None
        if not outputs or len({o.path for o in outputs}) != len(outputs):
            return None
        return cls(key, str(data.get("action", "")), outputs)


def _output(item: Any) -> CachedOutput:
    out = CachedOutput(str(item["path"]), str(item["sha256"]), int(item["size"]),
                       int(item["mode"]))  # fmt: skip
    if not is_digest(out.sha256) or out.size < 0 or not 0 <= out.mode <= 0o7777:
        raise ValueError(f"bad output in cache entry: {item!r}")
    return out
