"""The output directory's layout: where each namespace lives, the platform tag,
where an action's log goes, and what kiln owns there.

The graph names files relative to a namespace; this module turns those names
into places on disk, so that ``kiln build`` and ``kiln clean`` agree on them.

``OUTPUT_DIR/`` holds ``genfiles/``, ``params/``, ``bin/``, ``platform/<os>-<arch>/``
(one per ``FileNamespace``), ``manifest.json`` and ``.kiln/`` (state, lock, logs
under ``.kiln/logs/<the output's directory>/<its name>.log``, the last build's
record).
"""

from __future__ import annotations

import enum
import hashlib
import os
import platform
import shutil
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

from kiln.output_dir.ownership import KILN_DIR, NAME_MAX
from kiln.output_dir.tree import OutputTree
from kiln.output_dir.writing import remove_quietly


class LaidOut(Protocol):
    """A file of the output directory: its namespace and its path there
    (``kiln.graph.BuildFile``)."""

    namespace: FileNamespace
    path: str


# kiln's own files at the top of the output directory, besides ``KILN_DIR``.
MANIFEST = "manifest.json"
# Where actions find the source files they read: a link to each, by its path
# relative to the build module's directory (``source_view_path``).
SOURCE_VIEW = f"{KILN_DIR}/src"
# ... and those outside that directory, under the number of ``..`` that leave it.
OUTSIDE_VIEW = f"{KILN_DIR}/outside"
# kiln's own directories under ``.kiln/`` that hold nothing but what kiln made
# (logs, command spools, the programs' scratch, the source links, the
# reproducibility check's scratch, the earlier builds' manifests:
# ``kiln.observe.manifest_history``): ``kiln clean`` removes them whole.
KILN_TREES = ("logs", "spool", "tmp", "src", "outside", "check", "manifests")
# What the host CPU target resolves to here (``kiln.actions._host_cpu``).
HOST_MEMO = "host-targets.json"


def source_view_path(rel: str) -> str:
    """Where actions find the source file whose path relative to the build module's
    directory is ``rel``: ``.kiln/src/<rel>``, or for one outside that directory
    (``../../data/x``) ``.kiln/outside/<number of ..>/<the rest>`` (``2/data/x``):
    two places that no two source files share."""
    parts = rel.split("/")
    ups = next((i for i, part in enumerate(parts) if part != ".."), len(parts))
    if ups == 0:
        return f"{SOURCE_VIEW}/{rel}"
    return f"{OUTSIDE_VIEW}/{ups}/{'/'.join(parts[ups:])}"


class FileNamespace(enum.Enum):
    """Where under the output directory a file lives."""

    GEN = "gen"  # transient intermediates
    PARAMS = "params"  # distributable parameter archives
    BIN = "bin"  # distributable, platform-neutral binaries
    PLATFORM_BIN = "platform_bin"  # distributable, platform-specific binaries

    def __str__(self) -> str:
        return self.value


def platform_tag() -> str:
    """``<os>-<arch>`` of the running platform, e.g. ``linux-x86_64``."""
    machine = platform.machine().lower()
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)
    return f"{sys.platform.rstrip('0123456789')}-{machine}"


def namespace_dir(namespace: FileNamespace) -> str:
    """The directory of ``namespace`` relative to the output directory."""
    if namespace is FileNamespace.PLATFORM_BIN:
        return f"platform/{platform_tag()}"
    return {
        FileNamespace.GEN: "genfiles",
        FileNamespace.PARAMS: "params",
        FileNamespace.BIN: "bin",
    }[namespace]


def namespace_dirs() -> dict[str, str]:
    """Each namespace's value (as state keys spell it) -> its directory."""
    return {ns.value: namespace_dir(ns) for ns in FileNamespace}


def output_rel_path(key: str) -> str | None:
    """The path, relative to the output directory, of the output whose state key is
    ``key`` (``<namespace>/<path>``); None for a key that names no output."""
    ns, _, path = key.partition("/")
    directory = namespace_dirs().get(ns)
    return f"{directory}/{path}" if directory is not None and path else None


