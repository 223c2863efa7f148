"""``ManifestMeta``: the fields an action attaches to its outputs for the manifest
(``kiln.observe.manifest`` writes them). Here, beside the graph, so that the
actions that attach them need nothing of the layers that write the manifest."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from kiln.graph.meta import BuildMeta

if TYPE_CHECKING:
    from kiln.graph.action import BuildAction
    from kiln.graph.nodes import BuildFile


class ManifestMeta(BuildMeta):
    """Extra fields an action attaches to one of its output files for the manifest."""

    KEY = "kiln.manifest"

    def __init__(self) -> None:
        super().__init__()
        self.fields: dict[str, Any] = {}
        # (verify action, its JSON result file) for each check of this file.
        self.verifications: list[tuple[BuildAction, BuildFile]] = []
        # (benchmark action, its JSON result file) for each benchmark of this file.
        self.benchmarks: list[tuple[BuildAction, BuildFile]] = []
        # (scope, parameter archive) for each archive a compiled module loads.
        self.archives: list[tuple[str, BuildFile]] = []
        # On a check's or benchmark's own result file: ("verification" or
        # "benchmark", the action), so that its entry carries the verdict.
        self.result_of: tuple[str, BuildAction] | None = None
