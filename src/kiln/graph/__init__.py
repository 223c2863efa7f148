"""The build graph: files, actions, contexts and entrypoints, and the registry of
one graph's nodes. Definitions only: a build's runs live in its ``BuildResult``.

    nodes.py     ``BuildDependency``, ``BuildFile``; how namespaces and names join
    action.py    ``BuildAction``, ``ActionConcurrency``, ``SpawnsCommand``
    context.py   ``BuildContext``, ``BuildEntrypoint``
    registry.py  ``GraphRegistry``: every node by path; ``RunLog``
    host.py      the interfaces nodes reach outside the graph (``GraphHost``, ...)
    entrypoints.py  ``@entrypoint``; args.py: ``cl_arg``
    meta.py      typed node metadata (``BuildMeta``); manifest_meta.py: ``ManifestMeta``
    progress.py  ``ProgressReporter``, the observers' interface
    definition_site.py  where in the user's module a node was defined
    reach.py     what an entrypoint declared but does not lead to
"""

from __future__ import annotations

from kiln.graph.action import (
    ActionConcurrency,
    BuildAction,
    Finish,
    Finished,
    SpawnsCommand,
)
from kiln.graph.context import BuildContext, BuildEntrypoint
from kiln.graph.definition_site import DefinitionSite
from kiln.graph.host import GraphHost, NodeRegistry, RunRecord, RunServices
from kiln.graph.meta import BuildFileMetadata, BuildMeta
from kiln.graph.nodes import (
    KEYING_ONLY,
    NAMED_RELATIVE,
    BuildDependency,
    BuildFile,
    as_namespace,
    join_namespace,
)
from kiln.output_dir.layout import FileNamespace, namespace_dir, platform_tag

__all__ = [
    "KEYING_ONLY",
    "NAMED_RELATIVE",
    "ActionConcurrency",
    "BuildAction",
    "BuildContext",
    "BuildDependency",
    "BuildEntrypoint",
    "BuildFile",
    "BuildFileMetadata",
    "BuildMeta",
    "DefinitionSite",
    "FileNamespace",
    "Finish",
    "Finished",
    "GraphHost",
    "NodeRegistry",
    "RunRecord",
    "RunServices",
    "SpawnsCommand",
    "as_namespace",
    "join_namespace",
    "namespace_dir",
    "platform_tag",
]
