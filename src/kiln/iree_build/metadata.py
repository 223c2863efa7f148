"""``iree.build.metadata``: the ``BuildMeta`` of compile sources."""

from kiln.actions.iree import CompileSourceMeta

__all__ = ["CompileSourceMeta"]
