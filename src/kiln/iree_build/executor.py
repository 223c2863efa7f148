"""``iree.build.executor``: the graph, its actions and the executor (kiln's)."""

from kiln.executor import *  # noqa: F403
from kiln.executor import __all__ as __all__