class OutputLayout:
    """Where the files of one output directory go.

    Invariants: ``output_dir`` is absolute; ``root(ns)`` is ``output_dir`` joined
    with ``namespace_dir(ns)``; every directory it makes is below ``output_dir``
    and reached through real directories (``OutputTree``).
    """

    def __init__(self, output_dir: Path | str, warn: Callable[[str], None]) -> None:
        self.output_dir = Path(output_dir).absolute()
        self._dirs = {ns: namespace_dir(ns) for ns in FileNamespace}
        self._roots = {ns: self.output_dir / d for ns, d in self._dirs.items()}
        self.tree = OutputTree(self.output_dir, warn=warn)
        self._linked: set[str] = set()  # the source links made this build
        # The names of the logs found in each logs directory when first asked.
        self._old_logs: dict[str, frozenset[str]] = {}

    @property
    def manifest_path(self) -> Path:
        return self.output_dir / MANIFEST

    @property
    def kiln_dir(self) -> Path:
        return self.output_dir / KILN_DIR

    def root(self, namespace: FileNamespace) -> Path:
        """The directory of ``namespace``'s files."""
        return self._roots[namespace]

    def relative_path(self, f: LaidOut) -> str:
        """Where output ``f`` lives, relative to the output directory."""
        return f"{self._dirs[f.namespace]}/{f.path}"

    def link_source(self, rel: str, target: str) -> None:
        """Make ``rel`` (a source file's place in ``SOURCE_VIEW``, relative to the
        output directory) a link to ``target``, once per build. Only a link is
        replaced there, by rename, never followed; anything else in its place is
        removed first (the places are kiln's own, below ``.kiln``)."""
        if rel in self._linked:
            return
        link = self.output_dir / rel
        try:
            current = os.readlink(link)
        except OSError:
            current = None
        if current != target:
            self.tree.make_dirs(link.parent, heal=lambda rel: True)
            temporary = link.with_name(f".kiln-link-{os.getpid()}-{os.urandom(4).hex()}")
            os.symlink(target, temporary)
            try:
                if os.path.isdir(link) and not os.path.islink(link):
                    shutil.rmtree(link)
                os.replace(temporary, link)
            except OSError:
                remove_quietly(temporary)
                raise
        self._linked.add(rel)

    def ensure_dir(self, path: Path) -> None:
        """Create the directory ``path`` below the output directory, never through a
        link (once per build: outputs share directories)."""
        self.tree.make_dirs(path)

    def log_path(self, f: LaidOut) -> str:
        """The log file of the action producing ``f`` (its directory made)."""
        path = self.kiln_dir / "logs" / os.path.dirname(f.path) / _log_name(f)
        self.tree.make_dirs(path.parent)
        return str(path)

    def end_build(self) -> None:
        """Forget the logs listed and the sources linked: the next build looks again."""
        self._old_logs = {}
        self._linked = set()

    def old_log(self, f: LaidOut) -> str | None:
        """``log_path(f)`` if a log was there when this build first looked in its
        directory (one listing per directory per build), else None: a clean build
        of quiet commands looks for no old logs one by one."""
        directory = os.path.dirname(f.path)
        names = self._old_logs.get(directory)
        if names is None:
            try:
                names = frozenset(os.listdir(self.kiln_dir / "logs" / directory))
            except OSError:  # none yet (or not a directory: log_path says so on use)
                names = frozenset()
            self._old_logs[directory] = names
        return self.log_path(f) if _log_name(f) in names else None


def _log_name(f: LaidOut) -> str:
    name = os.path.basename(f.path) + ".log"
    if len(os.fsencode(name)) > NAME_MAX:  # a long output name: shortened, kept unique
        name = f"{name[:64]}-{hashlib.sha256(name.encode()).hexdigest()[:16]}.log"
    return name
