"""What ``kiln compare`` compares: a build, read from its manifest as untrusted input.

A build is named one of three ways: an output directory (its ``manifest.json``), a
manifest file, or ``@-N`` (``@0`` the last build of ``--output-dir``, ``@-1`` the one
before: ``kiln.observe.manifest_history``). Everything a manifest says is checked for its
type before it is used; a field of the wrong type reads as absent, and a file that
is not a kiln manifest at all (not JSON, another format, a link, a FIFO, too large)
is a ``UsageError`` naming the file and what to do.
"""

from __future__ import annotations

import json
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kiln.base.errors import NotRegularFile, StateError, UsageError
from kiln.observe.manifest import FORMAT, key_parts
from kiln.observe.manifest_history import KEPT_MANIFESTS, MAX_MANIFEST_BYTES, kept_manifest
from kiln.observe.report_data import number_at, records_at
from kiln.output_dir.layout import MANIFEST
from kiln.output_dir.ownership import read_regular

_HISTORY = re.compile(r"@(-?[0-9]{1,6})")  # ASCII digits; more is no build kiln keeps


@dataclass
class Artifact:
    """One output of a build, as its manifest records it (typed; absent is None)."""

    path: str
    status: str
    sha256: str | None = None
    size: int | None = None
    target: str | None = None
    flags: list[str] | None = None
    compiler_version: str | None = None
    key: dict[str, Any] | None = None  # {"digest", "params", "inputs"}
    duration_s: float | None = None
    verification: list[dict[str, Any]] = field(default_factory=list)
    benchmark: list[dict[str, Any]] = field(default_factory=list)

    @property
    def is_module(self) -> bool:
        """A compiled module (its compile attached a target)."""
        return self.target is not None


@dataclass
class Build:
    """A build to compare: ``label`` as the user named it, the manifest it was read
    from, and the output directory whose files may be its (``root``)."""

    label: str
    manifest: Path
    root: Path | None
    artifacts: dict[str, Artifact]


def resolve(spec: str, output_dir: Path) -> tuple[Path, Path | None]:
    """The manifest file a build's name means, and its output directory."""
    found = _HISTORY.fullmatch(spec)
    if found is not None:
        n = -int(found.group(1))
        if not 0 <= n <= KEPT_MANIFESTS:
            raise UsageError(
                f"{spec}: name a build as @0 (the last) to @-{KEPT_MANIFESTS} (kiln keeps "
                f"the manifests of the last {KEPT_MANIFESTS} builds that differ)"
            )
        try:
            return kept_manifest(output_dir, n), output_dir
        except StateError as e:
            raise UsageError(f"{spec}: {e}") from None
    path = Path(spec)
    try:
        is_dir = stat.S_ISDIR(os.lstat(path).st_mode)  # a link to one is not taken
    except (OSError, ValueError):  # missing, a name too long: said when it is read
        is_dir = False
    if is_dir:
        return path / MANIFEST, path
    return path, None


def load_build(spec: str, output_dir: Path) -> Build:
    """The build ``spec`` names (see the module's docstring); UsageError if unusable."""
    path, root = resolve(spec, output_dir)
    data = _load_json(spec, path)
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        what = f"format {found[:80]!r}" if isinstance(found, str) else "no kiln manifest format"
        raise UsageError(
            f"{path} is not a kiln manifest ({what}, expected {FORMAT!r}); name an output "
            "directory, its manifest.json, or @-N, and rebuild with this kiln if it is older"
        )
    entrypoints = data.get("entrypoints")
    if not isinstance(entrypoints, dict):
        raise UsageError(f"{path} has no entrypoints; it is damaged: rebuild to rewrite it")
    artifacts: dict[str, Artifact] = {}
    for entry in entrypoints.values():
        outputs = entry.get("outputs") if isinstance(entry, dict) else None
        for out in outputs if isinstance(outputs, list) else []:
            art = _artifact(out) if isinstance(out, dict) else None
            if art is not None:
                artifacts.setdefault(art.path, art)
    return Build(spec, path, root, artifacts)


def _load_json(spec: str, path: Path) -> Any:
    history = _HISTORY.fullmatch(spec) is not None
    try:
        raw = read_regular(path, MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        if history:
            raise UsageError(
                f"{spec}: no such build is kept ({path} is missing); 'kiln build' keeps "
                "the manifests of earlier builds from now on, and 'kiln clean' drops them"
            ) from None
        raise UsageError(
            f"{spec}: no manifest at {path}; name an output directory that 'kiln build' "
            "wrote, a manifest.json, or @-N"
        ) from None
    except NotRegularFile as e:
        raise UsageError(f"{spec}: {e}; name the manifest itself") from None
    except OSError as e:
        raise UsageError(
            f"{spec}: cannot read {path}: {e.strerror}; name an output directory that "
            "'kiln build' wrote, a manifest.json, or @-N"
        ) from None
    if len(raw) > MAX_MANIFEST_BYTES:
        raise UsageError(
            f"{path} is larger than {MAX_MANIFEST_BYTES >> 20} MiB: not a manifest kiln wrote"
        )
    try:
        return json.loads(raw.decode("utf-8"))
    except (ValueError, RecursionError):
        raise UsageError(
            f"{path} is not valid JSON (damaged or cut short); rebuild to rewrite it, or "
            "name another build"
        ) from None


def _text(d: dict[str, Any], name: str) -> str | None:
    value = d.get(name)
    return value if isinstance(value, str) else None


def _artifact(out: dict[str, Any]) -> Artifact | None:
    path = _text(out, "path")
    if not path:
        return None
    size = number_at(out, "size")
    flags = out.get("flags")
    sha = _text(out, "sha256")
    return Artifact(
        path=path,
        status=_text(out, "status") or "?",
        sha256=sha if sha and out.get("built") is not False else None,
        size=int(size) if size is not None and size >= 0 else None,
        target=_text(out, "target"),
        flags=[f for f in flags if isinstance(f, str)] if isinstance(flags, list) else None,
        compiler_version=_text(out, "compiler_version"),
        key=key_parts(out.get("key")),
        duration_s=number_at(out, "duration_s"),
        verification=records_at(out, "verification"),
        benchmark=records_at(out, "benchmark"),
    )


# The latencies kiln reads, in µs: from a femtosecond to eleven days. Outside them a
# number is no latency, and a ratio of two stays far from a float's range.
_LATENCY_US = (1e-9, 1e12)


def samples(entry: dict[str, Any]) -> list[float]:
    """A benchmark entry's per-repetition latencies, in µs; a sample that is not a
    number, or is no latency once in µs (``_LATENCY_US``), is left out."""
    value = entry.get("samples")
    if not isinstance(value, list):
        return []
    unit = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "s": 1e6}.get(_text(entry, "time_unit") or "us")
    if unit is None:
        return []
    found = []
    for v in value:
        if isinstance(v, bool) or not isinstance(v, int | float):
            continue
        try:
            us = float(v) * unit
        except OverflowError:  # an int no float holds
            continue
        if is_latency(us):
            found.append(us)
    return found


def is_latency(us: float) -> bool:
    """Whether ``us`` microseconds is a latency kiln compares (``_LATENCY_US``)."""
    return _LATENCY_US[0] <= us <= _LATENCY_US[1]
