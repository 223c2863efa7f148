"""``iree.build.lang``: the names of a build module's own declarations."""

from kiln.graph.args import cl_arg
from kiln.graph.entrypoints import entrypoint

__all__ = ["cl_arg", "entrypoint"]
